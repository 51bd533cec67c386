"""Kueue objects for the TPU pools whose jobs wait in a queue: a pool with `capacity: queued`
(GKE's Dynamic Workload Scheduler, DWS, provisions a whole slice when it can) or a capacity
ladder (reservation, spot, flex-start, queued, on-demand, tried in order).

Per such pool: a ResourceFlavor per rung (its node pools' labels and taints), a ClusterQueue whose
TPU flavors are the rungs in ladder order, each with the pool's chips (slices times chips per
slice) and TryNextFlavor, and a LocalQueue in the workload namespace that jobs name with the
`kueue.x-k8s.io/queue-name` label. Shared: a flavor for CPU, memory and disk, and, where a rung is
queued, one AdmissionCheck with its ProvisioningRequestConfig (`queued-provisioning.gke.io`) on
that rung's flavor only, so Kueue admits a job there once DWS has its nodes.

A stockout on a spot, on-demand or flex-start rung shows only as pods that never start: Kueue's
`waitForPodsReady` (in the chart's configuration, `manager_config`) evicts such a job after the
stack's timeout and requeues it, and its next admission starts again from the first rung, so it
moves back up to a freed reservation. Kueue 0.19.2 has no per-flavor fallback on a stockout
(KEP-2560 proposes one): it assigns the stocked-out rung again while that rung has quota, so the
rungs below it are reached by quota only (infra.rules.pools warns of such a ladder).
Shapes follow Kueue v0.19's provisioning sample and its chart's values.
"""

from __future__ import annotations

from typing import Any

import yaml

from infra import catalog
from infra.names import (
    KUEUE_NAMESPACE,
    NAMESPACE_NAME_LABEL,
    PART_OF,
    cluster_queue_name,
    flavor_name,
    local_queue_name,
)
from infra.plan import node_pools
from infra.plan.operator import HelmReleasePlan
from infra.resolve import PoolPlan, StackPlan
from infra.resolve.disk import DEFAULT_BOOT_DISK_GB
from infra.resolve.types import RungPlan

API_VERSION = "kueue.x-k8s.io/v1beta2"
CHART = "oci://registry.k8s.io/kueue/charts/kueue"
RELEASE_NAME = "kueue"
DWS_PROVISIONING_CLASS = "queued-provisioning.gke.io"
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
DWS_CHECK = "park-dws"
# GKE's label on the nodes DWS made for one ProvisioningRequest (xpk's podSetUpdates key).
PROVISIONING_REQUEST_LABEL = "autoscaling.gke.io/provisioning-request"
DWS_RETRY = {"backoffLimitCount": 3, "backoffBaseSeconds": 60, "backoffMaxSeconds": 1800}
# CPU, memory and disk of any pod (Ray head, submitter, TPU workers): no node labels, so a head
# keeps its own nodeSelector; the TPU flavor (labels + taints) applies only to pods asking for TPUs.
HOST_FLAVOR = "park-host"
HOST_RESOURCES = ("cpu", "memory", "ephemeral-storage")


def helm_release(plan: StackPlan) -> HelmReleasePlan | None:
    """Kueue's own chart at the pinned version (its CRDs come with it); None unless queued.
    Its default integrations include ray.io/rayjob; the ProvisioningRequest check is GA."""
    if not plan.kueue_pools:
        return None
    return HelmReleasePlan(
        name=RELEASE_NAME,
        chart=CHART,
        version=plan.spec.kueue.version,
        repo=None,
        namespace=KUEUE_NAMESPACE,
        values={
            "managerConfig": {
                "controllerManagerConfigYaml": yaml.safe_dump(manager_config(plan), sort_keys=False)
            }
        },
    )


def manager_config(plan: StackPlan) -> dict[str, Any]:
    """Kueue's Configuration: the chart's own (charts/kueue/values.yaml at v0.19.2, the
    frameworks cut to those park runs) with `waitForPodsReady`, so a job whose pods do not all
    start within the timeout (a stockout, a reservation that no longer fits) is evicted and
    requeued with backoff rather than holding its rung's quota for ever. Requeued without end:
    a ladder's job keeps trying until capacity comes."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "health": {"healthProbeBindAddress": ":8081"},
        "metrics": {"bindAddress": ":8443"},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True, "resourceName": "c1f6bfd2.kueue.x-k8s.io"},
        "controller": {
            "groupKindConcurrency": {
                "Job.batch": 5,
                "Pod": 5,
                "Workload.kueue.x-k8s.io": 5,
                "LocalQueue.kueue.x-k8s.io": 1,
                "ClusterQueue.kueue.x-k8s.io": 1,
                "ResourceFlavor.kueue.x-k8s.io": 1,
            }
        },
        "clientConnection": {"qps": 50, "burst": 100},
        "waitForPodsReady": {
            "timeout": f"{plan.spec.kueue.pods_ready_timeout_s}s",
            "blockAdmission": False,
            "requeuingStrategy": {
                "timestamp": "Eviction",
                "backoffBaseSeconds": 60,
                "backoffMaxSeconds": 1800,
            },
        },
        "integrations": {"frameworks": ["batch/job", "ray.io/rayjob"]},
    }


def _metadata(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(PART_OF)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def rung_flavor_name(pool: PoolPlan, rung: RungPlan) -> str:
    """One rung's flavor (a queued pool without a ladder keeps its pool-named flavor)."""
    return flavor_name(pool.name, rung.tag if pool.laddered else None)


def resource_flavor(pool: PoolPlan, rung: RungPlan | None = None) -> dict[str, Any]:
    """One rung's nodes (default: the first): Kueue adds these labels to admitted TPU pods
    (pinning them to this pool and rung, not another pool of the same shape) and admits only
    pods tolerating these taints. Both are the rung's node pools' own (infra.plan.node_pools)."""
    rung = rung or pool.rungs[0]
    labels = {**pool.slice.node_labels(), **node_pools.rung_node_labels(pool, rung)}
    taints = [
        {"key": t["key"], "value": t["value"], "effect": "NoSchedule"}
        for t in node_pools.rung_taints(pool, rung)
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": _metadata(rung_flavor_name(pool, rung)),
        "spec": {"nodeLabels": labels, "nodeTaints": taints},
    }


def host_flavor() -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": _metadata(HOST_FLAVOR),
        "spec": {},
    }


def quotas(pool: PoolPlan, disk_gb: int | None = None) -> dict[str, str]:
    """What the pool's nodes hold, all slices of all rungs up: TPU chips per rung, and the
    hosts' CPU, memory and disk
    (`disk_gb`: the boot disk the disk plan gives the pool, infra.resolve.disk). A Ray head and
    submitter fit in the share of a host the TPU worker leaves to system pods."""
    machine = catalog.MACHINE_TYPES[pool.slice.machine_type]
    hosts = pool.total_hosts * len(pool.rungs)  # a job may run on each rung at once
    disk_gb = disk_gb or pool.spec.disk_size_gb or DEFAULT_BOOT_DISK_GB
    return {
        catalog.TPU_RESOURCE: str(pool.total_chips),
        "cpu": str(machine.vcpus * hosts),
        "memory": f"{machine.memory_gib * hosts}Gi",
        "ephemeral-storage": f"{disk_gb * hosts}Gi",
    }


def cluster_queue(plan: StackPlan, pool: PoolPlan) -> dict[str, Any]:
    """Jobs from the workload namespace only. The TPU flavors are the ladder's rungs in order,
    each with the pool's chips: Kueue admits a job on the first rung with free quota and, with
    TryNextFlavor, goes on to the next rather than borrow or preempt on a full one. DWS's check
    runs only on the queued rung's flavor."""
    node = plan.disk.node(pool.name) if plan.disk else None
    quota = quotas(pool, node.boot_disk_gb if node else None)
    tpu_quota = [{"name": catalog.TPU_RESOURCE, "nominalQuota": str(pool.total_chips)}]
    spec: dict[str, Any] = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: plan.names.namespace}},
        "queueingStrategy": "BestEffortFIFO",
        "flavorFungibility": {"whenCanBorrow": "TryNextFlavor", "whenCanPreempt": "TryNextFlavor"},
        "resourceGroups": [
            {
                "coveredResources": [catalog.TPU_RESOURCE],
                "flavors": [
                    {"name": rung_flavor_name(pool, rung), "resources": tpu_quota}
                    for rung in pool.rungs
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
    }
    queued = [rung_flavor_name(pool, r) for r in pool.rungs if r.capacity == "queued"]
    if queued:
        spec["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": DWS_CHECK, "onFlavors": queued}]
        }
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": _metadata(cluster_queue_name(pool.name)),
        "spec": spec,
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
            # The admitted pods onto the very nodes DWS made for their request (GKE labels
            # them with the request's name; xpk pins them the same way).
            "podSetUpdates": {
                "nodeSelector": [
                    {
                        "key": PROVISIONING_REQUEST_LABEL,
                        "valueFromProvisioningClassDetail": "ResizeRequestName",
                    }
                ]
            },
            # Kueue's own defaults, stated: a failed or expired booking is asked for again 3
            # times, 60 s apart at first, doubling to at most 30 min; then the job is rejected.
            "retryStrategy": dict(DWS_RETRY),
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
    """Every Kueue object of the stack, cluster-scoped ones first; empty unless a pool is queued
    or laddered. DWS's check and its config only where a rung is queued."""
    pools = plan.kueue_pools
    if not pools:
        return []
    dws = [provisioning_request_config(), admission_check()] if plan.queued else []
    return [
        *dws,
        host_flavor(),
        *(resource_flavor(p, rung) for p in pools for rung in p.rungs),
        *(cluster_queue(plan, p) for p in pools),
        *(local_queue(plan, p) for p in pools),
    ]
