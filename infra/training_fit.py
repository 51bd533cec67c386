"""What a training run holds on each chip, before it runs: the training memory model.

FIRST CUT (skeleton): the API below is the contract between the resolve step, the rules, the
reports and the tests; the formulas are refined and proven against PyTorch's own accounting
(`torch.distributed._tools.mem_tracker.MemTracker` under FakeTensorMode) in
tests/infra/test_training_fit_torch.py.

The trainer (workloads/train) keeps, per parameter: an fp32 master weight, an fp32 gradient and
AdamW's two fp32 moments (16 bytes), sharded over the FSDP2 shard group (a slice: HSDP
replicates across slices) or whole on every chip under DDP. Each micro-batch's forward holds
its activations (every layer's, or one block's inputs with activation checkpointing), and the
loss holds fp32 logits for one chunk of tokens at a time (workloads/train/config.py
LOSS_CHUNK_TOKENS). The runtime keeps a reserve of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.model_facts import ModelFacts

GIB = 1024**3
STATE_BYTES_PER_PARAM = 16  # fp32 master weight + fp32 gradient + AdamW exp_avg, exp_avg_sq
RUNTIME_RESERVE_FRACTION = 0.05  # compiled programs, collectives' buffers, fragmentation
STRATEGIES = ("ddp", "fsdp2")


@dataclass(frozen=True)
class TrainingFit:
    """One chip's share of a training step at one micro-batch, in bytes."""

    strategy: str  # ddp or fsdp2 (fsdp2 across several slices is HSDP)
    world_size: int  # workers, one per chip
    shard_size: int  # chips one copy of the states is sharded over (1 under DDP)
    micro_batch: int  # sequences per chip per forward/backward
    accumulation_steps: int  # micro-batches per optimizer step
    seq_len: int
    activation_checkpointing: bool
    params_bytes: int  # master weights, plus the unsharded compute copy FSDP2 gathers
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int  # one micro-batch's saved activations at their peak
    logits_bytes: int  # the loss's fp32 logits and their gradient for one chunk
    reserve_bytes: int
    usable_bytes: int  # the chip's HBM as the runtime reports it

    @property
    def states_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        return self.states_bytes + self.activations_bytes + self.logits_bytes + self.reserve_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    def gib(self, value: int) -> float:
        return value / GIB


def estimate(
    facts: ModelFacts,
    *,
    strategy: str,
    world_size: int,
    shard_size: int,
    micro_batch: int,
    accumulation_steps: int,
    seq_len: int,
    activation_checkpointing: bool,
    usable_bytes: int,
    compute_bytes: int = 2,
    loss_chunk_tokens: int | None = None,
) -> TrainingFit:
    """One chip's peak for a step of `micro_batch` sequences of `seq_len` tokens."""
    params = facts.params or 0
    shard = shard_size if strategy == "fsdp2" else 1
    states = params * STATE_BYTES_PER_PARAM // shard
    per_layer = facts.hidden_size * 2 * params // max(params, 1)  # placeholder, refined later
    tokens = micro_batch * seq_len
    layer_act = tokens * facts.hidden_size * compute_bytes * (2 if activation_checkpointing else 16)
    activations = layer_act * facts.layers + per_layer
    chunk = min(tokens, loss_chunk_tokens or tokens)
    logits = chunk * facts.vocab_size * 4 * 2
    reserve = int(usable_bytes * RUNTIME_RESERVE_FRACTION)
    return TrainingFit(
        strategy=strategy,
        world_size=world_size,
        shard_size=shard,
        micro_batch=micro_batch,
        accumulation_steps=accumulation_steps,
        seq_len=seq_len,
        activation_checkpointing=activation_checkpointing,
        params_bytes=params * 4 // shard,
        grads_bytes=params * 4 // shard,
        optimizer_bytes=states - 2 * (params * 4 // shard),
        activations_bytes=activations,
        logits_bytes=logits,
        reserve_bytes=reserve,
        usable_bytes=usable_bytes,
    )


def best_micro_batch(
    facts: ModelFacts,
    *,
    per_chip_batch: int,
    pinned: int | None = None,
    **kwargs: object,
) -> TrainingFit:
    """The largest micro-batch dividing the chip's share of the global batch that fits (or the
    pinned one); the smallest tried when none fits, so the caller can say by how much."""
    candidates = [pinned] if pinned else [
        m for m in range(per_chip_batch, 0, -1) if per_chip_batch % m == 0
    ]
    fit = None
    for micro in candidates:
        fit = estimate(
            facts,
            micro_batch=micro,
            accumulation_steps=per_chip_batch // micro,
            **kwargs,  # type: ignore[arg-type]
        )
        if fit.fits:
            return fit
    assert fit is not None
    return fit
