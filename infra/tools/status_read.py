"""`park status`'s reader: the few GETs and lists it takes, through the Kubernetes Python client.

Read-only, with the user's own kubeconfig (KUBECONFIG or ~/.kube/config, its current context
unless one is named). Every request has a bounded timeout and no retry storm; every list is
bounded (`limit`, never followed past its first page: a cut list is said as a note). Responses
are kept as the API's own JSON (`_preload_content=False`), so infra/tools/status.py reads the
same dicts the tests replay. Per workload:

- its RayJob or RayService (ray.io/v1; not found: absent);
- when queued: the namespace's Kueue Workloads (kueue.x-k8s.io/v1beta2) and
  ProvisioningRequests (autoscaling.x-k8s.io/v1), each listed once per namespace;
- its Ray pods (label park-gke/workload), and the events about the first few unscheduled ones.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from infra.names import WORKLOAD_LABEL
from infra.schema.safe import one_line
from infra.schema.secrets import scrub
from infra.tools.status import RAYJOB, Observed, Target
from infra.tools.status_evidence import Json, unscheduled

DEFAULT_TIMEOUT_S = 15.0
LIST_LIMIT = 250  # objects per list
EVENT_LIMIT = 50  # events per pod
PODS_ASKED_ABOUT = 5  # unscheduled pods whose events are read (one per worker group is plenty)
CLIENT_EXTRA = "pip install 'park-gke[cluster]'"


class ClusterError(Exception):
    """The cluster could not be read: a one-line message for the user."""


@dataclass(frozen=True)
class Reading:
    """What `park status` read: from which kubeconfig context, per workload."""

    context: str
    observed: tuple[Observed, ...]


def _client() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise ClusterError(f"park status needs the Kubernetes client: {CLIENT_EXTRA}") from None
    return kubernetes


def kubeconfig_path() -> str:
    """The kubeconfig the user's kubectl reads: KUBECONFIG (paths joined by ':'), read now
    (the client reads it once, when imported), else ~/.kube/config."""
    return os.environ.get("KUBECONFIG") or "~/.kube/config"


def connect(context: str | None) -> tuple[Any, str]:
    """(ApiClient, context name) from the user's kubeconfig, or a ClusterError saying why not."""
    import yaml

    kubernetes = _client()
    config, path = kubernetes.config, kubeconfig_path()
    unreadable = (config.ConfigException, OSError, ValueError, yaml.YAMLError)
    try:
        contexts, active = config.list_kube_config_contexts(config_file=path)
    except unreadable as err:
        raise ClusterError(
            f"no usable kubeconfig at {one_line(path, 200)} ({one_line(str(err), 160)}): get "
            "the stack's cluster credentials first (`pulumi stack output kubeconfig "
            "--show-secrets > FILE` and KUBECONFIG=FILE, or `gcloud container clusters "
            "get-credentials`)"
        ) from None
    known = [c["name"] for c in contexts or []]
    name = context or (active or {}).get("name")
    if not name or name not in known:
        shown = one_line(", ".join(known) or "none", 300)
        raise ClusterError(
            f"no kubeconfig context {one_line(repr(name))}: the kubeconfig has {shown}"
        )
    configuration = kubernetes.client.Configuration()
    try:
        config.load_kube_config(config_file=path, context=name, client_configuration=configuration)
    except unreadable as err:
        message = one_line(scrub(str(err)), 200)
        raise ClusterError(f"kubeconfig context {name!r} cannot be used: {message}") from None
    configuration.retries = 1  # a cluster that does not answer: said after one more try
    return kubernetes.client.ApiClient(configuration), name


class _Api:
    """The calls `park status` makes, each bounded, each answering the API's JSON."""

    def __init__(self, api_client: Any, timeout_s: float) -> None:
        kubernetes = _client()
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.api_exception = kubernetes.client.exceptions.ApiException
        self.timeout = (min(timeout_s, 10.0), timeout_s)  # (connect, read)
        self.notes: list[str] = []
        self._lists: dict[tuple[str, ...], Json | None] = {}

    def call(self, what: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The response's JSON; None when the API says 404 (not found, or no such kind) or
        403 (noted); a ClusterError when it cannot be reached or refuses the credentials."""
        import urllib3

        try:
            response = function(
                *args, _request_timeout=self.timeout, _preload_content=False, **kwargs
            )
            return json.loads(response.data)
        except self.api_exception as err:
            if err.status == 404:
                return None
            if err.status == 403:
                self.notes.append(f"not allowed to {what} (403): read as absent")
                return None
            if err.status == 401:
                raise ClusterError(
                    f"the cluster refused the credentials (401) to {what}: refresh them "
                    "(gcloud auth login; the kubeconfig's gke-gcloud-auth-plugin)"
                ) from None
            raise ClusterError(f"could not {what}: HTTP {err.status} {err.reason}") from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as err:
            message = one_line(scrub(str(err)), 200)
            raise ClusterError(f"cannot reach the cluster to {what}: {message}") from None

    def bounded(self, what: str, response: Json | None, limit: int) -> Json | None:
        if response and (response.get("metadata") or {}).get("continue"):
            self.notes.append(f"only the first {limit} {what} were read")
        return response

    def custom_object(self, group: str, version: str, ns: str, plural: str, name: str) -> Any:
        what = f"get {plural}/{name} in {ns}"
        get = self.custom.get_namespaced_custom_object
        return self.call(what, get, group, version, ns, plural, name)

    def custom_list(self, group: str, version: str, ns: str, plural: str) -> Json | None:
        """A namespace's objects of a kind, listed once however many workloads ask."""
        key = (group, version, ns, plural)
        if key not in self._lists:
            what = f"{plural} ({group}) in {ns}"
            listed = self.call(
                f"list {what}",
                self.custom.list_namespaced_custom_object,
                group,
                version,
                ns,
                plural,
                limit=LIST_LIMIT,
            )
            if listed is None:
                self.notes.append(f"no {what}: the kind is not served, or none may be read")
            self._lists[key] = self.bounded(what, listed, LIST_LIMIT)
        return self._lists[key]

    def pods(self, ns: str, selector: str) -> Json | None:
        what = f"pods {selector} in {ns}"
        listed = self.call(
            f"list {what}",
            self.core.list_namespaced_pod,
            ns,
            label_selector=selector,
            limit=LIST_LIMIT,
        )
        return self.bounded(what, listed, LIST_LIMIT)

    def events(self, ns: str, pods: Iterable[str]) -> Json:
        found: list[Json] = []
        for pod in pods:
            what = f"events of pod {pod} in {ns}"
            listed = self.call(
                f"list {what}",
                self.core.list_namespaced_event,
                ns,
                field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod}",
                limit=EVENT_LIMIT,
            )
            found += (self.bounded(what, listed, EVENT_LIMIT) or {}).get("items") or []
        return {"kind": "EventList", "apiVersion": "v1", "items": found}


def observe(api: _Api, target: Target) -> Observed:
    """Everything `park status` reads about one workload."""
    ns = target.namespace
    plural = "rayjobs" if target.kind == RAYJOB else "rayservices"
    before = len(api.notes)
    resource = api.custom_object("ray.io", "v1", ns, plural, target.name)
    workloads = requests = None
    if target.queue is not None and resource is not None:
        workloads = api.custom_list("kueue.x-k8s.io", "v1beta2", ns, "workloads")
        requests = api.custom_list("autoscaling.x-k8s.io", "v1", ns, "provisioningrequests")
    pods = api.pods(ns, f"{WORKLOAD_LABEL}={target.pod_label}") if resource else None
    waiting = [p["metadata"]["name"] for p in unscheduled((pods or {}).get("items") or [])]
    events = api.events(ns, waiting[:PODS_ASKED_ABOUT])
    return Observed(
        target=target,
        resource=resource,
        workloads=workloads,
        provisioning_requests=requests,
        pods=pods,
        events=events,
        notes=tuple(api.notes[before:]),
    )


def read(
    targets: Iterable[Target], context: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Reading:
    """Read every target from the cluster of `context` (the kubeconfig's current one)."""
    api_client, name = connect(context)
    api = _Api(api_client, timeout_s)
    try:
        return Reading(name, tuple(observe(api, target) for target in targets))
    finally:
        api_client.close()
