"""The stack's disk plan built from its resolved pieces: each workload's pods (the disk model,
infra/resolve/disk.py), each pool's boot disk against the pods one of its nodes may run, the
host memory of the TPU pods, the hub models staged into the bucket; and the problems of a boot
disk the stack pinned too small.

Pure: no torch, no Pulumi; `build(...)` runs at the end of infra.resolve.resolve.
"""

from __future__ import annotations

from infra import catalog, model_facts, names
from infra.resolve.disk import (
    GIB,
    DiskPlan,
    NodeDisk,
    PodDisk,
    StagedModel,
    boot_disk_needed_gb,
    gke_allocatable_bytes,
    head_pod,
    needs_staging,
    rl_pods,
    serving_pod,
    staged_path,
    staged_uri,
    submitter_pod,
    training_pod,
)
from infra.resolve.host_memory import HostMemory, serving_memory, training_memory
from infra.resolve.types import PoolPlan, RlPlan, ServingPlan, TrainingPlan
from infra.schema.models import StackConfig

# ---- nodes ----------------------------------------------------------------------------------


def _tpu_node(pool: PoolPlan, pods: list[PodDisk]) -> NodeDisk:
    on_pool = [p.pod_bytes for p in pods if p.pool == pool.name]
    pods_bytes = max(on_pool, default=0)  # one Ray pod per TPU host: it takes every chip
    needed = boot_disk_needed_gb(pods_bytes)
    pinned = pool.spec.disk_size_gb is not None
    machine = catalog.MACHINE_TYPES.get(pool.spec.machine_type)
    return NodeDisk(
        key=f"{pool.key}.diskSizeGb",
        pool=pool.name,
        machine_type=pool.spec.machine_type,
        boot_disk_gb=pool.spec.disk_size_gb if pool.spec.disk_size_gb is not None else needed,
        needed_gb=needed,
        pinned=pinned,
        pods_bytes=pods_bytes,
        local_ssd_gib=machine.local_ssd_gib if machine else None,
    )


def _cpu_node(spec: StackConfig, pods: list[PodDisk]) -> NodeDisk:
    # Heads and the submitter may all land on one CPU node.
    pods_bytes = sum(p.pod_bytes for p in pods if p.pool == "cpu")
    needed = boot_disk_needed_gb(pods_bytes)
    cpu = spec.cpu_pool
    return NodeDisk(
        key="park:cpuPool.diskSizeGb",
        pool="cpu",
        machine_type=cpu.machine_type,
        boot_disk_gb=cpu.disk_size_gb if cpu.disk_size_gb is not None else needed,
        needed_gb=needed,
        pinned=cpu.disk_size_gb is not None,
        pods_bytes=pods_bytes,
        local_ssd_gib=None,
    )


def _staged(
    bucket: str,
    mount: str,
    training: TrainingPlan | None,
    serving: ServingPlan | None,
    rl: RlPlan | None,
) -> tuple[StagedModel, ...]:
    found: dict[str, tuple[list[str], int | None]] = {}
    # staged: trainer_model_source gave the run the copy in the bucket
    if training is not None and training.spec.model and training.model_path != training.spec.model:
        weights = model_facts.weights_bytes(training.facts.facts)
        found[training.spec.model] = (["park:training.model"], weights)
    if rl is not None and rl.model_path != rl.spec.model:
        keys, _ = found.setdefault(rl.spec.model, ([], model_facts.weights_bytes(rl.facts.facts)))
        keys.append("park:rl.model")
    if serving is not None:
        for m in serving.models:
            if needs_staging(m.source):
                assert m.source is not None
                keys, _ = found.setdefault(m.source, ([], model_facts.weights_bytes(m.facts.facts)))
                keys.append(f"{m.key}.source")
    return tuple(
        StagedModel(
            repo=repo,
            uri=staged_uri(bucket, repo),
            path=staged_path(mount, repo),
            weights_bytes=weights,
            used_by=tuple(keys),
        )
        for repo, (keys, weights) in found.items()
    )


def build(
    spec: StackConfig,
    stack_names: names.StackNames,
    tpu_pools: tuple[PoolPlan, ...],
    training: TrainingPlan | None,
    serving: ServingPlan | None,
    rl: RlPlan | None,
) -> DiskPlan:
    """The disk plan of a resolved stack's pieces (pools the catalog does not know are left
    out)."""
    pods: list[PodDisk] = []
    memory: list[HostMemory] = []
    if training is not None:
        pods += [training_pod(training), head_pod("training-head"), submitter_pod()]
        memory.append(training_memory(training))
    if serving is not None:
        pods += [serving_pod(serving, stack_names.bucket), head_pod("serving-head")]
        memory.append(serving_memory(serving))
    if rl is not None:
        pods += rl_pods(rl)
    nodes = [_cpu_node(spec, pods)] + [_tpu_node(pool, pods) for pool in tpu_pools]
    staged = _staged(stack_names.bucket, spec.storage.mount_path, training, serving, rl)
    return DiskPlan(tuple(pods), tuple(nodes), tuple(memory), staged)


def problems(disk: DiskPlan | None) -> list[tuple[str, int, str]]:
    """(key, value, message) for each boot disk the stack pinned below what its pods need."""
    if disk is None:
        return []
    found = []
    for node in disk.nodes:
        if node.pinned and not node.fits:
            found.append(
                (
                    node.key,
                    node.boot_disk_gb,
                    f"{node.pool}'s nodes need a boot disk of at least {node.needed_gb} GB: its "
                    f"Ray pod's ephemeral storage ({node.pods_bytes / GIB:.0f} GiB, `park "
                    f"validate` lists it) plus images and system pods, within what GKE leaves "
                    f"allocatable ({gke_allocatable_bytes(node.boot_disk_gb) / GIB:.0f} GiB of "
                    f"{node.boot_disk_gb} GB); raise it, or leave it unset for the derived size",
                )
            )
    return found
