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
from infra.config import StackConfig, TpuPoolConfig
from infra.plan.node_pools import POOL_LABEL, QUEUED_TAINT_KEY, ROLE_LABEL
from infra.plan.operator import HelmReleasePlan

API_VERSION = "kueue.x-k8s.io/v1beta2"
CHART = "oci://registry.k8s.io/kueue/charts/kueue"
NAMESPACE = "kueue-system"
RELEASE_NAME = "kueue"
DWS_PROVISIONING_CLASS = "queued-provisioning.gke.io"
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
DWS_CHECK = "park-dws"
# CPU, memory and disk of any pod (Ray head, submitter, TPU workers): no node labels, so a head
# keeps its own nodeSelector; the TPU flavor (labels + taints) applies only to pods asking for TPUs.
HOST_FLAVOR = "park-host"
HOST_RESOURCES = ("cpu", "memory", "ephemeral-storage")
PART_OF = {"app.kubernetes.io/part-of": "park-gke"}


def queued_pools(config: StackConfig) -> list[TpuPoolConfig]:
    return [p for p in config.tpu_pools if p.capacity == "queued"]


def flavor_name(pool: TpuPoolConfig) -> str:
    return f"park-{pool.name}"


def cluster_queue_name(pool: TpuPoolConfig) -> str:
    return f"park-{pool.name}"


def local_queue_name(pool: TpuPoolConfig) -> str:
    """The queue jobs on this pool name in their `kueue.x-k8s.io/queue-name` label."""
    return pool.name


def training_queue_name(config: StackConfig) -> str | None:
    """The LocalQueue of the training RayJob: set when its pool is queued, else None."""
    if not config.training.enabled:
        return None
    pool = config.tpu_pool(config.training.pool)
    return local_queue_name(pool) if pool.capacity == "queued" else None


def helm_release(config: StackConfig) -> HelmReleasePlan | None:
    """Kueue's own chart at the pinned version (its CRDs come with it); None unless queued.
    Its default integrations include ray.io/rayjob; the ProvisioningRequest check is GA."""
    if not config.any_queued:
        return None
    return HelmReleasePlan(
        name=RELEASE_NAME,
        chart=CHART,
        version=config.kueue.version,
        repo=None,
        namespace=NAMESPACE,
    )


def _metadata(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(PART_OF)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def resource_flavor(pool: TpuPoolConfig) -> dict[str, Any]:
    """The pool's nodes: Kueue adds these labels to admitted TPU pods (pinning them to this pool,
    not another pool of the same shape) and admits only pods tolerating these taints."""
    tpu = pool.slice
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": _metadata(flavor_name(pool)),
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


def quotas(pool: TpuPoolConfig) -> dict[str, str]:
    """What the pool's nodes hold, all slices up: TPU chips, and the hosts' CPU, memory and disk.
    A Ray head and submitter fit in the share of a host the TPU worker leaves to system pods."""
    tpu = pool.slice
    machine = catalog.MACHINE_TYPES[pool.machine_type]
    hosts = tpu.hosts * pool.slices
    return {
        catalog.TPU_RESOURCE: str(tpu.chips * pool.slices),
        "cpu": str(machine.vcpus * hosts),
        "memory": f"{machine.memory_gib * hosts}Gi",
        "ephemeral-storage": f"{pool.disk_size_gb * hosts}Gi",
    }


def cluster_queue(config: StackConfig, pool: TpuPoolConfig) -> dict[str, Any]:
    """Jobs from the workload namespace only; admitted when quota is free and DWS has the slice."""
    quota = quotas(pool)
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": _metadata(cluster_queue_name(pool)),
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": config.namespace}},
            "queueingStrategy": "BestEffortFIFO",
            "resourceGroups": [
                {
                    "coveredResources": [catalog.TPU_RESOURCE],
                    "flavors": [
                        {
                            "name": flavor_name(pool),
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
                "admissionChecks": [{"name": DWS_CHECK, "onFlavors": [flavor_name(pool)]}]
            },
        },
    }


def local_queue(config: StackConfig, pool: TpuPoolConfig) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": _metadata(local_queue_name(pool), config.namespace),
        "spec": {"clusterQueue": cluster_queue_name(pool)},
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


def manifests(config: StackConfig) -> list[dict[str, Any]]:
    """Every Kueue object of the stack, cluster-scoped ones first; empty unless a pool is queued."""
    pools = queued_pools(config)
    if not pools:
        return []
    return [
        provisioning_request_config(),
        admission_check(),
        host_flavor(),
        *(resource_flavor(p) for p in pools),
        *(cluster_queue(config, p) for p in pools),
        *(local_queue(config, p) for p in pools),
    ]
