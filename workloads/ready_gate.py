"""A readiness gate of `pulumi up`: wait, bounded, until the API server can take what comes next.

The program creates objects of kinds that appear late (GKE installs the Ray add-on's `ray.io`
CRDs, PodMonitoring's and the Gateway API's after the cluster is RUNNING) and objects that an
admission webhook must answer for (Kueue's queues: its webhook answers 10-30 s after its pod is
Ready; cert-manager's Issuers and Certificates). pulumi-kubernetes retries a missing kind for
only ~31 s and a webhook that refuses connections not at all, so before them the program runs
this module as an awaited Job (infra/plan/gates.py):

    python -m workloads.ready_gate --deadline-s 600 --crd rayjobs.ray.io \
        --dry-run /apis/kueue.x-k8s.io/v1beta2/clusterqueues '{"apiVersion": ...}'

Each `--crd` is ready when the CRD's `Established` condition is True; each `--dry-run` when a
server-side dry-run create of the object (`?dryRun=All`: admission webhooks are called, nothing
is stored) gets an answer that passed through admission, whatever it says about the object: a
webhook that cannot be reached makes the API server answer 500 "failed calling webhook", a kind
not served yet 404. The checks run in order, polled every `--poll-s`; after `--deadline-s` it
exits 1 with a message that names what was not ready and the last answer.

Stdlib only (no Kubernetes client, no torch): the pod's service-account token and CA, the API
server at https://kubernetes.default.svc.
"""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

API = "https://kubernetes.default.svc"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
POLL_S = 2.0
SAY_EVERY_S = 30.0
REQUEST_TIMEOUT_S = 10.0


class NotReady(TimeoutError):
    """What a gate waited for did not become ready within its bound."""


@dataclass(frozen=True)
class Answer:
    """One answer of the API server: HTTP status (0: no answer at all) and its body."""

    status: int
    body: dict[str, Any]
    error: str = ""

    @property
    def message(self) -> str:
        return self.error or str(self.body.get("message") or self.body.get("reason") or "")


class Api:
    """The API server, as the pod's service account (the token is read per request: the
    kubelet rotates it)."""

    def __init__(self, base: str = API, account_dir: str = SERVICE_ACCOUNT_DIR):
        self.base = base.rstrip("/")
        self.account_dir = Path(account_dir)
        self._context: ssl.SSLContext | None = None
        if self.base.startswith("https://"):
            ca = self.account_dir / "ca.crt"
            self._context = ssl.create_default_context(cafile=str(ca) if ca.exists() else None)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Answer:
        headers = {"Accept": "application/json"}
        token = self.account_dir / "token"
        if token.exists():
            headers["Authorization"] = f"Bearer {token.read_text().strip()}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(
                req, timeout=REQUEST_TIMEOUT_S, context=self._context
            ) as reply:
                return Answer(reply.status, _json(reply.read()))
        except urllib.error.HTTPError as err:
            return Answer(err.code, _json(err.read()))
        except (OSError, ValueError) as err:  # refused, reset, timed out, TLS
            return Answer(0, {}, f"no answer from the API server ({err})")


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw or b"{}")
    except ValueError:
        return {"message": raw[:300].decode(errors="replace")}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Check:
    """One thing to wait for: `what` for people, `probe` -> (ready, why not)."""

    what: str
    probe: Callable[[Api], tuple[bool, str]]


def crd_established(name: str) -> Check:
    """The CRD `name` (plural.group) exists and its Established condition is True."""

    def probe(api: Api) -> tuple[bool, str]:
        answer = api.request("GET", CRD_PATH + name)
        if answer.status == 404:
            return False, "absent"
        if answer.status != 200:
            return False, f"HTTP {answer.status}: {answer.message}"
        conditions = (answer.body.get("status") or {}).get("conditions") or []
        state = {c.get("type"): c.get("status") for c in conditions if isinstance(c, dict)}
        if state.get("Established") == "True":
            return True, "Established"
        return False, f"present, not Established yet (conditions: {state or 'none'})"

    return Check(f"CRD {name}", probe)


def _answered_by_admission(answer: Answer) -> bool:
    """The request went through admission: created (dry run), or refused by a webhook or by
    validation. Not: no answer, a kind not served yet (404), authentication or RBAC (401/403
    before admission), throttling (429), a webhook the API server could not call (500)."""
    if answer.status in (200, 201):
        return True
    if answer.status == 403:
        return "admission webhook" in answer.message  # a webhook's denial, not RBAC's
    return 400 <= answer.status < 500 and answer.status not in (401, 404, 429)


def dry_run_answered(path: str, body: dict[str, Any]) -> Check:
    """A server-side dry-run create of `body` at `path` gets through admission."""
    kind = body.get("kind", "object")

    def probe(api: Api) -> tuple[bool, str]:
        answer = api.request("POST", f"{path}?dryRun=All", body)
        if _answered_by_admission(answer):
            return True, f"admission answered (HTTP {answer.status})"
        if answer.status == 0:
            return False, answer.message
        return False, f"HTTP {answer.status}: {answer.message}"

    return Check(f"admission webhooks of {kind} (a dry-run create at {path})", probe)


def wait_ready(
    checks: Sequence[Check],
    api: Api,
    *,
    deadline_s: float,
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> float:
    """Each check in turn until it is ready, all within `deadline_s`; the seconds it took.
    Raises NotReady at the bound, naming the check and its last answer."""
    started = clock()
    for check in checks:
        said = None
        while True:
            ready, why = check.probe(api)
            waited = clock() - started
            if ready:
                say(f"ready: {check.what}: {why} ({waited:.0f}s)")
                break
            if waited >= deadline_s:
                raise NotReady(
                    f"{check.what}: not ready after {waited:.0f}s, the gate's bound "
                    f"({deadline_s:.0f}s); last: {why}"
                )
            if said is None or clock() - said >= SAY_EVERY_S:
                say(f"waiting: {check.what}: {why} ({waited:.0f}s of at most {deadline_s:.0f}s)")
                said = clock()
            sleep(max(min(poll_s, deadline_s - waited), 0.0))
    return clock() - started


def _dry_run(pair: Sequence[str]) -> Check:
    path, text = pair
    body = json.loads(text)
    if not path.startswith("/apis/") or not isinstance(body, dict):
        raise argparse.ArgumentTypeError(f"--dry-run: {path!r} and a JSON object")
    return dry_run_answered(path, body)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workloads.ready_gate", description=__doc__)
    parser.add_argument("--deadline-s", type=float, required=True)
    parser.add_argument("--poll-s", type=float, default=POLL_S)
    parser.add_argument("--crd", action="append", default=[], metavar="PLURAL.GROUP")
    parser.add_argument(
        "--dry-run", action="append", default=[], nargs=2, metavar=("PATH", "OBJECT")
    )
    parser.add_argument("--api", default=API)
    parser.add_argument("--service-account-dir", default=SERVICE_ACCOUNT_DIR)
    args = parser.parse_args(argv)
    checks = [crd_established(n) for n in args.crd] + [_dry_run(p) for p in args.dry_run]
    if not checks:
        parser.error("nothing to wait for: give --crd or --dry-run")
    api = Api(args.api, args.service_account_dir)
    try:
        waited = wait_ready(checks, api, deadline_s=args.deadline_s, poll_s=args.poll_s)
    except NotReady as err:
        print(f"not ready: {err}", file=sys.stderr, flush=True)
        return 1
    print(f"all ready after {waited:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
