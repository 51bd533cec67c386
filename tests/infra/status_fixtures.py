"""The recorded API responses `park status` is tested on (tests/data/status/), and the CRD
schemas they are checked against: a field name the API does not have fails the test."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from infra.datafile import YAML_LOADER
from infra.tools.schemas import _strict, validate_manifest
from infra.tools.status import Observed, Target, targets
from tests.infra.goldens import golden_manifests

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "status"
# Kinds the program never emits: their CRDs live beside the fixtures (crds/SOURCE.md).
LOCAL_CRDS = DATA / "crds"
# List kinds whose items carry no apiVersion/kind (core's typed lists): the item's kind.
CORE_ITEMS = {"PodList": "Pod", "EventList": "Event"}


def scenarios() -> list[str]:
    return sorted(p.stem for p in DATA.glob("*.yaml"))


def load(name: str) -> dict[str, Any]:
    return dict(yaml.load((DATA / f"{name}.yaml").read_text(), Loader=YAML_LOADER))


@cache
def golden_targets(stack: str) -> tuple[Target, ...]:
    return targets(list(golden_manifests(stack).values()))


def target_of(recorded: dict[str, Any]) -> Target:
    """The scenario's workload, as the stack's golden render names it."""
    kind, name = recorded["workload"].split("/")
    for target in golden_targets(recorded["stack"]):
        if (target.kind, target.name) == (kind, name):
            return target
    raise AssertionError(f"{recorded['workload']} is not in the {recorded['stack']} render")


def observed(recorded: dict[str, Any]) -> Observed:
    responses = copy.deepcopy(recorded["responses"])
    return Observed(
        target=target_of(recorded),
        resource=responses.get("resource"),
        workloads=responses.get("workloads"),
        provisioning_requests=responses.get("provisioningrequests"),
        pods=responses.get("pods"),
        events=responses.get("events"),
    )


@cache
def _local_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for path in sorted(LOCAL_CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=YAML_LOADER)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = _strict(version["schema"]["openAPIV3Schema"])
            found[(f"{group}/{version['name']}", kind)] = schema
    return found


def problems(obj: dict[str, Any]) -> list[str]:
    """What the API server's schema says of one object: the vendored CRDs (infra/schemas/ and
    crds/ here, strict), else Kubernetes' own (kubernetes-validate, strict)."""
    schema = _local_schemas().get((obj.get("apiVersion", ""), obj.get("kind", "")))
    if schema is None:
        return [str(p) for p in validate_manifest(obj)]
    import jsonschema

    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    return [
        f"{obj['kind']}: {'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(body)
    ]


def objects(recorded: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object the responses hold, each with its apiVersion and kind."""
    found = []
    for response in recorded["responses"].values():
        if response is None:
            continue
        kind = response.get("kind", "")
        if not kind.endswith("List"):
            found.append(response)
            continue
        for item in response.get("items") or []:
            if kind in CORE_ITEMS:
                item = {"apiVersion": "v1", "kind": CORE_ITEMS[kind], **item}
            found.append(item)
    return found


# ---- a cluster on loopback that answers from the recorded responses -----------------------------

_LISTS = {
    "workloads": "/apis/kueue.x-k8s.io/v1beta2/namespaces/{ns}/workloads",
    "provisioningrequests": "/apis/autoscaling.x-k8s.io/v1/namespaces/{ns}/provisioningrequests",
    "pods": "/api/v1/namespaces/{ns}/pods",
    "events": "/api/v1/namespaces/{ns}/events",
}
_OBJECTS = {"RayJob": "rayjobs", "RayService": "rayservices"}


def _selected(response: dict[str, Any], query: dict[str, list[str]]) -> dict[str, Any]:
    """The list as the API server filters it: labelSelector k=v, fieldSelector on the
    involved object's kind and name (the only selectors `park status` sends)."""
    found = list(response.get("items") or [])
    for selector in query.get("labelSelector", []):
        key, value = selector.split("=", 1)
        found = [i for i in found if (i["metadata"].get("labels") or {}).get(key) == value]
    for selector in query.get("fieldSelector", []):
        for term in selector.split(","):
            key, value = term.split("=", 1)
            field = key.removeprefix("involvedObject.")
            found = [i for i in found if (i.get("involvedObject") or {}).get(field) == value]
    return {**response, "items": found}


class FakeCluster:
    """An HTTP API server on 127.0.0.1 serving recorded scenarios (GETs only), recording
    every request; `status` answers every request with that HTTP status instead."""

    def __init__(self, recorded: list[dict[str, Any]], status: int = 200) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import parse_qs, urlsplit

        self.requests: list[tuple[str, dict[str, list[str]]]] = []
        routes: dict[str, dict[str, Any]] = {}
        for scenario in recorded:
            target = target_of(scenario)
            responses = scenario["responses"]
            plural, ns = _OBJECTS[target.kind], target.namespace
            path = f"/apis/ray.io/v1/namespaces/{ns}/{plural}/{target.name}"
            routes[path] = responses["resource"]
            for key, template in _LISTS.items():
                if responses.get(key) is not None:
                    listed = routes.setdefault(
                        template.format(ns=ns), {**responses[key], "items": []}
                    )
                    listed["items"] = listed["items"] + responses[key]["items"]
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                cluster.requests.append((url.path, query))
                body: dict[str, Any] | None = routes.get(url.path)
                code = status
                if code == 200 and body is None:
                    code, body = 404, {"kind": "Status", "apiVersion": "v1", "code": 404}
                elif code == 200 and url.path in {t.format(ns="park") for t in _LISTS.values()}:
                    body = _selected(body or {}, query)
                data = json.dumps(body or {"kind": "Status", "code": code}).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def kubeconfig(path: Path, server: str, context: str = "fake") -> Path:
    """A kubeconfig with one context whose cluster is `server` (a token, no TLS)."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": context, "cluster": {"server": server}}],
                "users": [{"name": context, "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
                "current-context": context,
            }
        )
    )
    return path
