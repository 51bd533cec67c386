"""One optimizer step's forward and backward passes: the worker's share of the global batch in
micro-batches, gradients accumulated over them, the loss normalized as for one big batch.

The batch source still yields one batch per worker per step (so its state, which checkpoints
keep, still counts steps); the step splits it into ``--micro-batch-size`` rows at a time.
Every micro-batch's summed loss is divided by the target count of the whole global batch
(every micro-batch of every rank), counted before any backward, so the accumulated gradient is
the gradient of the global mean, exactly as one pass over the whole batch would give it.

Gradient communication per strategy:

- DDP: ``no_sync()`` for all but the last micro-batch; gradients add up locally and the last
  backward all-reduces the sum.
- FSDP2: gradients are reduce-scattered after every micro-batch and add up in the sharded
  fp32 gradients. ``set_requires_gradient_sync(False)`` would save those reduce-scatters, but
  FSDP2 then keeps every parameter's *unsharded* gradient in the reduce dtype (fp32) until the
  last micro-batch (torch 2.13 ``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``
  ``to_accumulated_grad_if_needed``/``accumulate_unsharded_grad_if_needed``, lines 802-821):
  4 bytes per parameter of the whole model on every chip (32 GB for an 8B model), which is
  what sharding is for not to hold.
- HSDP (several slices): as FSDP2 within a slice; the cross-slice all-reduce runs on the last
  micro-batch only (``set_requires_all_reduce(False)`` before; FSDP2 keeps the partial sums in
  one sharded fp32 buffer, ``_fsdp_collectives.py:634-651``). On a 1-D mesh it is a no-op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.nn.parallel import DistributedDataParallel

from workloads.train.inputs.batches import IGNORE, Batch
from workloads.train.models.modeling import TrainModel


def micro_batches(batch: Batch, size: int) -> list[Batch]:
    """``batch`` in consecutive slices of ``size`` rows (the config checks that it divides)."""
    rows = batch.input_ids.shape[0]
    if size <= 0 or rows % size:
        raise ValueError(f"a micro-batch of {size} does not divide a batch of {rows} rows")
    if size == rows:
        return [batch]
    parts = []
    for start in range(0, rows, size):
        labels = batch.labels[start : start + size]
        positions = batch.position_ids
        parts.append(
            Batch(
                input_ids=batch.input_ids[start : start + size],
                labels=labels,
                position_ids=None if positions is None else positions[start : start + size],
                n_targets=int((labels != IGNORE).sum()),
            )
        )
    return parts


@contextlib.contextmanager
def gradient_sync(module: nn.Module, sync: bool) -> Iterator[None]:
    """Whether the backward run inside communicates gradients (see the module docstring)."""
    if sync:
        yield
    elif isinstance(module, DistributedDataParallel):
        with module.no_sync():
            yield
    elif isinstance(module, FSDPModule):
        module.set_requires_all_reduce(False)
        try:
            yield
        finally:
            module.set_requires_all_reduce(True)
    else:
        yield


def global_targets(
    n_targets: int, world_size: int, device: torch.device, vary: bool
) -> torch.Tensor | float:
    """Targets in the global batch: this rank's count times the world, or their all-reduced
    sum where counts differ between ranks (SFT masks, padding)."""
    if not vary:
        return float(max(n_targets * world_size, 1))
    count = torch.tensor(float(n_targets), device=device)
    if world_size > 1:
        dist.all_reduce(count)
    return count.clamp_min(1.0)


def forward_backward(
    model: TrainModel,
    batch: Batch,
    *,
    micro_batch: int,
    world_size: int,
    device: torch.device,
    counts_vary: bool,
    amp: contextlib.AbstractContextManager[None],
) -> torch.Tensor:
    """Accumulate this rank's gradients for one optimizer step; returns the step's loss share
    (detached; its mean over ranks is the global batch's mean loss)."""
    total = global_targets(batch.n_targets, world_size, device, counts_vary)
    parts = micro_batches(batch, micro_batch)
    step_loss = torch.zeros((), device=device)
    for index, part in enumerate(parts):
        inputs = part.input_ids.to(device, non_blocking=True)
        labels = part.labels.to(device, non_blocking=True)
        positions = (
            part.position_ids.to(device, non_blocking=True)
            if part.position_ids is not None
            else None
        )
        with gradient_sync(model.module, index == len(parts) - 1):
            with amp:
                summed = model.loss(inputs, labels, positions)
            # Gradients are averaged over ranks, so the rank's share is scaled by the world.
            loss = summed * world_size / total
            loss.backward()
        step_loss += loss.detach()
    return step_loss
