"""GRPO's arithmetic: advantages normalised within each prompt's group, and the clipped
policy-ratio loss with per-token normalisation, an off-policy correction against the sampler,
and an optional k3 KL term.

The formulas are the field's, written here in a few lines rather than imported:

- **Advantages** (DeepSeekMath's GRPO; verl ``compute_grpo_outcome_advantage``, TRL
  ``GRPOTrainer``): each completion's reward minus its group's mean, divided by the group's
  standard deviation (unbiased, as ``torch.std`` in both) plus ``eps``. A group whose rewards are
  all equal teaches nothing and gets exactly zero (tested by spread, not by ``std < eps``, so
  rounding in the mean cannot leak a tiny advantage through the division by ``eps``).
  A group whose advantages come out non-finite (a reward of ±inf or NaN, or values so large the
  mean overflows) gets zero too: one -inf makes the group's mean -inf and every advantage NaN,
  and NaN advantages are NaN gradients. :class:`workloads.rl.rewards.Rewards` already leaves
  such values out and counts them; this is the last guard, where the division happens.
- **Loss** (PPO's clipped surrogate, per token, verl ``compute_policy_loss_vanilla``):
  ``r = exp(clamp(logp - logp_old, ±20))`` (the clamp before ``exp``: a log-ratio of 100 would
  overflow to inf and its gradient to NaN), ``L1 = max(-A·r, -A·clip(r, 1-ε_low, 1+ε_high))``;
  DAPO's decoupled ``ε_high`` is allowed. **Dual-clip** for negative advantages (Ye et al. 2020,
  verl ``clip_ratio_c``, default 3): where ``A < 0`` the loss is ``min(L1, -A·c)``, so a token
  whose ratio ran away (50 with A = -1) costs at most ``c`` and passes no gradient.
- **Off-policy correction** (the sampler is vLLM in bf16, possibly a version behind; the
  learner is fp32 masters under autocast: ``π_sampler ≠ π_old``):
  ``token_truncate`` (default): ``π_old`` is the learner's own log-probability before the update
  and every token's loss is weighted by ``w = min(π_old/π_sampler, C)``, the truncated
  importance sampling of TRL (``vllm_importance_sampling_cap``, C = 2) and verl's token-level
  rollout correction (``rollout_is: token``, ``rollout_is_threshold`` 2); ``token_mask``:
  ``w = π_old/π_sampler`` inside ``[1/C, C]`` and 0 outside (TRL's ``token_mask`` with verl's
  default lower bound ``1/C``; masked tokens still count in the divisor, as in TRL);
  ``bypass``: ``π_old`` is the sampler's own log-probability and no weight (verl's bypass mode:
  the clipped ratio is the correction). The weights are detached (they change the measure, not
  the objective) and computed from a log-ratio clamped to ±20 like the ratio.
  ``sequence_truncate`` / ``sequence_mask`` (TRL's sequence modes): one weight per completion,
  ``w = exp(Σ_t (log π_old - log π_sampler))`` over its response tokens, truncated at C or set
  to 0 above C (TRL masks only above C).
  ``π_old`` is the learner's log-probability *before* the update. With one optimizer step per
  batch (``--ppo-epochs 1 --mini-batches 1``, the default) the forward that computes the loss
  runs on exactly those weights: its log-probabilities, detached, are ``π_old``, and the
  separate no-grad forward verl and TRL run would compute the same numbers again
  (tests/workloads/test_rl_learner.py holds them equal). Then the ratio is exactly 1 in every
  mode but ``bypass``: ``clip_low``, ``clip_high`` and the dual clip act only on ``bypass``'s
  ratio ``π_learner/π_sampler``, or with several optimizer steps per batch (``--ppo-epochs`` or
  ``--mini-batches`` > 1), where the learner computes ``π_old`` in a no-grad pass first
  (``old_logprobs``) and the ratio departs from 1 after the first step.
- **Per-token normalisation** (DAPO; verl ``loss_agg_mode="token-mean"``; TRL
  ``loss_type="dapo"``): the sum over every response token of the batch divided by the number
  of those tokens, so a long completion weighs by its length instead of being averaged down
  to one sequence. ``total_tokens`` lets micro-batches and ranks divide by the *global* count,
  as the trainer's cross-entropy does (workloads/train/run/step.py), so accumulated gradients are
  those of one big batch.
- **KL to a frozen reference**, the k3 estimator (Schulman's "Approximating KL divergence";
  verl ``low_var_kl``, TRL's ``per_token_kl``): with ``d = logp_ref - logp``,
  ``k3 = exp(d) - d - 1`` ≥ 0, unbiased for KL(π‖π_ref) under samples of π and of low variance.
  Clamped at 10 as verl does, so one token whose reference probability collapsed cannot blow
  up a step. Not importance-weighted (neither verl nor TRL weights it).
- **Mismatch metrics** between the learner and the sampler: ``mismatch_abs_logp``, the mean
  ``|logp_learner - logp_sampler|`` (TRL ``sampling/sampling_logp_difference/mean``), and
  ``mismatch_k3``, the mean of ``exp(δ) - δ - 1`` with ``δ = logp_learner - logp_sampler``
  (verl ``rollout_corr/k3_kl``), with the weights' mean and the share of tokens they cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workloads.rl.config import (
    CORRECTIONS,
    DEFAULT_CLIP_RATIO_C,
    DEFAULT_IS_CAP,
    REWARD_SCALINGS,
)

KL_CLAMP = 10.0
# The log-ratio's bound before exp (verl compute_policy_loss and rollout_corr_helper
# SAFETY_BOUND): exp(20) ≈ 4.9e8 is finite in fp32, exp(100) is not.
LOG_RATIO_CLAMP = 20.0


def group_advantages(
    rewards: torch.Tensor, group_size: int, eps: float = 1e-6, scale: str = "group"
) -> torch.Tensor:
    """Advantages ``[N]`` for rewards ``[N]`` laid out as contiguous groups of ``group_size``
    completions of one prompt each (prompt 0's completions first, then prompt 1's, ...): the
    reward minus its group's mean, divided by ``scale``'s std plus ``eps`` (TRL's
    ``scale_rewards``): ``group``, the group's; ``batch``, every reward's of the batch; ``none``,
    not divided (Dr. GRPO). Always finite: a group that would give a non-finite advantage, or
    whose rewards are all equal, gets zeros."""
    if group_size <= 0 or rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of {group_size} completions"
        )
    if scale not in REWARD_SCALINGS:
        raise ValueError(f"scale {scale!r}: allowed {', '.join(REWARD_SCALINGS)}")
    grouped = rewards.reshape(-1, group_size).to(torch.float64)
    mean = grouped.mean(dim=1, keepdim=True)
    spread = grouped.amax(dim=1, keepdim=True) - grouped.amin(dim=1, keepdim=True)
    if group_size == 1:  # one completion: no group to compare with
        return torch.zeros_like(rewards, dtype=torch.float32)
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True) + eps
    elif scale == "batch":  # over the finite rewards: a non-finite one is its own group's loss
        finite_values = grouped[torch.isfinite(grouped)]
        std = (finite_values.std() if finite_values.numel() > 1 else grouped.new_zeros(())) + eps
    else:
        std = grouped.new_ones(())
    advantages = torch.where(spread > 0, (grouped - mean) / std, torch.zeros_like(grouped))
    finite = torch.isfinite(advantages).all(dim=1, keepdim=True)
    advantages = torch.where(finite, advantages, torch.zeros_like(advantages))
    return advantages.reshape(-1).to(torch.float32)


@dataclass(frozen=True)
class LossSettings:
    clip_low: float = 0.2  # ε_low: the ratio is clipped below at 1 - clip_low
    clip_high: float = 0.2  # ε_high: above at 1 + clip_high (DAPO: 0.28)
    kl_coef: float = 0.0  # β: weight of the k3 KL to the reference (0: no reference needed)
    clip_ratio_c: float = DEFAULT_CLIP_RATIO_C  # dual-clip bound for A < 0 (> 1)
    correction: str = "token_truncate"  # one of CORRECTIONS
    is_cap: float = DEFAULT_IS_CAP  # C of the truncated / masked importance weights

    def __post_init__(self) -> None:
        if self.correction not in CORRECTIONS:
            raise ValueError(f"correction {self.correction!r}: allowed {', '.join(CORRECTIONS)}")
        if not self.clip_ratio_c > 1.0:  # verl asserts the same
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")
        if not self.is_cap >= 1.0:
            raise ValueError(f"is_cap must be >= 1, got {self.is_cap}")


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π‖π_ref) from the sampled tokens' log-probabilities."""
    delta = ref_logprobs - logprobs
    return (torch.exp(delta) - delta - 1.0).clamp(max=KL_CLAMP)


def bounded_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """``exp`` of a log-ratio clamped to ±LOG_RATIO_CLAMP: finite, with a finite gradient."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def sampler_ratio(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, level: str
) -> torch.Tensor:
    """``π_old/π_sampler`` (detached) per token, or for ``level == "sequence"`` per sequence
    (the product over its response tokens, TRL's sequence modes), broadcast to ``[B, T]``."""
    log_ratio = (old_logprobs - sampler_logprobs).detach() * mask.to(old_logprobs.dtype)
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=-1, keepdim=True).expand_as(old_logprobs)
    return bounded_exp(log_ratio)


def importance_weights(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    settings: LossSettings,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token weights ``π_old/π_sampler`` as ``settings.correction`` bounds them (detached;
    all ones for ``bypass``): ``*_truncate`` ``min(w, C)``; ``token_mask`` ``w`` inside
    ``[1/C, C]``, else 0; ``sequence_mask`` the sequence's ``w`` unless above ``C``, else 0
    (TRL's ``masked_fill(w > C, 0)``)."""
    if settings.correction == "bypass":
        return torch.ones_like(old_logprobs)
    level, _, bound = settings.correction.partition("_")
    keep = torch.ones_like(old_logprobs) if mask is None else mask
    rho = sampler_ratio(old_logprobs, sampler_logprobs, keep, level)
    if bound == "truncate":
        return rho.clamp(max=settings.is_cap)
    inside = rho <= settings.is_cap
    if level == "token":
        inside = inside & (rho >= 1.0 / settings.is_cap)
    return torch.where(inside, rho, torch.zeros_like(rho))


def _mean(values: torch.Tensor, weights: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return ((values * weights).sum() / count).detach()


def mismatch_metrics(
    learner_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the learner is from the sampler on the sampled tokens (token means)."""
    keep = mask.to(learner_logprobs.dtype)
    count = keep.sum().clamp_min(1.0)
    delta = (learner_logprobs - sampler_logprobs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return {
        "mismatch_abs_logp": _mean(delta.abs(), keep, count),
        "mismatch_k3": _mean(torch.exp(delta) - delta - 1.0, keep, count),
    }


def policy_loss(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings = LossSettings(),
    *,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    total_tokens: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO loss of a batch and its metrics.

    ``logprobs`` (with gradient, the learner's), ``sampler_logprobs`` (the engine's, under the
    weights that sampled) and ``ref_logprobs`` are ``[B, T]`` log-probabilities of the sampled
    tokens; ``mask`` ``[B, T]`` marks response tokens; ``advantages`` is ``[B]`` (one per
    completion) or ``[B, T]``; ``entropy`` ``[B, T]`` (optional, a metric only).
    ``old_logprobs``: ``π_old``, the learner's before this batch's first update (several
    optimizer steps per batch); default: ``logprobs`` detached (one step: the same numbers).
    ``total_tokens``: the divisor (default: this batch's response tokens). Metrics are detached
    token means over the response tokens of this batch: ``policy_loss``, ``kl``,
    ``clip_fraction`` (tokens whose clipped term was the one taken, verl's ``pg_clipfrac``),
    ``clip_fraction_lower`` (dual-clip taken), ``ratio``, ``entropy``, ``is_weight``,
    ``is_cut_fraction`` (tokens whose weight was truncated or masked), the mismatch metrics.
    """
    keep = mask.to(logprobs.dtype)
    count = keep.sum().clamp_min(1.0)
    divisor = count if total_tokens is None else total_tokens
    adv = advantages if advantages.ndim == 2 else advantages[:, None]
    adv = adv.to(logprobs.dtype)
    sampler = sampler_logprobs.detach().to(logprobs.dtype)
    before = logprobs.detach() if old_logprobs is None else old_logprobs.detach()
    old = sampler if settings.correction == "bypass" else before.to(logprobs.dtype)
    ratio = bounded_exp(logprobs - old)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)
    surrogate = torch.maximum(unclipped, clipped)
    dual = -adv * settings.clip_ratio_c
    per_token = torch.where(adv < 0, torch.minimum(surrogate, dual), surrogate)
    weights = importance_weights(old, sampler, settings, keep)
    per_token = per_token * weights
    level = "sequence" if settings.correction.startswith("sequence") else "token"
    raw = sampler_ratio(old, sampler, keep, level)
    metrics: dict[str, torch.Tensor] = {
        "policy_loss": _mean(per_token, keep, count),
        "clip_fraction": _mean((clipped > unclipped).to(keep.dtype), keep, count),
        "clip_fraction_lower": _mean(((surrogate > dual) & (adv < 0)).to(keep.dtype), keep, count),
        "ratio": _mean(ratio, keep, count),
        "is_weight": _mean(weights, keep, count),
        "is_cut_fraction": _mean((weights != raw).to(keep.dtype), keep, count),
        **mismatch_metrics(logprobs, sampler, mask),
    }
    if settings.kl_coef and ref_logprobs is None:
        raise ValueError("kl_coef is set but no reference log-probabilities were given")
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs.detach())
        metrics["kl"] = _mean(kl, keep, count)
        if settings.kl_coef:
            per_token = per_token + settings.kl_coef * kl
    if entropy is not None:
        metrics["entropy"] = _mean(entropy.detach(), keep, count)
    loss = (per_token * keep).sum() / divisor
    return loss, metrics
