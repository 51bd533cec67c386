"""The workload namespace and what every Ray pod in it relies on (plain manifests)."""

from __future__ import annotations

from typing import Any

from infra.config import StackConfig
from infra.plan.ray import (
    HF_SECRET_NAME,
    METRICS_PORT,
    WORKLOAD_KSA,
    workload_gsa_email,
)

PART_OF = {"app.kubernetes.io/part-of": "park-gke"}
# Google Managed Prometheus collectors scrape from this namespace.
GMP_NAMESPACE = "gmp-system"


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


def ray_network_policy(config: StackConfig) -> dict[str, Any]:
    """Ray pods accept traffic only from pods of their own namespace (Ray's own ports, serve,
    dashboard) and metrics scrapes from Managed Prometheus. Nothing outside the cluster."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "ray-pods", "namespace": config.namespace, "labels": PART_OF},
        "spec": {
            "podSelector": {"matchLabels": {"ray.io/is-ray-node": "yes"}},
            "policyTypes": ["Ingress"],
            "ingress": [
                # Ray's workers talk to each other on ephemeral ports: same-namespace pods only.
                {"from": [{"podSelector": {}}]},
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": GMP_NAMESPACE}
                            }
                        }
                    ],
                    "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
                },
            ],
        },
    }
