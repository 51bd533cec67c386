"""The workload namespace and what every Ray pod in it relies on (plain manifests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.names import (
    DASHBOARD_PORT,
    GMP_NAMESPACE,
    HF_SECRET_NAME,
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


def namespace(plan: StackPlan) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": plan.names.namespace,
            "labels": {**PART_OF, "pod-security.kubernetes.io/enforce": "baseline"},
        },
    }


def service_account(plan: StackPlan) -> dict[str, Any]:
    """The KSA every Ray pod runs as; Workload Identity maps it to the workload GSA."""
    names = plan.names
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": names.workload_ksa,
            "namespace": names.namespace,
            "labels": PART_OF,
            "annotations": {"iam.gke.io/gcp-service-account": names.workload_service_account_email},
        },
    }


def hf_token_secret_metadata(plan: StackPlan) -> dict[str, Any]:
    """Metadata only: the token itself stays a Pulumi secret and is set by the component."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": HF_SECRET_NAME, "namespace": plan.names.namespace, "labels": PART_OF},
    }


def _tcp(port: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port}]


def ray_network_policy(plan: StackPlan) -> dict[str, Any]:
    """Ray pods accept traffic from pods of their own namespace on any port (Ray's workers talk
    on ephemeral ports), the serve port from any pod of the cluster, and metrics scrapes from
    Managed Prometheus. Nothing from outside the cluster, except what a stack flag opens: the
    serve port when park:serving.exposePublicly, the dashboard from Google's front ends (IAP)
    when park:observability.exposeDashboard."""
    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": {}}]},
        {"from": [{"namespaceSelector": {}}], "ports": _tcp(SERVE_PORT)},
        {
            "from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: GMP_NAMESPACE}}}],
            "ports": _tcp(METRICS_PORT),
        },
    ]
    spec = plan.spec
    if spec.serving.enabled and spec.serving.expose_publicly:
        ingress.append({"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": _tcp(SERVE_PORT)})
    if spec.observability.expose_dashboard:
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
            "namespace": plan.names.namespace,
            "labels": PART_OF,
        },
        "spec": {
            "podSelector": {"matchLabels": {RAY_NODE_LABEL: "yes"}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


@dataclass(frozen=True)
class WorkspacePlan:
    """The workload namespace and what every Ray pod in it relies on."""

    namespace: dict[str, Any]
    service_account: dict[str, Any]
    network_policy: dict[str, Any]
    hf_token_secret: dict[str, Any]  # metadata only; the component adds the (secret) token


def workspace(plan: StackPlan) -> WorkspacePlan:
    return WorkspacePlan(
        namespace=namespace(plan),
        service_account=service_account(plan),
        network_policy=ray_network_policy(plan),
        hf_token_secret=hf_token_secret_metadata(plan),
    )
