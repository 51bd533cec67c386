"""`park status`'s pure half: the cluster's own answers → why each workload runs or waits.

The reader (infra/tools/status_read.py) gets the API's JSON unchanged; nothing here opens a
connection, so the tests replay recorded responses. Per workload of the render (its RayJob or
RayService, its namespace, its Kueue queue) the story is told in the order things happen:
Kueue's Workload (quota reserved, admission checks, evictions), the ProvisioningRequest that
DWS answers, the Ray pods' scheduling events (quota, stockout, reservation), then KubeRay's
own status. The first thing that holds the workload back is its one-line "why"; everything
read is its evidence.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from infra.catalog import TPU_RESOURCE
from infra.names import QUEUE_NAME_LABEL, WORKLOAD_LABEL
from infra.tools.status_evidence import PENDING as PENDING  # a state of the table, too
from infra.tools.status_evidence import (
    STARTING,
    Json,
    Verdict,
    conditions,
    first_line,
    is_true,
    items,
    said,
    scheduling,
)

RAYJOB, RAYSERVICE = "RayJob", "RayService"
# What a workload is doing, as the table's state column says it.
RUNNING, SUCCEEDED, HEALTHY = "running", "succeeded", "healthy"
WAITING, EVICTED = "waiting", "evicted"  # and PENDING, STARTING (status_evidence)
FAILED, UNHEALTHY, ABSENT = "failed", "unhealthy", "absent"
# The states `park status` exits 1 on: the workload will not get better by waiting.
BAD_STATES = frozenset({FAILED, UNHEALTHY, ABSENT})


@dataclass(frozen=True)
class Target:
    """One workload of the render: what to read for it."""

    kind: str  # RayJob or RayService
    name: str
    namespace: str
    queue: str | None  # its Kueue LocalQueue (the queue-name label), None when not queued
    pod_label: str  # the park-gke/workload value its Ray pods carry


@dataclass(frozen=True)
class Observed:
    """What the reader got for one target: the API's JSON as returned (a list response for
    each list, None for a list not read). `resource` is None when the object is not found."""

    target: Target
    resource: Json | None
    workloads: Json | None = None  # kueue.x-k8s.io/v1beta2 WorkloadList of the namespace
    provisioning_requests: Json | None = None  # autoscaling.x-k8s.io/v1 ...List
    pods: Json | None = None  # core/v1 PodList of the workload's Ray pods
    events: Json | None = None  # core/v1 EventList about its pending pods
    notes: tuple[str, ...] = ()  # what the reader could not read, said as such


@dataclass(frozen=True)
class Status:
    """One workload's answer: its state, why, and what that rests on."""

    kind: str
    name: str
    namespace: str
    state: str
    why: str
    evidence: tuple[str, ...]

    def as_json(self) -> Json:
        return {
            "kind": self.kind,
            "name": self.name,
            "namespace": self.namespace,
            "state": self.state,
            "why": self.why,
            "evidence": list(self.evidence),
        }


# ---- what to read: the render's workloads -----------------------------------------------------


def _cluster_spec(manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = manifest.get("spec") or {}
    return spec.get("rayClusterSpec") or spec.get("rayClusterConfig") or {}


def targets(manifests: Iterable[Mapping[str, Any]]) -> tuple[Target, ...]:
    """The RayJobs and RayServices of a render (`park render`'s manifests), as deployed."""
    found = []
    for manifest in manifests:
        kind = manifest.get("kind")
        if kind not in (RAYJOB, RAYSERVICE):
            continue
        meta = manifest.get("metadata") or {}
        head = (_cluster_spec(manifest).get("headGroupSpec") or {}).get("template") or {}
        pod_labels = (head.get("metadata") or {}).get("labels") or {}
        found.append(
            Target(
                kind=str(kind),
                name=meta["name"],
                namespace=meta.get("namespace") or "default",
                queue=(meta.get("labels") or {}).get(QUEUE_NAME_LABEL),
                pod_label=pod_labels.get(WORKLOAD_LABEL, meta["name"]),
            )
        )
    return tuple(found)


def _owned_by(obj: Mapping[str, Any], kind: str, name: str) -> bool:
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("kind") == kind and o.get("name") == name for o in owners)


def _newest(objs: list[Json]) -> Json | None:
    return max(objs, key=lambda o: o["metadata"].get("creationTimestamp") or "", default=None)


_ATTEMPT = re.compile(r"-(\d+)$")


def _attempt(request: Json) -> int:
    match = _ATTEMPT.search(request["metadata"]["name"])
    return int(match.group(1)) if match else 0


# ---- Kueue: the Workload and its ProvisioningRequest ------------------------------------------


def provisioning(request: Json | None) -> tuple[str, str]:
    """(state, message) of the newest ProvisioningRequest: provisioned, failed, booking
    expired, capacity revoked, accepted (DWS is looking), or not yet accepted."""
    if request is None:
        return "not created yet", ""
    conds = conditions(request)
    for kind, state in (
        ("Failed", "failed"),
        ("CapacityRevoked", "capacity revoked"),
        ("BookingExpired", "booking expired"),
        ("Provisioned", "provisioned"),
    ):
        if is_true(conds, kind):
            return state, first_line(conds[kind].get("message") or "")
    pending = conds.get("Provisioned") or conds.get("Accepted") or {}
    state = "accepted, not provisioned yet" if is_true(conds, "Accepted") else "not accepted yet"
    return state, first_line(pending.get("message") or "")


def _check_lines(workload: Json) -> list[Json]:
    return list((workload.get("status") or {}).get("admissionChecks") or [])


def _flavors(workload: Json) -> str:
    """Where Kueue admitted it: the TPU flavors (a ladder's rung), else every flavor."""
    admission = (workload.get("status") or {}).get("admission") or {}
    assigned = [a.get("flavors") or {} for a in admission.get("podSetAssignments") or []]
    tpu = {f[TPU_RESOURCE] for f in assigned if TPU_RESOURCE in f}
    flavors = sorted(tpu or {flavor for f in assigned for flavor in f.values()})
    where = admission.get("clusterQueue") or "?"
    return f"admitted by ClusterQueue {where} on flavor {', '.join(flavors) or '?'}"


def kueue(ob: Observed) -> Verdict | None:
    """Kueue's part: None when the workload is not queued. A state when Kueue holds it back
    (no Workload yet, waiting for quota or an admission check, evicted, deactivated)."""
    target = ob.target
    if target.queue is None:
        return None
    if ob.workloads is None:  # not read (the reader's notes say why): KubeRay's word stands
        return Verdict(None, "", (f"LocalQueue {target.queue}: Kueue's Workloads not read",))
    owner = target.kind
    mine = [w for w in items(ob.workloads) if _owned_by(w, owner, target.name)]
    workload = _newest(mine)
    if workload is None:
        return Verdict(
            WAITING,
            f"no Kueue Workload for it yet: is Kueue running, and LocalQueue {target.queue}?",
            (f"LocalQueue {target.queue}: no Workload owned by {owner} {target.name}",),
        )
    conds = conditions(workload)
    name = workload["metadata"]["name"]
    evidence = [
        f"Workload {name}: "
        + "; ".join(said(conds.get(k), k) for k in ("QuotaReserved", "Admitted"))
    ]
    for check in _check_lines(workload):
        line = f"admission check {check.get('name')}: {check.get('state')}"
        evidence.append(
            line + (f": {first_line(check['message'])}" if check.get("message") else "")
        )
    evictions = ((workload.get("status") or {}).get("schedulingStats") or {}).get("evictions")
    for eviction in evictions or []:
        evidence.append(f"evicted {eviction.get('count')} time(s) for {eviction.get('reason')}")
    requests = [r for r in items(ob.provisioning_requests) if _owned_by(r, "Workload", name)]
    request = max(requests, key=_attempt, default=None)
    if requests or _check_lines(workload):
        state, message = provisioning(request)
        label = (
            f"ProvisioningRequest {request['metadata']['name']}"
            if request
            else "no ProvisioningRequest"
        )
        evidence.append(f"{label}: {state}" + (f": {message}" if message else ""))
    return _kueue_verdict(workload, conds, request, tuple(evidence))


def _kueue_verdict(
    workload: Json, conds: dict[str, Json], request: Json | None, evidence: tuple[str, ...]
) -> Verdict:
    status = workload.get("status") or {}
    if is_true(conds, "Finished"):
        return Verdict(None, "", evidence)
    checks = _check_lines(workload)
    rejected = [c for c in checks if c.get("state") == "Rejected"]
    deactivated = (workload.get("spec") or {}).get("active") is False
    if rejected:
        message = first_line(rejected[0].get("message") or "no message", 160)
        why = f"admission check {rejected[0].get('name')} rejected it: {message}"
        return Verdict(FAILED, why + ("; Kueue deactivated it" if deactivated else ""), evidence)
    if deactivated:
        cause = said(conds.get("Evicted")) if "Evicted" in conds else "spec.active is false"
        return Verdict(FAILED, f"deactivated by Kueue, it will not run again: {cause}", evidence)
    if is_true(conds, "Admitted"):
        return Verdict(None, _flavors(workload), (*evidence, _flavors(workload)))
    if is_true(conds, "Evicted"):
        evicted = conds["Evicted"]
        requeue = status.get("requeueState") or {}
        why = f"evicted by Kueue ({evicted.get('reason')}"
        why += f": {first_line(evicted['message'], 120)})" if evicted.get("message") else ")"
        if requeue:
            why += f"; requeued {requeue.get('count', 0)} time(s)"
            why += f", next try at {requeue['requeueAt']}" if requeue.get("requeueAt") else ""
        return Verdict(EVICTED, why, (*evidence, said(conds.get("Requeued"), "Requeued")))
    if is_true(conds, "QuotaReserved"):
        waiting = [c for c in checks if c.get("state") != "Ready"]
        return Verdict(WAITING, _check_why(waiting, request), evidence)
    reserved = conds.get("QuotaReserved") or {}
    if reserved.get("reason") == "Inadmissible":
        why = f"its queue cannot admit it: {first_line(reserved.get('message') or '', 160)}"
        return Verdict(FAILED, why, evidence)
    message = first_line(reserved.get("message") or "not considered yet", 160)
    return Verdict(WAITING, f"waiting for quota: {message}", evidence)


def _check_why(waiting: list[Json], request: Json | None) -> str:
    """Quota is reserved; what the admission checks still wait for (DWS, for the queued)."""
    if not waiting:
        return "quota reserved, every admission check ready: Kueue is admitting it"
    check = waiting[0]
    state, message = provisioning(request)
    if request is None and check.get("message"):
        state, message = "not provisioned", first_line(check["message"], 160)
    retry = " (Kueue retries)" if check.get("state") == "Retry" else ""
    why = f"quota reserved, waiting for check {check.get('name')}: ProvisioningRequest {state}"
    return why + retry + (f": {first_line(message, 160)}" if message else "")


# ---- KubeRay's own status ---------------------------------------------------------------------


def _rayjob(ob: Observed, queued: Verdict | None, pods: Verdict | None) -> tuple[str, str]:
    status = (ob.resource or {}).get("status") or {}
    deployment = status.get("jobDeploymentStatus") or "New"
    job = status.get("jobStatus") or ""
    said_by_kuberay = ": ".join(
        first_line(status[k], 160) for k in ("reason", "message") if status.get(k)
    )
    if deployment == "Complete" and job == "SUCCEEDED":
        return SUCCEEDED, "the job succeeded"
    if deployment in ("Failed", "ValidationFailed") or job == "FAILED":
        return FAILED, f"the job failed: {said_by_kuberay or job or deployment}"
    if queued is not None and queued.state is not None:
        return queued.state, queued.why
    if deployment == "Running" and job == "RUNNING":
        return RUNNING, "the job is running" + (f" ({queued.why})" if queued and queued.why else "")
    if pods is not None and pods.state is not None:
        return pods.state, pods.why
    why = f"KubeRay: {deployment}" + (f", job {job}" if job else "")
    return STARTING, why + (f": {said_by_kuberay}" if said_by_kuberay else "")


_BAD_APP_STATES = ("DEPLOY_FAILED", "UNHEALTHY")


def _rayservice(ob: Observed, pods: Verdict | None) -> tuple[str, str]:
    status = (ob.resource or {}).get("status") or {}
    conds = conditions(ob.resource)
    apps = ((status.get("activeServiceStatus") or {}).get("applicationStatuses")) or {}
    for app, app_status in sorted(apps.items()):
        if app_status.get("status") in _BAD_APP_STATES:
            return UNHEALTHY, f"app {app} {app_status['status']}: " + _app_message(app_status)
    ready = conds.get("Ready") or {}
    if status.get("serviceStatus") == "Running" and is_true(conds, "Ready"):
        endpoints = status.get("numServeEndpoints", 0)
        return HEALTHY, f"serving: {len(apps)} app(s) running, {endpoints} Serve endpoint(s)"
    if pods is not None and pods.state is not None:
        return pods.state, pods.why
    if ready.get("reason") in ("InitializingTimeout", "ZeroServeEndpoints", "ValidationFailed"):
        return UNHEALTHY, "not ready: " + said(ready, "Ready")
    return STARTING, "not ready yet: " + said(ready, "Ready")


def _app_message(app_status: Mapping[str, Any]) -> str:
    """The app's message, or its first failing deployment's: from its error when it names one
    (Serve's own words before it are the same for every failed start)."""
    message = app_status.get("message") or "no message"
    for name, deployment in sorted((app_status.get("serveDeploymentStatuses") or {}).items()):
        if deployment.get("status") in _BAD_APP_STATES and deployment.get("message"):
            message = f"{name}: {deployment['message']}"
            break
    error = message.find("Error: ")
    return first_line(message[error + len("Error: ") :] if error >= 0 else message, 200)


def _resource_evidence(ob: Observed) -> list[str]:
    status = (ob.resource or {}).get("status") or {}
    if ob.target.kind == RAYJOB:
        keys = ("jobDeploymentStatus", "jobStatus", "reason", "message", "rayClusterName")
        shown = [f"{k}={first_line(str(status[k]), 160)}" for k in keys if status.get(k)]
        return [f"RayJob {ob.target.name}: " + (", ".join(shown) or "no status yet")]
    lines = [f"RayService {ob.target.name}: serviceStatus={status.get('serviceStatus') or '-'}"]
    lines += [said(c) for c in conditions(ob.resource).values()]
    apps = (status.get("activeServiceStatus") or {}).get("applicationStatuses") or {}
    lines += [f"app {name}: {app.get('status')}" for name, app in sorted(apps.items())]
    return lines


def explain(ob: Observed) -> Status:
    """One workload's state and why, from what the reader got."""
    target = ob.target
    where = f"{target.kind} {target.name} in namespace {target.namespace}"
    if ob.resource is None:
        why = f"{where} not found: not deployed yet (pulumi up), or deleted"
        return Status(target.kind, target.name, target.namespace, ABSENT, why, ob.notes)
    queued = kueue(ob)
    pods = scheduling(items(ob.pods), items(ob.events))
    if target.kind == RAYJOB:
        state, why = _rayjob(ob, queued, pods)
    else:
        state, why = _rayservice(ob, pods)
    evidence = _resource_evidence(ob)
    evidence += list(queued.evidence if queued else ())
    evidence += list(pods.evidence if pods else ())
    return Status(target.kind, target.name, target.namespace, state, why, (*evidence, *ob.notes))


def report(observed: Iterable[Observed]) -> tuple[Status, ...]:
    return tuple(explain(ob) for ob in observed)
