"""GKE node pools as plain argument dicts (snake_case, the shape pulumi-gcp's NodePool takes).

One node pool per TPU slice: a multi-host slice is atomic (0 or all hosts), so each slice scales
on its own, between 0 nodes while idle and exactly its hosts. `placement_policy` only on
multi-host pools (GKE rejects a topology on a single-host pool), as the generation places them:
COMPACT beside `tpu_topology` (v6e), or a workload policy (TPU7x): a regional compute
ResourcePolicy {HIGH_THROUGHPUT, accelerator_topology} the pool names, with `type` "" (pulumi-gcp
requires the field; GKE refuses COMPACT beside a workload policy and never returns a type, so ""
is what the provider reads back: no diff) and `tpu_topology` equal to the policy's (GKE stores
the topology it derives from the policy; the provider's field is Optional, not Computed, so
leaving it out would diff against what it reads back; Google's cluster-toolkit sends it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal

from infra import catalog
from infra.names import (
    GPU_TAINT_KEY,
    POOL_LABEL,
    QUEUED_TAINT_KEY,
    ROLE_LABEL,
    RUNG_LABEL,
    SLICE_LABEL,
)
from infra.resolve import PoolPlan, StackPlan, disk
from infra.resolve.types import RungPlan
from infra.schema.models import CpuPoolConfig, GpuPoolConfig

CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"


@dataclass(frozen=True)
class NodePoolPlan:
    """One GKE node pool: its name, what it is for, and the NodePool arguments."""

    name: str
    kind: Literal["cpu", "tpu", "gpu"]
    pool: str  # the config pool it belongs to
    args: dict[str, Any]  # NodePool arguments, except cluster / service account
    hosts: int = 0  # TPU: nodes of one slice
    chips: int = 0  # TPU: chips of one slice
    slice_index: int = 0
    taints: list[dict[str, str]] = field(default_factory=list)
    # TPU7x multi-host: the ResourcePolicy arguments (but its name) the pool's placement_policy
    # names; its component makes one per pool (region, topology) and fills in policy_name.
    workload_policy: dict[str, Any] | None = None
    # A laddered pool's rung (its tag) this node pool stands for; None without a ladder.
    rung: str | None = None


def workload_policy_name(cluster: str, pool: str, topology: str) -> str:
    """A workload policy's name, unique per (project, region): the cluster's, the pool's and the
    topology's names, RFC 1035 and at most 63 characters (longer ones end in a short hash)."""
    name = f"{cluster.rsplit('/', 1)[-1]}-{pool}-{topology}"
    if len(name) <= 63:
        return name
    return f"{name[:54].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _taint(key: str, value: str) -> dict[str, str]:
    return {"key": key, "value": value, "effect": "NO_SCHEDULE"}


# TPU capacity that must never take a reservation's chips: left unset, GKE's affinity is
# ANY_RESERVATION, so a spot or on-demand slice would consume a matching reservation meant for
# another pool (GKE's TPU samples state NO_RESERVATION). flex-start and queued set it already.
UNRESERVED_CAPACITY = ("spot", "on-demand")


def _capacity_args(capacity: str, reservation: str | None) -> dict[str, Any]:
    """node_config fields for a capacity type (GKE's preconditions, see FACTS.md). Queued
    provisioning is flex-start capacity handed out through ProvisioningRequests: GKE's docs
    create such pools with both --flex-start and --enable-queued-provisioning."""
    if capacity == "spot":
        return {"spot": True}
    if capacity == "reservation":
        return {
            "reservation_affinity": {
                "consume_reservation_type": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name",
                "values": [reservation],
            }
        }
    if capacity in ("flex-start", "queued"):
        return {
            "flex_start": True,
            "reservation_affinity": {"consume_reservation_type": "NO_RESERVATION"},
        }
    return {}


def _node_config(
    machine_type: str,
    labels: dict[str, str],
    taints: list[dict[str, str]],
    disk_size_gb: int,
    disk_type: str | None = None,
) -> dict[str, Any]:
    return {
        "machine_type": machine_type,
        "labels": labels,
        "taints": taints,
        "disk_size_gb": disk_size_gb,
        **({"disk_type": disk_type} if disk_type else {}),
        "oauth_scopes": [CLOUD_PLATFORM_SCOPE],
        "workload_metadata_config": {"mode": "GKE_METADATA"},
        "shielded_instance_config": {
            "enable_secure_boot": True,
            "enable_integrity_monitoring": True,
        },
    }


def cpu_pool(cpu: CpuPoolConfig, zone: str, disk_gb: int | None = None) -> NodePoolPlan:
    """The pool for the Ray heads and system pods. `disk_gb`: the boot disk the disk plan
    derived (infra.resolve.disk), else the stack's, else GKE's default."""
    disk_gb = disk_gb or cpu.disk_size_gb or disk.DEFAULT_BOOT_DISK_GB
    labels = {ROLE_LABEL: "system"}
    return NodePoolPlan(
        name="cpu",
        kind="cpu",
        pool="cpu",
        args={
            "location": zone,
            "initial_node_count": max(cpu.min_nodes, 1),
            "autoscaling": {"min_node_count": cpu.min_nodes, "max_node_count": cpu.max_nodes},
            "management": {"auto_repair": True, "auto_upgrade": True},
            "node_config": _node_config(cpu.machine_type, labels, [], disk_gb),
        },
    )


def rung_taints(pool: PoolPlan, rung: RungPlan) -> list[dict[str, str]]:
    """The TPU taint, and the rung's own: GKE's on queued nodes (it adds it itself), park's on
    each rung of a ladder, so only a job Kueue admitted on that rung lands there."""
    taints = [_taint(catalog.TPU_TAINT_KEY, catalog.TPU_TAINT_VALUE)]
    if rung.capacity == "queued":
        taints.append(_taint(QUEUED_TAINT_KEY, "true"))
    elif pool.laddered:
        taints.append(_taint(RUNG_LABEL, rung.tag))
    return taints


def rung_node_labels(pool: PoolPlan, rung: RungPlan) -> dict[str, str]:
    """What the rung's nodes carry beside the slice's: the pool, and the rung on a ladder
    (Kueue's flavor for the rung selects on exactly these)."""
    labels = {POOL_LABEL: pool.name, ROLE_LABEL: "tpu"}
    if pool.laddered:
        labels[RUNG_LABEL] = rung.tag
    return labels


def tpu_slice_pools(plan: PoolPlan, zone: str, disk_gb: int | None = None) -> list[NodePoolPlan]:
    """One node pool per rung and slice of a config pool (`<pool>-s<i>`, `<pool>-<rung>-s<i>`
    on a ladder); `disk_gb` as for cpu_pool."""
    return [
        _slice_pool(plan, rung, index, zone, disk_gb)
        for rung in plan.rungs
        for index in range(plan.slices)
    ]


def _slice_pool(
    plan: PoolPlan, rung: RungPlan, index: int, zone: str, disk_gb: int | None
) -> NodePoolPlan:
    pool, tpu = plan.spec, plan.slice
    disk_gb = disk_gb or pool.disk_size_gb or disk.DEFAULT_BOOT_DISK_GB
    taints = rung_taints(plan, rung)
    labels = {**rung_node_labels(plan, rung), SLICE_LABEL: str(index)}
    node_config = {
        **_node_config(pool.machine_type, labels, taints, disk_gb, tpu.generation.boot_disk_type),
        **_capacity_args(rung.capacity, rung.reservation),
    }
    if rung.capacity in UNRESERVED_CAPACITY:
        node_config["reservation_affinity"] = {"consume_reservation_type": "NO_RESERVATION"}
    if rung.max_run_duration:
        node_config["max_run_duration"] = rung.max_run_duration
    args: dict[str, Any] = {
        "location": zone,
        "node_locations": [zone],
        "node_config": node_config,
        # flex-start and queued nodes must not be repaired into fresh capacity requests
        "management": {"auto_repair": not rung.nodes_expire, "auto_upgrade": True},
    }
    if pool.autoscaling:
        # per-zone bounds: GKE checks max against the slice size
        args["initial_node_count"] = 0
        args["autoscaling"] = {"min_node_count": 0, "max_node_count": tpu.hosts}
        if rung.capacity == "queued":
            args["autoscaling"]["location_policy"] = "ANY"
    else:
        args["node_count"] = tpu.hosts
    workload_policy = None
    if tpu.workload_policy:
        args["placement_policy"] = {"type": "", "tpu_topology": tpu.topology}
        workload_policy = {
            "region": zone.rsplit("-", 1)[0],
            "workload_policy": {"type": "HIGH_THROUGHPUT", "accelerator_topology": tpu.topology},
        }
    elif tpu.multi_host:
        args["placement_policy"] = {"type": "COMPACT", "tpu_topology": tpu.topology}
    if rung.capacity == "queued":
        args["queued_provisioning"] = {"enabled": True}
    rung_part = f"-{rung.tag}" if plan.laddered else ""
    return NodePoolPlan(
        name=f"{pool.name}{rung_part}-s{index}",
        kind="tpu",
        pool=pool.name,
        args=args,
        hosts=tpu.hosts,
        chips=tpu.chips,
        slice_index=index,
        taints=taints,
        workload_policy=workload_policy,
        rung=rung.tag if plan.laddered else None,
    )


def gpu_pool(pool: GpuPoolConfig, zone: str) -> NodePoolPlan:
    """A GPU pool beside the TPU pools, on the same control plane; scales to 0 while idle."""
    labels = {POOL_LABEL: pool.name, ROLE_LABEL: "gpu"}
    taints = [_taint(GPU_TAINT_KEY, "present")]
    node_config = {
        **_node_config(pool.machine_type, labels, taints, pool.disk_size_gb),
        **_capacity_args(pool.capacity, pool.reservation),
        "guest_accelerators": [
            {
                "type": pool.accelerator_type,
                "count": pool.accelerator_count,
                "gpu_driver_installation_config": {"gpu_driver_version": "LATEST"},
            }
        ],
    }
    args: dict[str, Any] = {
        "location": zone,
        "node_locations": [zone],
        "node_config": node_config,
        "management": {"auto_repair": pool.capacity != "flex-start", "auto_upgrade": True},
    }
    if pool.autoscaling:
        args["initial_node_count"] = 0
        args["autoscaling"] = {"min_node_count": 0, "max_node_count": pool.nodes}
    else:
        args["node_count"] = pool.nodes
    return NodePoolPlan(name=pool.name, kind="gpu", pool=pool.name, args=args, taints=taints)


def boot_disk_gb(plan: StackPlan, pool: str) -> int | None:
    """The boot disk of a pool ("cpu" for the CPU pool) as the disk plan sizes it."""
    node = plan.disk.node(pool) if plan.disk else None
    return node.boot_disk_gb if node else None


def all_node_pools(plan: StackPlan) -> list[NodePoolPlan]:
    zone = plan.spec.zone
    pools = [cpu_pool(plan.spec.cpu_pool, zone, boot_disk_gb(plan, "cpu"))]
    for tpu_pool in plan.tpu_pools:
        pools += tpu_slice_pools(tpu_pool, zone, boot_disk_gb(plan, tpu_pool.name))
    pools += [gpu_pool(g.spec, zone) for g in plan.gpu_pools]
    return pools
