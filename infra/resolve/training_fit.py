"""What a training run holds on each chip, before it runs: the training memory model.

The trainer (workloads/train: hf.py, strategies.py, loss.py, loop.py) builds the Hugging Face
model in fp32 on meta and then, per strategy:

- FSDP2 (``fully_shard`` on each decoder block, then the root; ``MixedPrecisionPolicy(bf16
  params, fp32 reduce)``): fp32 master weights, fp32 gradients and AdamW's two fp32 moments,
  all sharded over the shard group (one slice: several slices are HSDP, replicated across
  them). During compute a block's parameters are all-gathered in bf16; the root (embeddings,
  final norm, head) stays gathered from its forward to the end of its backward (FSDP2 does not
  reshard the root after forward). Backward holds a block's bf16 gradients, then their fp32
  reduce-scatter input.
- DDP: fp32 weights, gradients and moments whole on every chip, DDP's gradient buckets (a flat
  fp32 copy of every gradient, ``gradient_as_bucket_view`` off), and autocast's bf16 copies of
  the matmul weights (cached for the forward, saved for backward); activations under autocast
  (the residual stream stays fp32).

Activations per micro-batch: each decoder layer's saved tensors
(:func:`layer_activation_bytes`, read with ``saved_tensors_hooks`` on transformers 5.19's
Llama, Qwen3 and Gemma 3 layers), or, with activation checkpointing (HF
``gradient_checkpointing_enable``, non-reentrant), each layer's input plus one layer
recomputed in backward. The loss (workloads/train/models/loss.py) holds fp32 logits for
``LOSS_CHUNK_TOKENS`` tokens at a time (``loss_chunk_tokens=None``: the whole micro-batch's
logits, the loop's former loss). The peak is the largest of five moments of a step: the end of
forward (the loss), the loss's backward, a block's backward, the root's backward, the
optimizer step; the fields of :class:`TrainingFit` are that moment's breakdown.

Proof: tests/infra/test_training_fit_torch.py holds ``estimate`` against
``torch.distributed._tools.mem_tracker.MemTracker`` / ``FSDPMemTracker`` running the trainer's
step on the real transformers classes under FakeTensorMode (fake process group), and a small
real CPU run; the bands are stated there.

The runtime reserve is a margin, not a measurement: XLA's compiled programs and their scratch,
collectives' staging buffers and allocator fragmentation are not visible to PyTorch's
accounting, and nothing here can profile a TPU before the run (vLLM, by contrast, measures its
own with a profile pass). ``RUNTIME_RESERVE_FRACTION`` of the usable HBM (about 2.5 GiB of a
v6e chip's 31.25 GiB) is kept free for them.

The shipped stacks, per chip, at the micro-batch that fits (``best_micro_batch``; v6e: 31.25
GiB usable), as :func:`describe` writes them (tests/infra/test_training_fit.py keeps these lines
current with the stack files; test_training_fit_torch.py runs both under the tracker at full
depth):

- dev (Qwen3-1.7B, FSDP2 on a 2x4, global batch 32, seq 2048, activation checkpointing):
  micro-batch 4 x 1 accumulation step(s): params 1.38, grads 0.58, AdamW 1.60, activations
  1.00, logits 1.74, reserve 2.50: 8.80 of 31.25 GiB (peak at the loss backward). Without
  checkpointing 4 sequences need about 33 GiB and 2 (x 2 steps) about 21 GiB.
- prod (Qwen3-8B, FSDP2 on a 4x4, global batch 64, seq 4096, activation checkpointing):
  micro-batch 4 x 1 accumulation step(s): params 4.58, grads 1.52, AdamW 3.81, activations
  9.41, logits 0.00, reserve 2.50: 21.82 of 31.25 GiB (peak at the block backward)

HSDP (several slices) is FSDP2 sharded over one slice: accumulating with the cross-slice
all-reduce held back keeps nothing beyond the sharded gradients (measured). Not modelled:
attention that materializes ``T x T`` scores (the math SDPA kernel: torch_tpu's flash kernel
comes first, workloads/train/distributed/strategies.py), ``torch.compile``'s buffers, MoE, Gemma 4's
per-layer inputs and shared KV layers (its layers are costed as Gemma 3's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra.model_facts import ModelFacts
from workloads.train.config import LOSS_CHUNK_TOKENS  # torch-free: infra may read it

GIB = 1024**3
RUNTIME_RESERVE_FRACTION = 0.08  # a margin (module docstring), not measured
STRATEGIES = ("ddp", "fsdp2")
FP32 = 4
# Architectures whose attention normalizes queries and keys per head (q_norm / k_norm): two
# more fp32 upcasts saved per layer.
QK_NORM_PREFIXES = ("Qwen3", "Gemma3", "Gemma4", "Olmo2")
# Gemma's decoder layer: four norms (before and after attention and MLP), each computed in
# fp32 throughout (transformers' Gemma3RMSNorm: x.float(), normalized, times 1 + weight). Its
# soft-capped head (tanh) adds nothing at the loss's peak (measured).
SANDWICH_NORM_PREFIXES = ("Gemma2", "Gemma3", "Gemma4")


@dataclass(frozen=True)
class TrainingFit:
    """One chip's share of a training step at one micro-batch, in bytes, at its peak."""

    strategy: str  # ddp or fsdp2 (fsdp2 across several slices is HSDP)
    world_size: int  # workers, one per chip
    shard_size: int  # chips one copy of the states is sharded over (1 under DDP)
    micro_batch: int  # sequences per chip per forward/backward
    accumulation_steps: int  # micro-batches per optimizer step
    seq_len: int
    activation_checkpointing: bool
    params_bytes: int  # master weights, plus the bf16 compute copies held at the peak
    grads_bytes: int  # gradients held at the peak (sharded, unsharded, reduce buffers)
    optimizer_bytes: int  # AdamW's moments (plus the step's temporaries at an optimizer peak)
    activations_bytes: int  # the micro-batch's saved activations (and backward's working set)
    logits_bytes: int  # the loss's fp32 logits, their log-softmax and gradient, one chunk
    reserve_bytes: int
    usable_bytes: int  # the chip's HBM as the runtime reports it
    phase: str = ""  # the moment of the step the peak is at (see PHASES)

    @property
    def states_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def peak_bytes(self) -> int:
        """What PyTorch's own accounting would see: the total without the reserve."""
        return self.states_bytes + self.activations_bytes + self.logits_bytes

    @property
    def total_bytes(self) -> int:
        return self.peak_bytes + self.reserve_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.usable_bytes

    def gib(self, value: int) -> float:
        return value / GIB


@dataclass(frozen=True)
class Shapes:
    """The sizes the model needs, from ModelFacts (per-block counts from the config's widths)."""

    params: int
    block: int  # parameters of one decoder block
    root: int  # embeddings, final norm and (untied) head: what FSDP2's root shards
    head: int  # the head's weight (vocab x hidden; the embedding's when tied)
    layers: int
    hidden: int
    q_width: int  # heads x head_dim
    kv_width: int
    intermediate: int
    vocab: int
    qk_norm: bool
    sandwich_norms: bool = False


def shapes(facts: ModelFacts) -> Shapes:
    h, layers, vocab = facts.hidden_size, facts.layers, facts.vocab_size
    q, kv = facts.attention_heads * facts.head_dim, facts.kv_heads * facts.head_dim
    qk_norm = facts.architecture.startswith(QK_NORM_PREFIXES)
    sandwich = facts.architecture.startswith(SANDWICH_NORM_PREFIXES)
    params = facts.params or 0
    head = vocab * h
    if facts.intermediate_size:
        inter = facts.intermediate_size
        block = h * (q + 2 * kv) + q * h + 3 * h * inter + (4 if sandwich else 2) * h
        block += 2 * facts.head_dim if qk_norm else 0
        params = params or layers * block + head + h
    else:  # no MLP width known: blocks share what the (tied) embedding leaves
        block = max(params - head, 0) // max(layers, 1)
        inter = max(block - h * (q + 2 * kv) - q * h, 0) // (3 * h)
    root = max(params - layers * block, head)
    return Shapes(params, block, root, head, layers, h, q, kv, inter, vocab, qk_norm, sandwich)


def layer_activation_bytes(s: Shapes, tokens: int, strategy: str, compute_bytes: int) -> int:
    """One decoder layer's saved tensors for ``tokens`` tokens (no checkpointing).

    Per token, FSDP2 (bf16 everywhere, RMSNorm upcasts to fp32): each of the two norms saves
    its fp32 input copy, the bf16 normalized value and its bf16 output (4h + 2c·h); q/k norms
    the same on q and k; attention saves q, k, v after RoPE, its output and the o_proj input
    copy; the gated MLP saves gate, act(gate), up and their product (4c·I). Under DDP's
    autocast the residual stream is fp32: a norm saves its fp32 input and fp32 normalized
    value, and every projection its own bf16 cast of the input (3 for q/k/v, 2 for gate/up).
    """
    c, h, q, kv = compute_bytes, s.hidden, s.q_width, s.kv_width
    # what one norm saves besides its output: fp32 input copy and normalized value (bf16, or
    # fp32 where the whole norm runs in fp32: Gemma's, or any norm under DDP's fp32 stream)
    gemma = s.sandwich_norms
    inner = FP32 + (FP32 if gemma else c)
    qk = inner * (q + kv) if s.qk_norm else 0
    attention = c * q + 2 * c * kv + qk + 2 * c * q
    mlp = 4 * c * s.intermediate
    if strategy == "ddp":
        # each projection casts the norm's fp32 output to bf16 itself: q, k, v; gate, up
        norms = 2 * (2 * FP32 * h) + 5 * c * h + (2 * 2 * FP32 * h if gemma else 0)
    else:
        norms = 2 * (inner + c) * h + (2 * inner * h if gemma else 0)
    return tokens * (norms + attention + mlp)


def layer_backward_bytes(s: Shapes, tokens: int, compute_bytes: int) -> int:
    """A layer's backward working set on top of its saved tensors, at its start (the MLP's):
    the incoming gradient of the residual stream and its copy, the gradients of gate and up
    (the product's is freed as they are made)."""
    c = compute_bytes
    return tokens * (2 * c * s.intermediate + 2 * c * s.hidden)


def logits_forward_bytes(vocab: int, tokens: int, chunk: int | None, c: int) -> int:
    """The loss's forward peak: a chunk's fp32 logits and their log-softmax (checkpointed: none
    kept); without chunks the bf16 logits stay for backward as well."""
    if chunk is None:
        return tokens * vocab * (c + 2 * FP32)
    return min(tokens, chunk) * vocab * 2 * FP32


def logits_backward_bytes(vocab: int, tokens: int, chunk: int | None, c: int) -> int:
    """The loss's backward peak: log-softmax's saved output, its incoming gradient and the
    gradient it computes, fp32 (plus the kept bf16 logits without chunks)."""
    if chunk is None:
        return tokens * vocab * (c + 3 * FP32)
    return min(tokens, chunk) * vocab * 3 * FP32


PHASES = ("loss forward", "loss backward", "block backward", "root backward", "optimizer step")


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
    loss_chunk_tokens: int | None = LOSS_CHUNK_TOKENS,
    optimizer_foreach: bool = True,
    reserve_fraction: float = RUNTIME_RESERVE_FRACTION,
) -> TrainingFit:
    """One chip's peak for a step of ``micro_batch`` sequences of ``seq_len`` tokens.

    ``loss_chunk_tokens``: the trainer's loss chunk (None: full logits). ``optimizer_foreach``:
    AdamW's multi-tensor path, the default on TPU and CUDA (one fp32 temporary the size of the
    local parameters during the step); CPU takes the per-tensor path."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: allowed {', '.join(STRATEGIES)}")
    s = shapes(facts)
    c = compute_bytes
    fsdp = strategy == "fsdp2"
    shard = max(shard_size, 1) if fsdp else 1
    tokens = micro_batch * seq_len
    local = -(-s.params // shard)  # this chip's share of every parameter
    master, moments, sharded_grads = FP32 * local, 2 * FP32 * local, FP32 * local
    held_grads = sharded_grads if accumulation_steps > 1 else 0  # between micro-batches
    chunks = 1 if loss_chunk_tokens is None else -(-tokens // loss_chunk_tokens)
    layer = layer_activation_bytes(s, tokens, strategy, c)
    residual = tokens * s.hidden * (c if fsdp else FP32)
    final = tokens * s.hidden * (FP32 + 2 * c)  # final norm's saves and the hidden it returns
    if activation_checkpointing:  # each layer's input, one layer recomputed in backward
        kept, recomputed = s.layers * residual + final, layer
    else:
        kept, recomputed = s.layers * layer + final, 0
    working = layer_backward_bytes(s, tokens, c)
    logits_fwd = logits_forward_bytes(s.vocab, tokens, loss_chunk_tokens, c)
    logits_bwd = logits_backward_bytes(s.vocab, tokens, loss_chunk_tokens, c)
    tied = s.root < s.head * 3 // 2
    # The head's gradient during the loss's backward: earlier chunks' (bf16: FSDP2's gathered
    # root, or the gradient of DDP's autocast copy, cast to fp32 once at the end).
    head_grad = c * s.head if chunks > 1 else 0
    if fsdp:
        compute = c * s.root  # the root, gathered from its forward to its backward's end
        blocks = c * s.block  # the block being computed, gathered
        block_grads = c * s.block  # its bf16 grads (reduce-scattered once its activations go)
        # the head's and the embedding's bf16 gradients (and their sum when tied) beside the
        # gathered root; then the root resharded and its fp32 reduce-scatter input beside
        # what is left of them
        root_moments = [
            (compute, (3 if tied else 2) * c * s.head),
            (0, (1 if tied else 2) * c * s.head + FP32 * s.root),
        ]
        cache = recast = buckets = 0
    else:
        compute = blocks = 0
        block_grads = FP32 * s.block
        # tied: the head's and the embedding's fp32 gradients before they are summed
        root_moments = [(0, 2 * FP32 * s.head if tied else 0)]
        # autocast's bf16 copies of the matmul weights: cached through the forward, and the
        # layers' saved for backward unless checkpointing recomputes them layer by layer; a
        # recomputed loss chunk casts the head again
        cache = c * (s.layers * s.block + s.head)
        recast = c * s.head if loss_chunk_tokens is not None else 0
        buckets = FP32 * s.params
    saved_weights = 0 if activation_checkpointing or fsdp else c * s.layers * s.block
    if not fsdp and activation_checkpointing:
        recomputed += c * s.block  # the recomputed layer's own bf16 weight copies
    phases = {
        "loss forward": (master + compute, held_grads + buckets, moments, kept + cache, logits_fwd),
        # the loss's backward: at a chunk's log-softmax backward; or where the chunk's head
        # gradient is added to the earlier chunks' (out of place: old, new and sum)
        "loss backward": max(
            [
                (
                    master + compute + recast,
                    held_grads + buckets + grad,
                    moments,
                    kept + saved_weights,
                    logits,
                )
                for grad, logits in ((head_grad, logits_bwd), (3 * head_grad, 0))
            ],
            key=sum,
        ),
        "block backward": (
            master + compute + blocks,
            held_grads + buckets + c * s.head + block_grads,
            moments,
            kept + recomputed + working + saved_weights,
            0,
        ),
        "root backward": max(
            [
                (master + held, sharded_grads + buckets + extra, moments, 0, 0)
                for held, extra in root_moments
            ],
            key=sum,
        ),
        "optimizer step": (
            master,
            sharded_grads + buckets,
            moments + (FP32 * local if optimizer_foreach else 2 * FP32 * _largest(s) // shard),
            0,
            0,
        ),
    }
    phase, peak = max(phases.items(), key=lambda item: sum(item[1]))
    step = (strategy, world_size, shard, micro_batch, accumulation_steps, seq_len)
    # TrainingFit's fields in order: the step, then the peak's parts (params ... logits)
    return TrainingFit(
        *step,
        activation_checkpointing,
        *peak,
        reserve_bytes=int(usable_bytes * reserve_fraction),
        usable_bytes=usable_bytes,
        phase=phase,
    )


def describe(fit: TrainingFit) -> str:
    """One line for a fit, in GiB (the module docstring's shipped-stack lines are these)."""

    def g(value: int) -> str:
        return f"{value / GIB:.2f}"

    return (
        f"micro-batch {fit.micro_batch} x {fit.accumulation_steps} accumulation step(s): "
        f"params {g(fit.params_bytes)}, grads {g(fit.grads_bytes)}, AdamW "
        f"{g(fit.optimizer_bytes)}, activations {g(fit.activations_bytes)}, logits "
        f"{g(fit.logits_bytes)}, reserve {g(fit.reserve_bytes)}: {g(fit.total_bytes)} of "
        f"{g(fit.usable_bytes)} GiB (peak at the {fit.phase})"
    )


def _largest(s: Shapes) -> int:
    """The largest single parameter (the per-tensor AdamW's temporaries are its size)."""
    return max(s.head, s.hidden * s.intermediate, s.hidden * s.q_width)


def _divisors_descending(n: int) -> list[int]:
    """The divisors of `n`, largest first, in O(sqrt n) steps (n is a chip's share of a batch
    of up to 2^20 sequences: never a walk over every number below it)."""
    small = [d for d in range(1, math.isqrt(max(n, 1)) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)}, reverse=True)


def best_micro_batch(
    facts: ModelFacts,
    *,
    per_chip_batch: int,
    pinned: int | None = None,
    **kwargs: object,
) -> TrainingFit:
    """The largest micro-batch dividing the chip's share of the global batch that fits (or the
    pinned one); the smallest tried when none fits, so the caller can say by how much."""
    candidates = [pinned] if pinned else _divisors_descending(per_chip_batch)
    fit = None
    for micro in candidates:
        fit = estimate(
            facts,
            micro_batch=micro,
            accumulation_steps=max(per_chip_batch // micro, 1),
            **kwargs,  # type: ignore[arg-type]
        )
        if fit.fits:
            return fit
    assert fit is not None
    return fit
