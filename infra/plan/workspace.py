"""The workload namespace and what every Ray pod in it relies on (plain manifests)."""

from __future__ import annotations

from typing import Any

from infra.config import StackConfig
from infra.plan.pods import RAY_NODE_LABEL
from infra.plan.ray import (
    DASHBOARD_PORT,
    HF_SECRET_NAME,
    METRICS_PORT,
    SERVE_PORT,
    WORKLOAD_KSA,
    workload_gsa_email,
)

PART_OF = {"app.kubernetes.io/part-of": "park-gke"}
# Google Managed Prometheus collectors scrape from this namespace.
GMP_NAMESPACE = "gmp-system"
# Where Google's external load balancers (and IAP behind them) reach pods from:
# https://cloud.google.com/load-balancing/docs/health-check-concepts#ip-ranges
GOOGLE_FRONT_END_RANGES = ("130.211.0.0/22", "35.191.0.0/16")


def namespace(config: StackConfig) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": config.namespace,
            "labels": {**PART_OF, "pod-security.kubernetes.io/enforce": "baseline"},
        },
    }


def service_account(config: StackConfig) -> dict[str, Any]:
    """The KSA every Ray pod runs as; Workload Identity maps it to the workload GSA."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": WORKLOAD_KSA,
            "namespace": config.namespace,
            "labels": PART_OF,
            "annotations": {"iam.gke.io/gcp-service-account": workload_gsa_email(config)},
        },
    }


def hf_token_secret_metadata(config: StackConfig) -> dict[str, Any]:
    """Metadata only: the token itself stays a Pulumi secret and is set by the component."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": HF_SECRET_NAME, "namespace": config.namespace, "labels": PART_OF},
    }


def _tcp(port: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port}]


def ray_network_policy(config: StackConfig) -> dict[str, Any]:
    """Ray pods accept traffic from pods of their own namespace on any port (Ray's workers talk
    on ephemeral ports), the serve port from any pod of the cluster, and metrics scrapes from
    Managed Prometheus. Nothing from outside the cluster, except what a stack flag opens: the
    serve port when park:serving.exposePublicly, the dashboard from Google's front ends (IAP)
    when park:observability.exposeDashboard."""
    ingress: list[dict[str, Any]] = [
        {"from": [{"podSelector": {}}]},
        {"from": [{"namespaceSelector": {}}], "ports": _tcp(SERVE_PORT)},
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": GMP_NAMESPACE}
                    }
                }
            ],
            "ports": _tcp(METRICS_PORT),
        },
    ]
    if config.serving.enabled and config.serving.expose_publicly:
        ingress.append({"from": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": _tcp(SERVE_PORT)})
    if config.observability.expose_dashboard:
        ingress.append(
            {
                "from": [{"ipBlock": {"cidr": cidr}} for cidr in GOOGLE_FRONT_END_RANGES],
                "ports": _tcp(DASHBOARD_PORT),
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "ray-pods", "namespace": config.namespace, "labels": PART_OF},
        "spec": {
            "podSelector": {"matchLabels": {RAY_NODE_LABEL: "yes"}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
