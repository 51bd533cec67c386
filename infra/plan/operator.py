"""How KubeRay reaches the cluster: GKE's Ray Operator add-on, or Helm charts (never both).

The add-on brings KubeRay and the KubeRay TPU webhook. A self-installed KubeRay 1.7.0 does not
inject TPU_WORKER_ID / TPU_WORKER_HOSTNAMES, so with Helm the TPU webhook (which needs
cert-manager) comes along whenever a TPU pool is multi-host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.names import CERT_MANAGER_NAMESPACE, KUBERAY_NAMESPACE
from infra.schema.models import KubeRayConfig
from infra.versions import CERT_MANAGER_VERSION


@dataclass(frozen=True)
class HelmReleasePlan:
    name: str
    chart: str
    version: str | None
    repo: str | None  # None: `chart` is a path or an OCI reference
    namespace: str
    values: dict[str, Any] = field(default_factory=dict)
    depends_on: tuple[str, ...] = ()  # names of releases that must be ready first


KUBERAY_REPO = "https://ray-project.github.io/kuberay-helm/"
CERT_MANAGER_REPO = "https://charts.jetstack.io"
# ai-on-gke publishes the webhook chart in its git repository, not in a Helm repository:
# check out ai-on-gke and point park:kuberay.tpuWebhookChart at ray-on-gke/tpu/kuberay-tpu-webhook/.
DEFAULT_TPU_WEBHOOK_CHART = "./vendor/ai-on-gke/ray-on-gke/tpu/kuberay-tpu-webhook/helm-chart"


def helm_releases(kuberay: KubeRayConfig, multi_host: bool) -> list[HelmReleasePlan]:
    """The Helm releases for `install: helm`, in dependency order; none for the add-on.
    `multi_host`: the cluster has multi-host TPU slices (they need the TPU webhook)."""
    if kuberay.install != "helm":
        return []
    releases = [
        HelmReleasePlan(
            name="kuberay-operator",
            chart="kuberay-operator",
            version=kuberay.version,
            repo=KUBERAY_REPO,
            namespace=KUBERAY_NAMESPACE,
        )
    ]
    if multi_host:
        releases += [
            HelmReleasePlan(
                name="cert-manager",
                chart="cert-manager",
                version=CERT_MANAGER_VERSION,
                repo=CERT_MANAGER_REPO,
                namespace=CERT_MANAGER_NAMESPACE,
                values={"crds": {"enabled": True}},
            ),
            HelmReleasePlan(
                name="kuberay-tpu-webhook",
                chart=kuberay.tpu_webhook_chart or DEFAULT_TPU_WEBHOOK_CHART,
                version=None,
                repo=None,
                namespace=KUBERAY_NAMESPACE,
                depends_on=("cert-manager", "kuberay-operator"),
            ),
        ]
    return releases
