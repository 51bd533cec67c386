"""Kueue objects for `capacity: queued` pools: jobs wait in a queue until GKE's Dynamic Workload
Scheduler (DWS) provisions a whole slice, instead of failing for lack of capacity.

Per queued pool: a ResourceFlavor (the pool's node labels and taints), a ClusterQueue whose TPU
quota is the pool's chips (slices times chips per slice), and a LocalQueue in the workload namespace
that jobs name with the `kueue.x-k8s.io/queue-name` label. Shared by all queued pools: a flavor for
CPU, memory and disk, and one AdmissionCheck with its ProvisioningRequestConfig
(`queued-provisioning.gke.io`), so Kueue admits a job only once DWS has its nodes.
Nothing here when no pool is queued. Shapes follow Kueue v0.19's provisioning sample.
"""

from __future__ import annotations

from typing import Any

from infra import catalog
from infra.names import (
    KUEUE_NAMESPACE,
    NAMESPACE_NAME_LABEL,
    PART_OF,
    POOL_LABEL,
    QUEUED_TAINT_KEY,
    ROLE_LABEL,
    cluster_queue_name,
    flavor_name,
    local_queue_name,
)
from infra.plan.operator import HelmReleasePlan
from infra.resolve import PoolPlan, StackPlan
from infra.resolve.disk import DEFAULT_BOOT_DISK_GB

API_VERSION = "kueue.x-k8s.io/v1beta2"
CHART = "oci://registry.k8s.io/kueue/charts/kueue"
RELEASE_NAME = "kueue"
DWS_PROVISIONING_CLASS = "queued-provisioning.gke.io"
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
DWS_CHECK = "park-dws"
# CPU, memory and disk of any pod (Ray head, submitter, TPU workers): no node labels, so a head
# keeps its own nodeSelector; the TPU flavor (labels + taints) applies only to pods asking for TPUs.
HOST_FLAVOR = "park-host"
HOST_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def helm_release(plan: StackPlan) -> HelmReleasePlan | None:
    """Kueue's own chart at the pinned version (its CRDs come with it); None unless queued.
    Its default integrations include ray.io/rayjob; the ProvisioningRequest check is GA."""
    if not plan.queued_pools:
        return None
    return HelmReleasePlan(
        name=RELEASE_NAME,
        chart=CHART,
        version=plan.spec.kueue.version,
        repo=None,
        namespace=KUEUE_NAMESPACE,
    )


def _metadata(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(PART_OF)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def resource_flavor(pool: PoolPlan) -> dict[str, Any]:
    """The pool's nodes: Kueue adds these labels to admitted TPU pods (pinning them to this pool,
    not another pool of the same shape) and admits only pods tolerating these taints."""
    tpu = pool.slice
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": _metadata(flavor_name(pool.name)),
        "spec": {
            "nodeLabels": {**tpu.node_labels(), POOL_LABEL: pool.name, ROLE_LABEL: "tpu"},
            "nodeTaints": [
                {
                    "key": catalog.TPU_TAINT_KEY,
                    "value": catalog.TPU_TAINT_VALUE,
                    "effect": catalog.TPU_TAINT_EFFECT,
                },
                {"key": QUEUED_TAINT_KEY, "value": "true", "effect": "NoSchedule"},
            ],
        },
    }


def host_flavor() -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": _metadata(HOST_FLAVOR),
        "spec": {},
    }


def quotas(pool: PoolPlan, disk_gb: int | None = None) -> dict[str, str]:
    """What the pool's nodes hold, all slices up: TPU chips, and the hosts' CPU, memory and disk
    (`disk_gb`: the boot disk the disk plan gives the pool, infra.resolve.disk). A Ray head and
    submitter fit in the share of a host the TPU worker leaves to system pods."""
    machine = catalog.MACHINE_TYPES[pool.slice.machine_type]
    hosts = pool.total_hosts
    disk_gb = disk_gb or pool.spec.disk_size_gb or DEFAULT_BOOT_DISK_GB
    return {
        catalog.TPU_RESOURCE: str(pool.total_chips),
        "cpu": str(machine.vcpus * hosts),
        "memory": f"{machine.memory_gib * hosts}Gi",
        "ephemeral-storage": f"{disk_gb * hosts}Gi",
    }


def cluster_queue(plan: StackPlan, pool: PoolPlan) -> dict[str, Any]:
    """Jobs from the workload namespace only; admitted when quota is free and DWS has the slice."""
    node = plan.disk.node(pool.name) if plan.disk else None
    quota = quotas(pool, node.boot_disk_gb if node else None)
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": _metadata(cluster_queue_name(pool.name)),
        "spec": {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: plan.names.namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": [catalog.TPU_RESOURCE],
                    "flavors": [
                        {
                            "name": flavor_name(pool.name),
                            "resources": [
                                {
                                    "name": catalog.TPU_RESOURCE,
                                    "nominalQuota": quota[catalog.TPU_RESOURCE],
                                }
                            ],
                        }
                    ],
                },
                {
                    "coveredResources": list(HOST_RESOURCES),
                    "flavors": [
                        {
                            "name": HOST_FLAVOR,
                            "resources": [
                                {"name": r, "nominalQuota": quota[r]} for r in HOST_RESOURCES
                            ],
                        }
                    ],
                },
            ],
            "admissionChecksStrategy": {
                "admissionChecks": [{"name": DWS_CHECK, "onFlavors": [flavor_name(pool.name)]}]
            },
        },
    }


def local_queue(plan: StackPlan, pool: PoolPlan) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": _metadata(local_queue_name(pool.name), plan.names.namespace),
        "spec": {"clusterQueue": cluster_queue_name(pool.name)},
    }


def provisioning_request_config() -> dict[str, Any]:
    """DWS: one ProvisioningRequest per admitted job, for its TPU pods only (the head and
    submitter run on the CPU pool and need no new capacity)."""
    return {
        "apiVersion": API_VERSION,
        "kind": "ProvisioningRequestConfig",
        "metadata": _metadata(DWS_CHECK),
        "spec": {
            "provisioningClassName": DWS_PROVISIONING_CLASS,
            "managedResources": [catalog.TPU_RESOURCE],
        },
    }


def admission_check() -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionCheck",
        "metadata": _metadata(DWS_CHECK),
        "spec": {
            "controllerName": PROVISIONING_CONTROLLER,
            "parameters": {
                "apiGroup": API_VERSION.split("/")[0],
                "kind": "ProvisioningRequestConfig",
                "name": DWS_CHECK,
            },
        },
    }


def manifests(plan: StackPlan) -> list[dict[str, Any]]:
    """Every Kueue object of the stack, cluster-scoped ones first; empty unless a pool is queued."""
    pools = plan.queued_pools
    if not pools:
        return []
    return [
        provisioning_request_config(),
        admission_check(),
        host_flavor(),
        *(resource_flavor(p) for p in pools),
        *(cluster_queue(plan, p) for p in pools),
        *(local_queue(plan, p) for p in pools),
    ]
