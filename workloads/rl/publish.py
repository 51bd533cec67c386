"""Publishing the learner's weights to the engines' side: a bf16 Hugging Face folder
(:func:`write_folder`) or bf16 buckets in Ray's object store (:func:`publish_buckets`), recorded
in the run's PolicyStore (workloads/rl/sync.py). Every learner rank calls them (the exporter and
the gathers are collectives); rank 0 publishes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from workloads.rl.sync import (
    SYNC_BUCKET_BYTES,
    SYNC_DTYPE_NAME,
    PolicyVersion,
    WeightBucket,
    folder_bytes,
    version_folder,
)
from workloads.train import storage
from workloads.train.outputs.export import export_model, owned_tensors

if TYPE_CHECKING:
    from workloads.train.models.modeling import TrainModel

SYNC_DTYPE = getattr(torch, SYNC_DTYPE_NAME)


def _rank_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _call(store: Any, method: str, *args: Any) -> Any:
    """A PolicyStore method, on the object or through a Ray actor handle of one."""
    fn = getattr(store, method)
    remote = getattr(fn, "remote", None)
    if remote is None:
        return fn(*args)
    import ray

    return ray.get(remote(*args))


class PublishingLearner(Protocol):
    """What publishing reads of the learner (workloads/rl/learner.py GRPOLearner): its model
    and the policy version it publishes. A Protocol, so that this module does not import the
    learner that imports it."""

    model: TrainModel
    version: int


@dataclass(frozen=True)
class Published:
    """A publication as the learner saw it: the version, its bytes, the seconds it took."""

    policy: PolicyVersion | None  # rank 0's view; None on other ranks
    nbytes: int
    seconds: float


def write_folder(
    learner: PublishingLearner,
    root: str,
    store: Any,
    *,
    keep: int = 2,
    protect: int | None = None,
    group: Any = None,
) -> Published:
    """Write the learner's weights as a bf16 Hugging Face folder, version ``learner.version``
    under ``root`` (every rank calls this: the exporter gathers shard by shard), and record it
    in ``store`` (rank 0). Rank 0 then deletes the version ``keep`` publications back (an engine
    may still be reading the ones in between), except ``protect``: the run's start folder, the
    one engines are started and restarted from."""
    source = learner.model.source
    if source is None:
        raise ValueError("only a Hugging Face model can be published to vLLM engines")
    started = time.perf_counter()
    path = version_folder(root, learner.version)
    export_model(
        learner.model.inner,
        path,
        source=source,
        dtype=SYNC_DTYPE,
        max_shard_bytes=2 * 1024**3,
        metadata={"policy_version": learner.version, "source": source.spec},
        group=group,
    )
    rank, _ = _rank_world()
    policy = None
    nbytes = 0
    if rank == 0:
        nbytes = folder_bytes(path) if storage.local_path(path) is not None else 0
        policy = _call(store, "publish", learner.version, path, (), nbytes)
        old = learner.version - keep
        if keep > 0 and old >= 0 and old != protect:
            storage.remove_folder(version_folder(root, old))
    return Published(policy, nbytes, time.perf_counter() - started)


def publish_buckets(
    learner: PublishingLearner,
    store: Any,
    *,
    group: Any = None,
    bucket_bytes: int = SYNC_BUCKET_BYTES,
) -> Published:
    """Put the learner's weights into Ray's object store as bf16 buckets of about
    ``bucket_bytes`` (safetensors bytes, in the model's order) and publish them as version
    ``learner.version`` (every rank calls this). Each tensor is gathered once
    (``DTensor.full_tensor``, a collective of every rank); bucket ``i`` is kept, packed and put by
    the ``i``-th of the ranks that are Ray workers (round robin), which offers its object
    references to ``store`` (a Ray actor handle on those ranks, None elsewhere); rank 0
    publishes once every rank has offered. Nothing holds more than a bucket and a tensor."""
    import numpy as np
    from safetensors.torch import save as safetensors_bytes
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from workloads.train.models import hf
    from workloads.train.outputs.export import plan_shards

    started = time.perf_counter()
    rank, world = _rank_world()
    model = learner.model.inner
    owners = _ray_ranks(group)
    tied = hf.tied_export_keys(model)
    state = {
        key: value
        for key, value in get_model_state_dict(model).items()
        if isinstance(value, torch.Tensor) and key not in tied
    }
    itemsize = torch.empty((), dtype=SYNC_DTYPE).element_size()
    plan = plan_shards([(k, int(t.numel()) * itemsize) for k, t in state.items()], bucket_bytes)
    mine: list[WeightBucket] = []
    for index, keys in enumerate(plan):
        owner = owners[index % len(owners)]
        tensors = owned_tensors(state, keys, rank, owner, SYNC_DTYPE)
        if rank == owner:
            import ray

            data = np.frombuffer(safetensors_bytes(tensors), dtype=np.uint8)
            mine.append(WeightBucket(index, ray.put(data), int(data.nbytes)))
            del tensors, data
    if mine:
        _call(store, "offer", learner.version, mine)
    if dist.is_initialized() and world > 1:
        dist.barrier(group=group)
    policy = None
    if rank == 0:
        policy = _call(store, "publish_offered", learner.version, len(plan))
    nbytes = policy.nbytes if policy is not None else sum(b.nbytes for b in mine)
    return Published(policy, nbytes, time.perf_counter() - started)


def _ray_ranks(group: Any) -> list[int]:
    """The ranks that are Ray workers (every rank under Ray Train; rank 0 in a bare test)."""
    import ray

    mine = ray.is_initialized()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [0]
    flags: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(flags, mine, group=group)
    ranks = [r for r, flag in enumerate(flags) if flag]
    if not ranks:
        raise RuntimeError("no learner rank is a Ray worker: nothing can put the weights")
    return ranks
