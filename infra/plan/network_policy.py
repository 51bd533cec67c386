"""Who may reach the Ray pods: the NetworkPolicy, and the table of flows Ray on GKE needs.

Dataplane V2 enforces NetworkPolicy, so every flow Ray needs must be allowed and nothing else:

- inside the namespace, any port: head and workers talk on GCS, object and node managers and
  ephemeral worker ports; KubeRay's submitter pod calls the head's dashboard;
- the KubeRay operator calls the head's dashboard (8265: job and Serve status) and, for a
  RayService, Serve's port (8000: health). With `install: helm` it runs in `kuberay-system`
  (chart labels `app.kubernetes.io/name: kuberay-operator`) and calls the head Service and pod
  IP directly. GKE's Ray Operator add-on hosts the operator outside the cluster (GKE docs:
  "installs and hosts the KubeRay operator"); it reaches pods through the API server's
  proxy (KubeRay's `--use-kubernetes-proxy`, added for "a network without connectivity to
  Pods"). API-server-to-pod traffic leaves through the Konnectivity agents in kube-system
  (label `k8s-app: konnectivity-agent`), or, where a cluster has none, from the control
  plane's own range (`park:network.masterCidr`): both are allowed, on those two ports only;
- Managed Prometheus scrapes the metrics port from `gmp-system`;
- clients of the cluster call Serve's port; the internet only when park:serving.exposePublicly;
- Google's front ends (the IAP Gateway) reach the dashboard only with exposeDashboard.
The TPU webhook needs no rule here: the API server calls it, and it never calls Ray pods.

`flows(plan)` lists each flow with whether it must be allowed; tools/netpol.py evaluates them
against the rendered policies with Kubernetes' NetworkPolicy semantics (park validate, tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from infra.names import (
    DASHBOARD_PORT,
    GMP_NAMESPACE,
    HEAD_PORTS,
    KUBERAY_NAMESPACE,
    METRICS_PORT,
    NAMESPACE_NAME_LABEL,
    NETWORK_POLICY_NAME,
    PART_OF,
    RAY_NODE_LABEL,
    SERVE_PORT,
)
from infra.resolve import StackPlan

# Where Google's external load balancers (and IAP behind them) reach pods from:
# https://cloud.google.com/load-balancing/docs/health-check-concepts#ip-ranges
GOOGLE_FRONT_END_RANGES = ("130.211.0.0/22", "35.191.0.0/16")
KUBE_SYSTEM = "kube-system"
KONNECTIVITY_LABELS = {"k8s-app": "konnectivity-agent"}
KUBERAY_OPERATOR_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}
GCS_PORT = HEAD_PORTS["gcs-server"]
CLIENT_PORT = HEAD_PORTS["client"]


def _tcp(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def _namespace(name: str) -> dict[str, Any]:
    return {"matchLabels": {NAMESPACE_NAME_LABEL: name}}


@dataclass(frozen=True)
class Exposure:
    """What decides the Ray pods' NetworkPolicy."""

    namespace: str
    kuberay_install: str  # addon or helm: where the operator calls from
    master_cidr: str  # the control plane's range (the add-on's calls, through the API server)
    public_serve: bool  # park:serving.exposePublicly
    public_dashboard: bool  # park:observability.exposeDashboard


def exposure(plan: StackPlan) -> Exposure:
    spec = plan.spec
    return Exposure(
        namespace=plan.names.namespace,
        kuberay_install=spec.kuberay.install,
        master_cidr=spec.network.master_cidr,
        public_serve=bool(spec.serving.enabled and spec.serving.expose_publicly),
        public_dashboard=spec.observability.expose_dashboard,
    )


def _operator_peers(exposed: Exposure) -> list[dict[str, Any]]:
    """Where the KubeRay operator's calls to the head come from (module docstring)."""
    if exposed.kuberay_install == "helm":
        return [
            {
                "namespaceSelector": _namespace(KUBERAY_NAMESPACE),
                "podSelector": {"matchLabels": dict(KUBERAY_OPERATOR_LABELS)},
            }
        ]
    return [
        {
            "namespaceSelector": _namespace(KUBE_SYSTEM),
            "podSelector": {"matchLabels": dict(KONNECTIVITY_LABELS)},
        },
        {"ipBlock": {"cidr": exposed.master_cidr}},
    ]


def ray_network_policy(exposed: Exposure) -> dict[str, Any]:
    """The NetworkPolicy of every Ray pod of the namespace (module docstring: what and why)."""
    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": {}}]},
        {"from": _operator_peers(exposed), "ports": _tcp(DASHBOARD_PORT, SERVE_PORT)},
        {"from": [{"namespaceSelector": {}}], "ports": _tcp(SERVE_PORT)},
        {"from": [{"namespaceSelector": _namespace(GMP_NAMESPACE)}], "ports": _tcp(METRICS_PORT)},
    ]
    if exposed.public_serve:
        ingress.append({"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": _tcp(SERVE_PORT)})
    if exposed.public_dashboard:
        ingress.append(
            {
                "from": [{"ipBlock": {"cidr": cidr}} for cidr in GOOGLE_FRONT_END_RANGES],
                "ports": _tcp(DASHBOARD_PORT),
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": NETWORK_POLICY_NAME,
            "namespace": exposed.namespace,
            "labels": PART_OF,
        },
        "spec": {
            "podSelector": {"matchLabels": {RAY_NODE_LABEL: "yes"}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


# ---- the flows ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Where a connection comes from: a pod (namespace and labels) or an address outside."""

    namespace: str | None = None  # None: not a pod of the cluster
    labels: dict[str, str] = field(default_factory=dict)
    ip: str | None = None


RAY_ROLES: tuple[Literal["head", "worker"], ...] = ("head", "worker")


@dataclass(frozen=True)
class Flow:
    name: str
    source: Source
    role: Literal["head", "worker", "webhook"]  # the destination pod
    port: int
    allowed: bool  # must be allowed (True) or must be refused (False)


def flows(exposed: Exposure) -> list[Flow]:
    """Every flow Ray on GKE needs for this stack, and the ones that must stay closed."""
    ns = exposed.namespace
    master = exposed.master_cidr.split("/")[0]
    control_plane = Source(ip=master[: master.rindex(".") + 1] + "2")
    ray_pod = Source(ns, {RAY_NODE_LABEL: "yes"})
    submitter = Source(ns, {"job-name": "park-train-x"})
    collector = Source(GMP_NAMESPACE, {"app": "collector"})
    elsewhere = Source("apps", {"app": "client"})
    internet = Source(ip="198.51.100.7")
    front_end = Source(ip="35.191.0.9")
    public = exposed.public_serve
    head_ports = (("dashboard", DASHBOARD_PORT), ("GCS", GCS_PORT), ("client", CLIENT_PORT))
    table = [
        Flow("worker → head GCS", ray_pod, "head", GCS_PORT, True),
        Flow("head → worker, ephemeral port", ray_pod, "worker", 33127, True),
        Flow("submitter → head dashboard", submitter, "head", DASHBOARD_PORT, True),
        *(Flow(f"GMP → {r} metrics", collector, r, METRICS_PORT, True) for r in RAY_ROLES),
        *(Flow(f"cluster client → serve ({r})", elsewhere, r, SERVE_PORT, True) for r in RAY_ROLES),
        Flow("API server → TPU webhook", control_plane, "webhook", 443, True),
        *(Flow(f"other namespace → head {p}", elsewhere, "head", n, False) for p, n in head_ports),
        Flow("GMP → head dashboard", collector, "head", DASHBOARD_PORT, False),
        Flow("internet → head dashboard", internet, "head", DASHBOARD_PORT, False),
        Flow("internet → serve", internet, "head", SERVE_PORT, public),
        Flow(
            "Google front end (IAP Gateway) → head dashboard",
            front_end,
            "head",
            DASHBOARD_PORT,
            exposed.public_dashboard,
        ),
    ]
    if exposed.kuberay_install == "helm":
        operator = Source(KUBERAY_NAMESPACE, dict(KUBERAY_OPERATOR_LABELS))
        neighbour = Source(KUBERAY_NAMESPACE, {"app": "other"})
        table += _operator_flows("operator (helm)", "head dashboard", operator)
        table += [
            Flow("other kuberay-system pod → dashboard", neighbour, "head", DASHBOARD_PORT, False),
        ]
    else:
        proxy = Source(KUBE_SYSTEM, dict(KONNECTIVITY_LABELS))
        dns = Source(KUBE_SYSTEM, {"k8s-app": "kube-dns"})
        table += _operator_flows("add-on operator, API proxy", "dashboard", proxy)
        table += [
            Flow("control plane range → dashboard", control_plane, "head", DASHBOARD_PORT, True),
            Flow("control plane range → head GCS", control_plane, "head", GCS_PORT, False),
            Flow("other kube-system pod → dashboard", dns, "head", DASHBOARD_PORT, False),
        ]
    return table


def _operator_flows(who: str, dashboard: str, operator: Source) -> list[Flow]:
    """What the KubeRay operator (helm's, or the add-on's through the API proxy) must reach on
    the head: the dashboard (jobs, serve deploys) and serve's health check."""
    return [
        Flow(f"{who} → {dashboard}", operator, "head", DASHBOARD_PORT, True),
        Flow(f"{who} → serve health", operator, "head", SERVE_PORT, True),
    ]
