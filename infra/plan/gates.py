"""Readiness gates: what `pulumi up` waits for, bounded, before objects the API server cannot
take yet.

GKE installs the Ray add-on's `ray.io` CRDs, PodMonitoring's and the Gateway API's after the
cluster is RUNNING; Kueue's webhook answers 10-30 s after its pod is Ready; cert-manager's, after
its release. pulumi-kubernetes retries a missing kind for ~31 s only and a webhook that refuses
connections not at all (FACTS.md). So before each such object the program runs a gate: an
awaited Job (`python -m workloads.ready_gate`) that polls the API server until the CRDs are
Established, or until a server-side dry-run create of the kind is answered through admission
(webhooks are called on dryRun=All; nothing is stored). What needs the gate depends on it.

Each gate has its own ServiceAccount and least-privilege RBAC (get on its CRDs by name; create,
only ever dry-run, on the one kind it probes), runs on the CPU pool under the staging Job's pod
posture, in the workload image (already what the gated workloads wait for; torch-free,
stdlib-only code). Its bound: `start_s` (schedule, pull the image: the staging Job's allowance)
plus `wait_s`, the module's own deadline; the Job's activeDeadlineSeconds and Pulumi's await are
their sum (`timeout_s`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from infra.names import PART_OF, ROLE_LABEL
from infra.plan import ray
from infra.plan.dashboard_access import dashboard_access
from infra.plan.kubelet import literal
from infra.plan.observability import metrics
from infra.plan.staging import REPLACE_UNREADY
from infra.resolve import StackPlan, disk
from infra.resolve.host_memory import Item

GATE_MODULE = "workloads.ready_gate"
# The CRD (plural.group) of every custom kind the program creates, as the vendored CRDs under
# infra/schemas name them (tests/infra/test_gates.py holds the two together).
CRDS: dict[tuple[str, str], str] = {
    ("ray.io", "RayJob"): "rayjobs.ray.io",
    ("ray.io", "RayService"): "rayservices.ray.io",
    ("monitoring.googleapis.com", "PodMonitoring"): "podmonitorings.monitoring.googleapis.com",
    ("gateway.networking.k8s.io", "Gateway"): "gateways.gateway.networking.k8s.io",
    ("gateway.networking.k8s.io", "HTTPRoute"): "httproutes.gateway.networking.k8s.io",
    ("networking.gke.io", "GCPBackendPolicy"): "gcpbackendpolicies.networking.gke.io",
}
# Bounds, stated. A CRD GKE installs after RUNNING: minutes on a healthy day, 10 allowed. A
# webhook behind a release Helm has waited for (its pods Ready): 10-30 s (kueue #13036), 5 min.
CRD_WAIT_S = 600
WEBHOOK_WAIT_S = 300
START_S = disk.STAGE_START_S  # the same image on the same pool as the staging Job: its allowance
RETRIES = 1  # one more pod after a lost node; the Job's deadline bounds both
GATE_SCRATCH = disk.PodDisk(
    "ready-gate", "cpu", (Item("nothing written: python reads only", 0),), mounts_bucket=False
)
PROBE_NAME = "park-ready-probe-"  # generateName of the dry-run objects (never stored)


@dataclass(frozen=True)
class DryRun:
    """A dry-run create the gate sends: `path` (the collection), `body`, and its RBAC rule."""

    group: str
    resource: str
    namespace: str | None  # None: cluster-scoped
    body: dict[str, Any]

    @property
    def path(self) -> str:
        version = self.body["apiVersion"]
        where = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"/apis/{version}{where}/{self.resource}"


@dataclass(frozen=True)
class GatePlan:
    """One gate: what it waits for, its bound and its objects (the Job last)."""

    gate: str  # kuberay, cert-manager, kueue, metrics, dashboard
    what: str  # for people: what it waits for, before what
    crds: tuple[str, ...]
    dry_runs: tuple[DryRun, ...]
    wait_s: int
    manifests: tuple[dict[str, Any], ...]  # ServiceAccount, RBAC, the Job

    @property
    def timeout_s(self) -> int:
        """Pulumi's await and the Job's activeDeadlineSeconds: start allowance + the wait."""
        return START_S + self.wait_s

    @property
    def job(self) -> dict[str, Any]:
        return self.manifests[-1]

    @property
    def rbac(self) -> tuple[dict[str, Any], ...]:
        return self.manifests[:-1]


@dataclass(frozen=True)
class StackGates:
    """The gates of a stack, each None where the stack has nothing it would gate."""

    kuberay: GatePlan | None = None  # the ray.io CRDs, before RayJobs and RayServices
    cert_manager: GatePlan | None = None  # helm: cert-manager's webhook, before the TPU webhook
    kueue: GatePlan | None = None  # Kueue's webhook, before its queue objects
    metrics: GatePlan | None = None  # PodMonitoring's CRD, before the PodMonitorings
    dashboard: GatePlan | None = None  # the Gateway kinds' CRDs, before the IAP dashboard's

    def all(self) -> list[GatePlan]:
        gates = (self.kuberay, self.cert_manager, self.kueue, self.metrics, self.dashboard)
        return [g for g in gates if g is not None]


def crds_of(manifests: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The CRDs of the custom kinds among `manifests`, each once, in order."""
    found: list[str] = []
    for manifest in manifests:
        group = manifest["apiVersion"].rpartition("/")[0]
        crd = CRDS.get((group, manifest["kind"]))
        if crd is not None and crd not in found:
            found.append(crd)
    return tuple(found)


def _rules(crds: tuple[str, ...], dry_runs: Iterable[DryRun]) -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    if crds:
        rules.append(
            {
                "apiGroups": ["apiextensions.k8s.io"],
                "resources": ["customresourcedefinitions"],
                "resourceNames": list(crds),
                "verbs": ["get"],
            }
        )
    rules += [
        {"apiGroups": [d.group], "resources": [d.resource], "verbs": ["create"]} for d in dry_runs
    ]
    return rules


RBAC = "rbac.authorization.k8s.io"


def _granted(
    role: str, meta: dict[str, Any], rules: list[dict[str, Any]], subject: dict[str, str]
) -> list[dict[str, Any]]:
    """A `role` (Role or ClusterRole) with `rules`, bound to `subject` by its binding."""
    ref = {"apiGroup": RBAC, "kind": role, "name": meta["name"]}
    return [
        {"apiVersion": f"{RBAC}/v1", "kind": role, "metadata": meta, "rules": rules},
        {
            "apiVersion": f"{RBAC}/v1",
            "kind": f"{role}Binding",
            "metadata": meta,
            "roleRef": ref,
            "subjects": [subject],
        },
    ]


def _rbac(
    name: str, namespace: str, crds: tuple[str, ...], dry_runs: tuple[DryRun, ...]
) -> list[dict[str, Any]]:
    """The gate's ServiceAccount and what it may do: cluster-wide rules in a ClusterRole, those
    on one namespace's kinds in a Role there."""
    labels = {"app.kubernetes.io/name": "park-ready-gate", **PART_OF}
    subject = {"kind": "ServiceAccount", "name": name, "namespace": namespace}
    account = {"name": name, "namespace": namespace, "labels": labels}
    objects = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": account}]
    cluster = _rules(crds, [d for d in dry_runs if d.namespace is None])
    if cluster:
        objects += _granted("ClusterRole", {"name": name, "labels": labels}, cluster, subject)
    for where in sorted({d.namespace for d in dry_runs if d.namespace is not None}):
        rules = _rules((), [d for d in dry_runs if d.namespace == where])
        meta = {"name": name, "namespace": where, "labels": labels}
        objects += _granted("Role", meta, rules, subject)
    return objects


def gate_command(crds: Iterable[str], dry_runs: Iterable[DryRun], wait_s: int) -> list[str]:
    """The gate's container command (workloads/ready_gate.py's flags)."""
    words = ["python", "-m", GATE_MODULE, "--deadline-s", str(wait_s)]
    for crd in crds:
        words += ["--crd", crd]
    for run in dry_runs:
        words += ["--dry-run", run.path, json.dumps(run.body, sort_keys=True)]
    return [literal(w) for w in words]  # infra.plan.kubelet: no $(VAR) expansion


def gate_job(name: str, namespace: str, command: list[str], timeout_s: int) -> dict[str, Any]:
    """The awaited Job: the staging Job's posture, the gate's own service account and token."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "park-ready-gate", **PART_OF},
            "annotations": dict(REPLACE_UNREADY),
        },
        "spec": {
            "backoffLimit": RETRIES,
            "activeDeadlineSeconds": timeout_s,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": name,
                    # it calls the API server: the one pod besides the autoscaling head that does
                    "automountServiceAccountToken": True,
                    "securityContext": ray.pod_security_context(),
                    "nodeSelector": {ROLE_LABEL: "system"},
                    "containers": [
                        {
                            "name": "ready",
                            "image": "",  # the component sets the stack's workload image
                            "imagePullPolicy": "Always",
                            "command": command,
                            "env": [
                                {"name": "PYTHONUNBUFFERED", "value": "1"},
                                {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                            ],
                            "resources": ray.container_resources("100m", "256Mi", GATE_SCRATCH),
                            "securityContext": ray.container_security_context(),
                            "terminationMessagePolicy": "FallbackToLogsOnError",
                        }
                    ],
                }
            },
        },
    }


def gate(
    key: str,
    what: str,
    namespace: str,
    *,
    crds: tuple[str, ...] = (),
    dry_runs: tuple[DryRun, ...] = (),
    wait_s: int = CRD_WAIT_S,
) -> GatePlan:
    """A gate named `<namespace>-<key>-ready` (its objects and its Job)."""
    name = f"{namespace}-{key}-ready"
    job = gate_job(name, namespace, gate_command(crds, dry_runs, wait_s), START_S + wait_s)
    return GatePlan(
        key, what, crds, dry_runs, wait_s, (*_rbac(name, namespace, crds, dry_runs), job)
    )


def _probe(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"generateName": PROBE_NAME},
        "spec": spec,
    }


KUEUE_PROBE = DryRun(
    "kueue.x-k8s.io", "clusterqueues", None, _probe("kueue.x-k8s.io/v1beta2", "ClusterQueue", {})
)


def cert_manager_probe(namespace: str) -> DryRun:
    """A self-signed Issuer in `namespace`: cert-manager's webhook validates Issuers."""
    body = _probe("cert-manager.io/v1", "Issuer", {"selfSigned": {}})
    return DryRun("cert-manager.io", "issuers", namespace, body)


def stack_gates(plan: StackPlan) -> StackGates:
    """The gates of `plan`'s stack: none without a workload (the image they run is one's)."""
    if plan.training is None and plan.serving is None and plan.rl is None:
        return StackGates()
    namespace = plan.names.namespace
    ray_kinds = [
        *([{"apiVersion": "ray.io/v1", "kind": "RayJob"}] if plan.training or plan.rl else []),
        *([{"apiVersion": "ray.io/v1", "kind": "RayService"}] if plan.serving else []),
    ]
    kuberay = gate(
        "kuberay",
        "KubeRay's CRDs Established, before the RayJobs and RayServices",
        namespace,
        crds=crds_of(ray_kinds),
    )
    cert_manager = None
    if plan.spec.kuberay.install == "helm" and plan.multi_host:
        cert_manager = gate(
            "cert-manager",
            "cert-manager's webhook answers, before the TPU webhook's Certificates and Issuers",
            namespace,
            dry_runs=(cert_manager_probe(namespace),),
            wait_s=WEBHOOK_WAIT_S,
        )
    kueue = None
    if plan.kueue_pools:
        kueue = gate(
            "kueue",
            "Kueue's webhook answers, before its queue objects",
            namespace,
            dry_runs=(KUEUE_PROBE,),
            wait_s=WEBHOOK_WAIT_S,
        )
    monitored = crds_of(metrics(plan).pod_monitorings)
    watch = None
    if monitored:
        watch = gate("metrics", "PodMonitoring's CRD Established", namespace, crds=monitored)
    access = dashboard_access(plan)
    dashboard = None
    if access is not None and crds_of(access.manifests):
        dashboard = gate(
            "dashboard",
            "the Gateway kinds' CRDs Established, before the IAP dashboard's",
            namespace,
            crds=crds_of(access.manifests),
        )
    return StackGates(kuberay, cert_manager, kueue, watch, dashboard)


def gate_rows(plan: StackPlan) -> list[tuple[str, str]]:
    """`park validate`'s first-`up` rows: each gate, what it waits for and its bound."""
    return [
        (
            f"gate {g.job['metadata']['name']}",
            f"{g.what}: waits up to {g.wait_s // 60} min, after up to {START_S // 60} min to "
            f"start its pod (Job deadline {g.timeout_s // 60} min)",
        )
        for g in stack_gates(plan).all()
    ]
