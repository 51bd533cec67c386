"""GRPO's arithmetic: advantages normalised within each prompt's group, and the clipped
policy-ratio loss with per-token normalisation and an optional k3 KL term.

The formulas are the field's, written here in a few lines rather than imported:

- **Advantages** (DeepSeekMath's GRPO; verl ``compute_grpo_outcome_advantage``, TRL
  ``GRPOTrainer``): each completion's reward minus its group's mean, divided by the group's
  standard deviation (unbiased, as ``torch.std`` in both) plus ``eps``. A group whose rewards are
  all equal teaches nothing and gets exactly zero (tested by spread, not by ``std < eps``, so
  rounding in the mean cannot leak a tiny advantage through the division by ``eps``).
- **Loss** (PPO's clipped surrogate, per token): ``r = exp(logp - logp_old)``, per token
  ``-min(r·A, clip(r, 1-ε_low, 1+ε_high)·A)``; DAPO's decoupled ``ε_high`` is allowed.
- **Per-token normalisation** (DAPO; verl ``loss_agg_mode="token-mean"``; TRL
  ``loss_type="dapo"``): the sum over every response token of the batch divided by the number
  of those tokens, so a long completion weighs by its length instead of being averaged down
  to one sequence. ``total_tokens`` lets micro-batches and ranks divide by the *global* count,
  as the trainer's cross-entropy does (workloads/train/step.py), so accumulated gradients are
  those of one big batch.
- **KL to a frozen reference**, the k3 estimator (Schulman's "Approximating KL divergence";
  verl ``low_var_kl``, TRL's ``per_token_kl``): with ``d = logp_ref - logp``,
  ``k3 = exp(d) - d - 1`` ≥ 0, unbiased for KL(π‖π_ref) under samples of π and of low variance.
  Clamped at 10 as verl does, so one token whose reference probability collapsed cannot blow
  up a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

KL_CLAMP = 10.0


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """Advantages ``[N]`` for rewards ``[N]`` laid out as contiguous groups of ``group_size``
    completions of one prompt each (prompt 0's completions first, then prompt 1's, ...)."""
    if group_size <= 0 or rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"{rewards.numel()} rewards do not split into groups of {group_size} completions"
        )
    grouped = rewards.reshape(-1, group_size).to(torch.float64)
    mean = grouped.mean(dim=1, keepdim=True)
    spread = grouped.amax(dim=1, keepdim=True) - grouped.amin(dim=1, keepdim=True)
    if group_size == 1:  # one completion: no group to compare with
        return torch.zeros_like(rewards, dtype=torch.float32)
    std = grouped.std(dim=1, keepdim=True)
    advantages = torch.where(spread > 0, (grouped - mean) / (std + eps), torch.zeros_like(grouped))
    return advantages.reshape(-1).to(torch.float32)


@dataclass(frozen=True)
class LossSettings:
    clip_low: float = 0.2  # ε_low: the ratio is clipped below at 1 - clip_low
    clip_high: float = 0.2  # ε_high: above at 1 + clip_high (DAPO: 0.28)
    kl_coef: float = 0.0  # β: weight of the k3 KL to the reference (0: no reference needed)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π‖π_ref) from the sampled tokens' log-probabilities."""
    delta = ref_logprobs - logprobs
    return (torch.exp(delta) - delta - 1.0).clamp(max=KL_CLAMP)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: LossSettings = LossSettings(),
    *,
    ref_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    total_tokens: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO loss of a batch and its metrics.

    ``logprobs`` (with gradient), ``old_logprobs`` (the policy that sampled, no gradient) and
    ``ref_logprobs`` are ``[B, T]`` log-probabilities of the sampled tokens; ``mask`` ``[B, T]``
    marks response tokens; ``advantages`` is ``[B]`` (one per completion) or ``[B, T]``;
    ``entropy`` ``[B, T]`` (optional, a metric only). ``total_tokens``: the divisor (default:
    this batch's response tokens). Metrics are detached token means over the response tokens
    of this batch: ``policy_loss``, ``kl``, ``clip_fraction`` (tokens whose clipped term was
    the one taken, i.e. whose gradient was cut), ``ratio``, ``entropy``.
    """
    weights = mask.to(logprobs.dtype)
    count = weights.sum().clamp_min(1.0)
    divisor = count if total_tokens is None else total_tokens
    adv = advantages if advantages.ndim == 2 else advantages[:, None]
    adv = adv.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs.detach())
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    metrics: dict[str, torch.Tensor] = {
        "policy_loss": ((per_token * weights).sum() / count).detach(),
        "clip_fraction": (((clipped < unclipped).to(weights.dtype) * weights).sum() / count),
        "ratio": ((ratio * weights).sum() / count).detach(),
    }
    if settings.kl_coef and ref_logprobs is None:
        raise ValueError("kl_coef is set but no reference log-probabilities were given")
    if ref_logprobs is not None:
        kl = k3_kl(logprobs, ref_logprobs.detach())
        metrics["kl"] = ((kl * weights).sum() / count).detach()
        if settings.kl_coef:
            per_token = per_token + settings.kl_coef * kl
    if entropy is not None:
        metrics["entropy"] = ((entropy.detach() * weights).sum() / count).detach()
    loss = (per_token * weights).sum() / divisor
    return loss, metrics
