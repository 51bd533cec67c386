"""The GRPO learner: the trainer's model (DDP or FSDP2, any device), the sampled tokens'
log-probabilities under it, the GRPO loss, one optimizer step, and the weights published.

Everything about the model is the trainer's (workloads.train.models.modeling.build: the Hugging
Face loading, meta-device build, FSDP2 sharding or DDP, the TPU bridge), so a model that fine-tunes
there is a model RL updates here. What differs is the head: the trainer's forward returns a
summed cross-entropy, RL needs each sampled token's log-probability (with gradient) under the
sampling temperature. :func:`install_logprob_forward` gives the model a forward that returns
them, computed like the trainer's loss (workloads/train/models/loss.py): the head and the fp32
log-softmax on ``LOSS_CHUNK_TOKENS`` tokens at a time under non-reentrant checkpointing, so
full-vocabulary logits never exist for the whole batch, and inside the wrapped module's
forward, so DDP's reducer and FSDP2's root gathering see it. Entropy comes from the same
chunk's logits (detached: a metric).

A step whose loss or gradient norm is not finite is skipped, as verl's actor does (its
``_optimizer_step``: "if grad_norm is not finite, skip the update"): the gradients are dropped,
``optimizer.step()`` is not called (AdamW would still move every weight by its decay and its
moments), and the step reports ``step_skipped``. The weights stay the last finite ones, so NaN
never reaches a published version. The decision is the same on every rank: the gradient norm is
global after DDP's all-reduce or FSDP2's norm, and the loss's finiteness is all-reduced.

Batches use the trainer's layout (workloads/train/inputs/batches.py): ``targets[b, t]`` is the
token that follows ``input_ids[b, t]``, ``IGNORE`` except on completion tokens; rows are
right-padded.
"""

from __future__ import annotations

import contextlib
import math
import time
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from workloads.rl.grpo import LossSettings, policy_loss

# Publishing is workloads/rl/publish.py's; its names stay importable from here.
from workloads.rl.publish import Published as Published
from workloads.rl.publish import publish_buckets as publish_buckets
from workloads.rl.publish import write_folder as write_folder
from workloads.rl.rollout import TRUNCATED, Rollout
from workloads.train.config import LOSS_CHUNK_TOKENS
from workloads.train.inputs.batches import IGNORE
from workloads.train.models.loss import Head, _base_model, hf_head
from workloads.train.models.modeling import TrainModel
from workloads.train.run.step import global_targets, gradient_sync


def _chunk_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, head: Head, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float() / temperature
    logp_all = logits.log_softmax(dim=-1)
    picked = logp_all.gather(-1, targets.clamp_min(0)[:, None])[:, 0]
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
    return picked, entropy


def token_logprobs(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: Head,
    temperature: float = 1.0,
    chunk_tokens: int = LOSS_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log softmax(head(hidden) / temperature)`` at ``targets`` (``[...]``; an ``IGNORE``
    target gives 0) and the entropy, both shaped like ``targets``, ``chunk_tokens`` at a time."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    parts, entropies = [], []
    for start in range(0, flat.shape[0], chunk_tokens):
        picked, entropy = checkpoint(
            _chunk_logprobs,
            flat[start : start + chunk_tokens],
            flat_targets[start : start + chunk_tokens],
            head,
            temperature,
            use_reentrant=False,
            preserve_rng_state=False,
        )
        parts.append(picked)
        entropies.append(entropy)
    keep = targets != IGNORE
    # A product, not a reshaped view: FSDP2 hooks the forward's outputs for backward, and a
    # view may lose that hook.
    logprobs = torch.cat(parts).reshape(targets.shape) * keep
    return logprobs, torch.cat(entropies).reshape(targets.shape).detach()


def install_logprob_forward(model: nn.Module, chunk_tokens: int = LOSS_CHUNK_TOKENS) -> None:
    """Give ``model`` (this instance) a forward that, called with ``logprob_targets=``, returns
    ``(logprobs, entropy)``; without it, the forward it had (the trainer's loss forward)."""
    head, base = hf_head(model), _base_model(model)
    if head is None or base is None:
        raise ValueError(f"{type(model).__name__}: no known head; RL needs a Hugging Face LM")
    previous = model.forward

    def forward(
        self: nn.Module,
        *args: Any,
        logprob_targets: torch.Tensor | None = None,
        temperature: float = 1.0,
        **kwargs: Any,
    ) -> Any:
        if logprob_targets is None:
            return previous(*args, **kwargs)
        out = base(
            input_ids=kwargs["input_ids"], position_ids=kwargs.get("position_ids"), use_cache=False
        )
        return token_logprobs(
            out.last_hidden_state, logprob_targets, head, temperature, chunk_tokens
        )

    model.forward = types.MethodType(forward, model)


@dataclass
class RolloutBatch:
    """Completions as the learner reads them (CPU tensors, ``[rows, T]`` unless noted)."""

    input_ids: torch.Tensor  # prompt + completion, right-padded
    targets: torch.Tensor  # the next token on completion positions, IGNORE elsewhere
    sampler_logprobs: torch.Tensor  # the engine's, at the same positions (0 elsewhere)
    advantages: torch.Tensor  # [rows]

    @property
    def n_tokens(self) -> int:
        return int((self.targets != IGNORE).sum())

    def rows(self, start: int, stop: int) -> RolloutBatch:
        return RolloutBatch(
            self.input_ids[start:stop],
            self.targets[start:stop],
            self.sampler_logprobs[start:stop],
            self.advantages[start:stop],
        )


def collate(
    rollouts: Sequence[Rollout],
    advantages: torch.Tensor,
    pad_id: int,
    *,
    mask_truncated: bool = False,
) -> RolloutBatch:
    """Rollouts (with one advantage each) into a right-padded batch in the trainer's layout.
    ``mask_truncated``: a completion cut at the token limit (``finish_reason`` ``length``)
    keeps no target, so it leaves the loss and its token count (DAPO's overlong filtering,
    TRL's ``mask_truncated_completions``)."""
    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    rows = len(rollouts)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    targets = torch.full((rows, width), IGNORE, dtype=torch.long)
    old = torch.zeros((rows, width), dtype=torch.float32)
    for row, rollout in enumerate(rollouts):
        ids = rollout.prompt_ids + rollout.completion_ids
        input_ids[row, : len(ids)] = torch.tensor(ids)
        if mask_truncated and rollout.finish_reason == TRUNCATED:
            continue
        first = len(rollout.prompt_ids) - 1  # the position that predicts the first completion token
        count = len(rollout.completion_ids)
        targets[row, first : first + count] = torch.tensor(rollout.completion_ids)
        old[row, first : first + count] = torch.tensor(rollout.logprobs[:count])
    return RolloutBatch(input_ids, targets, old, advantages.to(torch.float32))


def policy_logprobs(
    model: TrainModel, input_ids: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled tokens' log-probabilities under ``model`` (which needs
    :func:`install_logprob_forward`), and the entropy at each position."""
    out = model.module(input_ids=input_ids, logprob_targets=targets, temperature=temperature)
    logprobs, entropy = out
    return logprobs, entropy


class GRPOLearner:
    """One worker's share of the learner: the policy, an optional frozen reference, the
    optimizer, and the policy version (learner steps taken: a skipped step counts, publishing
    the unchanged weights under the next version, so versions keep pace with the steps)."""

    def __init__(
        self,
        model: TrainModel,
        optimizer: torch.optim.Optimizer,
        *,
        settings: LossSettings,
        temperature: float,
        device: torch.device,
        micro_batch: int | None = None,
        reference: TrainModel | None = None,
        grad_clip: float = 1.0,
        amp: contextlib.AbstractContextManager[None] | None = None,
        ppo_epochs: int = 1,
        mini_batches: int = 1,
    ) -> None:
        if settings.kl_coef and reference is None:
            raise ValueError("a KL coefficient needs a reference model")
        for built in (model, reference):
            if built is not None:
                install_logprob_forward(built.inner)
        self.model, self.reference, self.optimizer = model, reference, optimizer
        self.settings, self.temperature, self.device = settings, temperature, device
        self.micro_batch, self.grad_clip = micro_batch, grad_clip
        self.ppo_epochs, self.mini_batches = ppo_epochs, mini_batches
        self.amp = amp or contextlib.nullcontext()
        self.version = 0
        self.skipped_steps = 0  # steps skipped for a non-finite loss or gradient, this process
        self.world = dist.get_world_size() if dist.is_initialized() else 1

    def step(self, batch: RolloutBatch, lr: float) -> dict[str, float]:
        """``ppo_epochs`` passes over the batch, each ``mini_batches`` optimizer steps at ``lr``
        (one, by default), each accumulating the GRPO loss over micro-batches; a step whose loss
        or gradient norm is not finite is not taken (``step_skipped`` 1, the module docstring).
        With more than one optimizer step, ``π_old`` is a no-grad pass over the batch first, so
        the ratio of the later steps departs from 1 and the clip acts. Metrics: token-weighted
        means over each optimizer step, averaged over the steps."""
        started = time.perf_counter()
        rows = batch.input_ids.shape[0]
        if rows % self.mini_batches:
            raise ValueError(
                f"{rows} completions do not split into {self.mini_batches} mini-batches"
            )
        several = self.ppo_epochs * self.mini_batches > 1
        old = (
            self._old_logprobs(batch) if several and self.settings.correction != "bypass" else None
        )
        size = rows // self.mini_batches
        sums: dict[str, float] = {}
        norms, skipped = [], 0
        count = self.ppo_epochs * self.mini_batches
        for _epoch in range(self.ppo_epochs):
            for start in range(0, rows, size):
                part_old = None if old is None else old[start : start + size]
                metrics, norm, skip = self._optimizer_step(
                    batch.rows(start, start + size), part_old, lr
                )
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value / count
                norms.append(norm)
                skipped += skip
        self.version += 1
        sums["grad_norm"] = sum(norms) / len(norms)
        sums["step_skipped"] = float(skipped > 0)
        sums["skipped_steps"] = float(self.skipped_steps)
        sums["optimizer_steps"] = float(count - skipped)
        sums["step_s"] = time.perf_counter() - started
        return sums

    def _old_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """``π_old``: the batch's log-probabilities under the weights before any update of
        this step (no grad, micro-batch by micro-batch)."""
        size = self.micro_batch or batch.input_ids.shape[0]
        parts = []
        with torch.no_grad(), self.amp:
            for start in range(0, batch.input_ids.shape[0], size):
                part = batch.rows(start, start + size)
                ids, targets = part.input_ids.to(self.device), part.targets.to(self.device)
                logprobs, _ = policy_logprobs(self.model, ids, targets, self.temperature)
                parts.append(logprobs.float())
        return torch.cat(parts)

    def _optimizer_step(
        self, batch: RolloutBatch, old: torch.Tensor | None, lr: float
    ) -> tuple[dict[str, float], float, bool]:
        """One optimizer step on ``batch`` (``old``: its ``π_old``, None: the loss forward's
        own): its metrics, its gradient norm, and whether it was skipped."""
        rows = batch.input_ids.shape[0]
        size = min(self.micro_batch or rows, rows)
        total = global_targets(batch.n_tokens, self.world, self.device, vary=True)
        sums: dict[str, float] = {}
        finite = torch.ones((), device=self.device)
        starts = list(range(0, rows, size))
        for index, start in enumerate(starts):
            part = batch.rows(start, start + size)
            ids = part.input_ids.to(self.device)
            targets = part.targets.to(self.device)
            mask = targets != IGNORE
            ref = None
            if self.reference is not None:
                with torch.no_grad(), self.amp:
                    ref, _ = policy_logprobs(self.reference, ids, targets, self.temperature)
            with gradient_sync(self.model.module, index == len(starts) - 1), self.amp:
                logprobs, entropy = policy_logprobs(self.model, ids, targets, self.temperature)
                loss, metrics = policy_loss(
                    logprobs,
                    part.sampler_logprobs.to(self.device),
                    part.advantages.to(self.device),
                    mask,
                    self.settings,
                    old_logprobs=None if old is None else old[start : start + size],
                    ref_logprobs=ref,
                    entropy=entropy,
                    total_tokens=total,
                )
                (loss * self.world).backward()  # gradients are averaged over ranks
            finite = finite * torch.isfinite(loss.detach())
            share = int(mask.sum()) / max(batch.n_tokens, 1)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(value) * share
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        params = [p for p in self.model.module.parameters() if p.grad is not None]
        if self.grad_clip:
            norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        else:  # no clipping, but the norm still decides whether the step is taken
            norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a DTensor
        if self.world > 1:
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        skip = not (bool(finite) and math.isfinite(float(norm)))
        if not skip:
            self.optimizer.step()
        else:
            self.skipped_steps += 1
            print(f"step {self.version + 1}: the loss or the gradient norm ({float(norm)}) is not "
                  "finite: optimizer step skipped, weights unchanged", flush=True)  # fmt: skip
        self.optimizer.zero_grad(set_to_none=True)
        return sums, float(norm), skip
