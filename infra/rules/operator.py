"""The KubeRay that will run knows every field of the RayJobs and RayServices we send it.

The API server prunes a field the served CRD does not declare, without an error: an older
operator would run the job without its `backoffLimit`, the service without its
`upgradeStrategy`. We validate manifests against KubeRay 1.7.0's CRDs (infra/schemas); here each
field is held to the KubeRay that runs the stack: the Helm chart's version, or what GKE's Ray
add-on is taken to run on the cluster's version (infra/data/gke.yaml: Google publishes none).
Which release first declares a field: infra/data/kuberay_fields.yaml, from KubeRay's own CRDs.
"""

from __future__ import annotations

from typing import Any

from infra import gke, kuberay
from infra.gke import GkeVersion
from infra.plan.ray.job import rayjob
from infra.plan.ray.pods import ray_pods
from infra.plan.ray.service import rayservice
from infra.plan.rl import rl_rayjob
from infra.resolve import StackPlan
from infra.schema.errors import ConfigProblem
from infra.versions import KUBERAY_VERSION


def ray_manifests(plan: StackPlan) -> list[dict[str, Any]]:
    """The RayJobs and RayService the stack sends the operator, as the plan builds them."""
    pods = ray_pods(plan)
    found = []
    if plan.training is not None:
        found.append(rayjob(plan.training, pods))
    if plan.serving is not None:
        found.append(rayservice(plan.serving, pods, hf_token=False))
    if plan.rl is not None:
        found.append(rl_rayjob(plan.rl, pods))
    return found


def _gke_minimum(needed: str) -> str:
    """The oldest GKE minor whose add-on is taken to run KubeRay ≥ `needed`."""
    for minor in range(30, 100):  # the add-on exists from 1.30; bounded past the recorded dates
        running = gke.addon_kuberay(GkeVersion(1, minor)).version
        if kuberay.version_key(running) >= kuberay.version_key(needed):
            return f"GKE ≥ 1.{minor}"
    return "no GKE version recorded in infra/data/gke.yaml"


def _is_release(version: str) -> bool:
    """A KubeRay release that serves ray.io/v1 (1.0.0 or later)."""
    try:
        return kuberay.version_key(version) >= kuberay.version_key(kuberay.baseline())
    except ValueError:
        return False


def running_kuberay(plan: StackPlan) -> tuple[str, str]:
    """(the KubeRay that runs the stack, how the messages name it)."""
    spec = plan.spec
    if spec.kuberay.install == "helm":
        return spec.kuberay.version, f"the kuberay-operator chart {spec.kuberay.version}"
    addon = gke.addon_kuberay(plan.cluster_version)
    pinned, channel = spec.cluster.version, spec.cluster.release_channel
    version = pinned or f"{plan.cluster_version} (channel {channel}'s default)"
    return addon.version, (
        f"GKE {version}'s Ray add-on, taken to run KubeRay {addon.version} ({addon.basis}),"
    )


def check_operator(plan: StackPlan) -> list[ConfigProblem]:
    """Every RayJob/RayService field is known to the KubeRay that runs the stack; refused
    under the key that chooses that KubeRay (the chart version, or the cluster version)."""
    helm = plan.spec.kuberay.install == "helm"
    key = "park:kuberay.version" if helm else "park:cluster.version"
    value = plan.spec.kuberay.version if helm else plan.spec.cluster.version
    if helm and not _is_release(plan.spec.kuberay.version):
        allowed = f"a kuberay-operator chart release ≥ {kuberay.baseline()} (ray.io/v1)"
        return [ConfigProblem(key, value, f"{allowed}, e.g. {KUBERAY_VERSION}")]
    running, what = running_kuberay(plan)
    problems = []
    for manifest in ray_manifests(plan):
        missing = kuberay.unknown_fields(manifest, running)
        if not missing:
            continue
        needed = max((f.since for f in missing), key=kuberay.version_key)
        if helm:
            allowed = f"a chart release ≥ {needed}, e.g. {KUBERAY_VERSION}"
        else:
            allowed = (
                f"{_gke_minimum(needed)} (its add-on taken at KubeRay ≥ {needed}), or "
                f"park:kuberay.install: helm (KubeRay {KUBERAY_VERSION})"
            )
        fields = ", ".join(f"{f.path} (KubeRay ≥ {f.since})" for f in missing)
        name = f"{manifest['kind']} {manifest['metadata']['name']}"
        it = "them" if len(missing) > 1 else "it"
        problems.append(
            ConfigProblem(
                key,
                value,
                f"{what} lacks {name}'s {fields}: the API server would drop {it} without an "
                f"error; allowed: {allowed}",
            )
        )
    return problems
