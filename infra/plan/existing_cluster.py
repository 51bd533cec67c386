"""What park-gke needs of a GKE cluster it did not create, checked at preview time.

A platform team's own cluster gets TPU slice pools, KubeRay and the workloads only if it has
what the Ray pods rely on: Standard mode (node pools), Workload Identity in the project's pool
(the bucket), the GCS FUSE CSI driver (the bucket mount), a version the TPU generation and the
Ray add-on need, and, for the add-on install, the add-on itself. The cluster lookup
(`gcp.container.getCluster`) runs during preview, so a missing piece fails `pulumi preview`
with the gcloud command that adds it, before any TPU pool exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic.alias_generators import to_camel

from infra import catalog, gke
from infra.names import POOL_LABEL

DEFAULT_SERVICE_ACCOUNT = "default"  # the Compute Engine default service account's alias


@dataclass(frozen=True)
class ClusterFacts:
    """The parts of a GKE cluster (getCluster's result) park-gke depends on."""

    name: str
    location: str
    version: str  # the control plane's current version
    workload_pool: str | None
    gcs_fuse: bool
    ray_operator_addon: bool
    dataplane_v2: bool
    calico_network_policy: bool
    autopilot: bool
    endpoint: str
    ca_certificate: str
    dns_endpoint: str | None  # the DNS-based endpoint, when it takes traffic from outside
    node_service_account: str | None
    # The TPU pools park-gke can run on: its node pools' `park-gke/pool` label → machine type
    park_pools: tuple[tuple[str, str], ...] = ()


def _get(obj: Any, name: str) -> Any:
    """A field of a lookup result: an output type's attribute, or a wire dict's camelCase key."""
    if obj is None:
        return None
    if isinstance(obj, dict):
        return obj.get(to_camel(name), obj.get(name))
    return getattr(obj, name, None)


def _first(obj: Any, name: str) -> Any:
    """getCluster returns every nested block as a list of one."""
    items = _get(obj, name) or []
    return items[0] if items else None


def facts_of(result: Any) -> ClusterFacts:
    addons = _first(result, "addons_configs")
    dns = _first(_first(result, "control_plane_endpoints_configs"), "dns_endpoint_configs")
    dns_endpoint = _get(dns, "endpoint") if _get(dns, "allow_external_traffic") else None
    return ClusterFacts(
        name=str(_get(result, "name") or ""),
        location=str(_get(result, "location") or ""),
        version=str(_get(result, "master_version") or ""),
        workload_pool=_get(_first(result, "workload_identity_configs"), "workload_pool") or None,
        gcs_fuse=bool(_get(_first(addons, "gcs_fuse_csi_driver_configs"), "enabled")),
        ray_operator_addon=bool(_get(_first(addons, "ray_operator_configs"), "enabled")),
        dataplane_v2=_get(result, "datapath_provider") == "ADVANCED_DATAPATH",
        calico_network_policy=bool(_get(_first(result, "network_policies"), "enabled")),
        autopilot=bool(_get(result, "enable_autopilot")),
        endpoint=str(_get(result, "endpoint") or ""),
        ca_certificate=str(_get(_first(result, "master_auths"), "cluster_ca_certificate") or ""),
        dns_endpoint=dns_endpoint or None,
        node_service_account=_get(_first(result, "node_configs"), "service_account") or None,
        park_pools=_park_pools(_get(result, "node_pools") or []),
    )


def _park_pools(node_pools: list[Any]) -> tuple[tuple[str, str], ...]:
    """(the `park-gke/pool` label, machine type) of each node pool whose nodes carry it."""
    found = []
    for node_pool in node_pools:
        config = _first(node_pool, "node_configs")
        labels = _get(config, "labels") or {}
        if isinstance(labels, dict) and labels.get(POOL_LABEL):
            found.append((str(labels[POOL_LABEL]), str(_get(config, "machine_type") or "")))
    return tuple(found)


def _update(facts: ClusterFacts, flag: str) -> str:
    return f"gcloud container clusters update {facts.name} --location {facts.location} {flag}"


def _floor(generation: catalog.TpuGeneration) -> tuple[int, ...]:
    version = gke.parse(generation.min_gke_version)
    assert version is not None, generation.min_gke_version
    return (version.major, version.minor, version.patch or 0, version.gke or 0)


def problems(
    facts: ClusterFacts,
    *,
    project: str,
    kuberay_install: str,
    node_service_account: str | None,
) -> list[str]:
    """What stops the TPU pools, the bucket mount or KubeRay working on this cluster."""
    found: list[str] = []
    if facts.autopilot:
        found.append(
            "an Autopilot cluster: park-gke adds TPU slices as node pools, which only a "
            "Standard cluster has"
        )
    pool = f"{project}.svc.id.goog"
    if facts.workload_pool != pool:
        found.append(
            f"Workload Identity is {'off' if not facts.workload_pool else facts.workload_pool!r}"
            f" (the Ray pods reach the bucket as a workload service account in {pool}): "
            + _update(facts, f"--workload-pool={pool}")
        )
    if not facts.gcs_fuse:
        found.append(
            "the GCS FUSE CSI driver is off (the Ray pods mount the bucket with it): "
            + _update(facts, "--update-addons GcsFuseCsiDriver=ENABLED")
        )
    if kuberay_install == "addon" and not facts.ray_operator_addon:
        found.append(
            "GKE's Ray Operator add-on is off: "
            + _update(facts, "--update-addons RayOperator=ENABLED")
            + ", or install KubeRay by Helm (kuberay_install: helm)"
        )
    version = gke.parse(facts.version)
    # The oldest generation's floor: the cluster must take some TPU pool. A newer generation's
    # floor (TPU7x 1.34) is the pool's to check, as the stack's rules do (rules.pools).
    oldest = min(catalog.GENERATIONS.values(), key=_floor)
    needs = [(f"TPU {oldest.name}", oldest.min_gke_version)]
    if kuberay_install == "addon":
        needs.append(("GKE's Ray Operator add-on", str(gke.minimum("ray-operator-addon")[0])))
    for what, minimum in needs:
        floor = gke.parse(minimum)
        if version is not None and floor is not None and not version.satisfies(floor):
            found.append(f"version {facts.version} is older than {what} needs ({minimum})")
    if node_service_account is None and facts.node_service_account in (
        None,
        DEFAULT_SERVICE_ACCOUNT,
    ):
        found.append(
            "its nodes run as the Compute Engine default service account: pass "
            "node_service_account (an e-mail, e.g. PROJECT_NUMBER-compute@developer."
            "gserviceaccount.com) for the TPU pools and the registry grant"
        )
    return found


def warnings(facts: ClusterFacts) -> list[str]:
    """What works but leaves a gap park-gke would otherwise close."""
    found = []
    if not (facts.dataplane_v2 or facts.calico_network_policy):
        found.append(
            "NetworkPolicy is not enforced (neither Dataplane V2 nor Calico): the workspace's "
            "policy is created but lets everything in"
        )
    return found
