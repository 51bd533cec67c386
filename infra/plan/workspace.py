"""The workload namespace and what every Ray pod in it relies on (plain manifests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.names import (
    HF_SECRET_NAME,
    PART_OF,
    StackNames,
)
from infra.plan import network_policy


def _core(kind: str, metadata: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A core (v1) object: kind, then its own top-level fields, then its metadata."""
    return {"apiVersion": "v1", "kind": kind, **fields, "metadata": metadata}


def namespace(names: StackNames) -> dict[str, Any]:
    labels = {**PART_OF, "pod-security.kubernetes.io/enforce": "baseline"}
    return _core("Namespace", {"name": names.namespace, "labels": labels})


def service_account(names: StackNames) -> dict[str, Any]:
    """The KSA every Ray pod runs as; Workload Identity maps it to the workload GSA."""
    gsa = {"iam.gke.io/gcp-service-account": names.workload_service_account_email}
    metadata = {"name": names.workload_ksa, "namespace": names.namespace, "labels": PART_OF}
    return _core("ServiceAccount", {**metadata, "annotations": gsa})


def hf_token_secret_metadata(names: StackNames) -> dict[str, Any]:
    """Metadata only: the token itself stays a Pulumi secret and is set by the component."""
    metadata = {"name": HF_SECRET_NAME, "namespace": names.namespace, "labels": PART_OF}
    return _core("Secret", metadata, type="Opaque")


@dataclass(frozen=True)
class WorkspacePlan:
    """The workload namespace and what every Ray pod in it relies on."""

    namespace: dict[str, Any]
    service_account: dict[str, Any]
    network_policy: dict[str, Any]
    hf_token_secret: dict[str, Any]  # metadata only; the component adds the (secret) token


def workspace(names: StackNames, exposed: network_policy.Exposure) -> WorkspacePlan:
    return WorkspacePlan(
        namespace=namespace(names),
        service_account=service_account(names),
        network_policy=network_policy.ray_network_policy(exposed),
        hf_token_secret=hf_token_secret_metadata(names),
    )
