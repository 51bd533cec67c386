"""GRPO's advantages and loss against numbers worked out by hand (in the comments), the
gradient autograd gives against the hand-derived one, and the off-policy correction, dual-clip
and log-ratio clamp against the formulas as verl and TRL write them (re-written below from their
sources, line by line, not from workloads/rl/grpo.py)."""

from __future__ import annotations

import math

import pytest
import torch

from workloads.rl.grpo import LossSettings, group_advantages, k3_kl, policy_loss

BYPASS = dict(correction="bypass")  # the ratio against the sampler itself: the hand examples


def test_advantages_are_normalised_within_each_group() -> None:
    # Group 0: rewards 1, 0, 0, 1 -> mean 0.5; unbiased std = sqrt(4 * 0.25 / 3) = sqrt(1/3);
    #          (±0.5) / sqrt(1/3) = ±0.5 * sqrt(3) = ±0.8660254.
    # Group 1: 0.1 four times -> no spread -> exactly 0 (not rounding noise divided by eps).
    # Group 2: 3, 1, 1, 1 -> mean 1.5; std = sqrt((2.25 + 3 * 0.25) / 3) = 1;
    #          advantages 1.5, -0.5, -0.5, -0.5.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.1, 0.1, 0.1, 0.1, 3.0, 1.0, 1.0, 1.0])
    got = group_advantages(rewards, group_size=4, eps=0.0)
    half_root3 = 0.5 * math.sqrt(3)
    want = [half_root3, -half_root3, -half_root3, half_root3, 0, 0, 0, 0, 1.5, -0.5, -0.5, -0.5]
    assert got.tolist() == pytest.approx(want, abs=1e-6)
    assert got[4:8].eq(0).all()  # exactly


def test_non_finite_rewards_never_give_nan_advantages() -> None:
    """A group holding ±inf or NaN (or values whose mean overflows) gets zero advantages; the
    other groups are untouched. Without the guard, -inf makes group 0's mean -inf: NaN."""
    rewards = torch.tensor([float("-inf"), 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    got = group_advantages(rewards, group_size=4, eps=0.0)
    assert torch.isfinite(got).all()
    assert got[:4].eq(0).all()
    half_root3 = 0.5 * math.sqrt(3)
    assert got[4:].tolist() == pytest.approx([half_root3, -half_root3, -half_root3, half_root3])
    for bad in (float("nan"), float("inf"), 1.7e308):
        raw = torch.tensor([bad, 1.7e308, 0.0, 1.0], dtype=torch.float64)
        assert group_advantages(raw, group_size=4).eq(0).all()


def test_a_reward_returning_minus_inf_through_scoring_gives_finite_advantages() -> None:
    """The path a run takes (workloads/rl/loop.py ``_finish``): the rewards score the round,
    ``group_advantages`` standardises them. A reward returning -inf is left out of the sum and
    counted (``rewards_nonfinite``); the advantages are finite and still rank the completions
    by the rewards that were finite."""
    from workloads.rl.prompts import Prompt, score
    from workloads.rl.rewards import Rewards
    from workloads.rl.rollout import Rollout

    prompts = [Prompt("q", "#### 5")]
    texts = ["#### 5", "#### 5 ouch", "#### 4", "#### 4"]
    rollouts = [Rollout(0, [1], [7], text, [0.0], version=0) for text in texts]
    rewards = Rewards(["numeric", "tests.workloads.test_rl_grpo:_minus_inf_on_ouch"])
    scored = score(rollouts, prompts, rewards, threads=2)
    assert scored.values == [1.0, 1.0, 0.0, 0.0] and scored.nonfinite == 1
    advantages = group_advantages(torch.tensor(scored.values), group_size=4)
    assert torch.isfinite(advantages).all()
    assert advantages[0] > 0 and advantages[1] > 0 and advantages[2] < 0 and advantages[3] < 0


def _minus_inf_on_ouch(*, completion: str, **_: object) -> float:
    return float("-inf") if "ouch" in completion else 0.0


def test_advantages_eps_and_bad_layouts() -> None:
    # rewards 2, 0: mean 1, std sqrt(2); with eps 1: ±1 / (sqrt(2) + 1) = ±0.4142136
    got = group_advantages(torch.tensor([2.0, 0.0]), group_size=2, eps=1.0)
    assert got.tolist() == pytest.approx([math.sqrt(2) - 1, 1 - math.sqrt(2)], abs=1e-6)
    assert group_advantages(torch.tensor([5.0, 1.0]), group_size=1).eq(0).all()
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.zeros(6), group_size=4)


def _example() -> tuple[torch.Tensor, ...]:
    # Two completions, three token slots; the second has two response tokens (mask 1 1 0).
    # Ratios r = exp(logp - old): completion 0: 1.0, 1.5, 0.5; completion 1: 1.0, 1.5, (pad).
    old = torch.log(torch.tensor([[0.2, 0.2, 0.4], [0.3, 0.2, 0.5]], dtype=torch.float64))
    ratio = torch.tensor([[1.0, 1.5, 0.5], [1.0, 1.5, 1.0]], dtype=torch.float64)
    logp = (old + torch.log(ratio)).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    return logp, old, mask, advantages


def test_clipped_loss_with_token_mean_by_hand() -> None:
    # ε = 0.2.  Per token -min(r·A, clip(r, 0.8, 1.2)·A):
    #  completion 0 (A = +1): r 1.0 -> -1.0; r 1.5 -> -min(1.5, 1.2) = -1.2 (clipped);
    #                         r 0.5 -> -min(0.5, 0.8) = -0.5 (not clipped: min takes r·A)
    #  completion 1 (A = -1): r 1.0 -> +1.0; r 1.5 -> -min(-1.5, -1.2) = +1.5 (not clipped)
    # Token mean over the 5 response tokens: (-1 - 1.2 - 0.5 + 1 + 1.5) / 5 = -0.2 / 5 = -0.04.
    # (A mean of sequence means would be (-2.7/3 + 2.5/2) / 2 = 0.175: the test tells them apart.)
    # Clip fraction: 1 token of 5 = 0.2.  Mean ratio: (1 + 1.5 + 0.5 + 1 + 1.5) / 5 = 1.1.
    logp, old, mask, advantages = _example()
    loss, metrics = policy_loss(logp, old, advantages, mask, LossSettings(0.2, 0.2, **BYPASS))
    assert loss.item() == pytest.approx(-0.04, abs=1e-12)
    assert metrics["clip_fraction"].item() == pytest.approx(0.2)
    assert metrics["ratio"].item() == pytest.approx(1.1)
    assert "kl" not in metrics

    # d loss / d logp = -A·r / 5 where the unclipped term is taken, 0 where clipped or padded:
    #  completion 0: -1·1/5 = -0.2, 0 (clipped), -1·0.5/5 = -0.1
    #  completion 1: +1·1/5 = +0.2, +1·1.5/5 = +0.3, 0 (padding)
    loss.backward()
    assert logp.grad is not None
    want = torch.tensor([[-0.2, 0.0, -0.1], [0.2, 0.3, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(logp.grad, want)


def test_decoupled_clip_high_and_global_divisor() -> None:
    # ε_high = 0.6: the r = 1.5 token of completion 0 is no longer clipped: -1.5 instead of -1.2;
    # the sum becomes -1 - 1.5 - 0.5 + 1 + 1.5 = -0.5; over a global count of 10 tokens: -0.05.
    logp, old, mask, advantages = _example()
    loss, metrics = policy_loss(
        logp, old, advantages, mask, LossSettings(0.2, 0.6, **BYPASS), total_tokens=10.0
    )
    assert loss.item() == pytest.approx(-0.05, abs=1e-12)
    assert metrics["clip_fraction"].item() == 0.0


def test_k3_kl_term_by_hand() -> None:
    # k3 = exp(d) - d - 1 with d = logp_ref - logp.
    #  d = ln 2 -> 2 - 0.6931472 - 1 = 0.3068528;  d = 0 -> 0;  d = -ln 2 -> 0.5 + 0.6931472 - 1
    #  = 0.1931472.  Token mean over the 5 response tokens with the padded slot ignored:
    #  tokens (0.3068528, 0, 0.1931472, 0.3068528, 0) -> 0.8068528 / 5 = 0.1613706.
    logp, old, mask, advantages = _example()
    d = torch.log(torch.tensor([[2.0, 1.0, 0.5], [2.0, 1.0, 123.0]], dtype=torch.float64))
    ref = logp.detach() + d
    k3 = k3_kl(logp.detach(), ref)
    assert k3[0].tolist() == pytest.approx([0.3068528, 0.0, 0.1931472], abs=1e-7)
    base, _ = policy_loss(logp, old, advantages, mask, LossSettings(0.2, 0.2, **BYPASS))
    loss, metrics = policy_loss(
        logp, old, advantages, mask, LossSettings(0.2, 0.2, 0.1, **BYPASS), ref_logprobs=ref
    )
    assert metrics["kl"].item() == pytest.approx(0.1613706, abs=1e-7)
    assert loss.item() == pytest.approx(base.item() + 0.1 * 0.1613706, abs=1e-7)
    # d k3 / d logp = 1 - exp(d): -1 at d = ln 2, 0 at d = 0, +0.5 at d = -ln 2; times β / 5.
    (grad_kl,) = torch.autograd.grad(loss - base, logp)
    want = torch.tensor([[-1.0, 0.0, 0.5], [-1.0, 0.0, 0.0]], dtype=torch.float64) * 0.1 / 5
    torch.testing.assert_close(grad_kl, want)


def test_kl_coef_without_reference_is_refused() -> None:
    logp, old, mask, advantages = _example()
    with pytest.raises(ValueError, match="reference"):
        policy_loss(logp, old, advantages, mask, LossSettings(kl_coef=0.1))


def test_a_descent_step_raises_the_advantaged_tokens() -> None:
    # Gradient sanity on a real softmax policy: one SGD step on the loss raises the probability
    # of the tokens with positive advantage and lowers the others.
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 10, requires_grad=True)
    tokens = torch.randint(0, 10, (4, 6))
    mask = torch.ones(4, 6)

    def logp_of(x: torch.Tensor) -> torch.Tensor:
        return x.log_softmax(-1).gather(-1, tokens[..., None])[..., 0]

    before = logp_of(logits).detach()
    advantages = group_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0]), group_size=2)
    loss, _ = policy_loss(logp_of(logits), before, advantages, mask)
    loss.backward()
    assert logits.grad is not None
    after = logp_of(logits.detach() - 1.0 * logits.grad)
    change = (after - before).sum(dim=1)
    assert (change[advantages > 0] > 0).all() and (change[advantages < 0] < 0).all()


# ---- bounded: a runaway ratio and an overflowing log-ratio ---------------------------------


def test_a_runaway_ratio_and_an_overflowing_log_ratio_stay_bounded() -> None:
    # Four tokens of one completion against the sampler (bypass: the ratio is π_θ/π_sampler):
    #  log-ratio ln 50 with A = -1: unclipped -A·r = 50; dual-clip caps it at -A·c = 3, and the
    #     capped term is a constant: no gradient (verl: "a ratio of 50 ... loss 3, gradient 0");
    #  log-ratio 100 with A = -1: exp(100) overflows fp32; clamped to 20 first, then dual-clip: 3;
    #  log-ratio 100 with A = +1: clamped, then clipped at 1 + ε_high: -1.28, no gradient;
    #  log-ratio 0 with A = +1: -1, gradient -A·r = -1.
    # Token mean: (3 + 3 - 1.28 - 1) / 4 = 0.93; d/dlogp: (0, 0, 0, -1) / 4.
    sampler = torch.zeros(2, 4)
    logp = torch.tensor([[math.log(50.0), 100.0, 100.0, 0.0]] * 2).requires_grad_(True)
    advantages = torch.tensor([[-1.0, -1.0, 1.0, 1.0], [-1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 0, 0]])
    settings = LossSettings(0.2, 0.28, **BYPASS)
    loss, metrics = policy_loss(logp, sampler, advantages, mask, settings)
    assert loss.item() == pytest.approx(0.93, abs=1e-6)
    loss.backward()
    assert logp.grad is not None and torch.isfinite(logp.grad).all()
    torch.testing.assert_close(logp.grad[0], torch.tensor([0.0, 0.0, 0.0, -0.25]))
    assert metrics["clip_fraction_lower"].item() == pytest.approx(0.5)  # the two A < 0 tokens
    assert all(torch.isfinite(v).all() for v in metrics.values())

    # The importance weight of a token the learner finds e^100 times likelier than the sampler
    # did: clamped before exp, then truncated at C = 2 (or masked), never inf.
    learner = torch.tensor([[100.0, 0.0]], requires_grad=True)
    for correction, weight in (("token_truncate", 2.0), ("token_mask", 0.0)):
        got, metrics = policy_loss(
            learner,
            torch.zeros(1, 2),
            torch.tensor([-1.0]),
            torch.ones(1, 2),
            LossSettings(correction=correction),
        )
        (grad,) = torch.autograd.grad(got, learner)
        assert torch.isfinite(grad).all() and torch.isfinite(got)
        # per token: r = 1 (π_old is the learner's own), -A·r·w = w and 1: mean (w + 1) / 2
        assert got.item() == pytest.approx((weight + 1.0) / 2)
        assert metrics["is_cut_fraction"].item() == pytest.approx(0.5)


# ---- against verl and TRL, written from their sources -------------------------------------


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum()


def verl_vanilla(old_log_prob, log_prob, advantages, response_mask, lo, hi, clip_ratio_c):
    """verl trainer/ppo/core_algos.py compute_policy_loss_vanilla (token-mean), as written there."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - lo, 1 + hi)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = _masked_mean(torch.gt(pg_losses2, pg_losses1).float(), response_mask)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return _masked_mean(pg_losses, response_mask), pg_clipfrac


def verl_token_tis_weights(old_log_prob, rollout_log_prob, response_mask, threshold):
    """verl rollout_corr_helper compute_rollout_correction_weights, rollout_is="token"."""
    log_ratio = old_log_prob - rollout_log_prob
    weights = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0)) * response_mask
    return weights.clamp(max=threshold).detach()


def trl_grpo_dapo(per_token_logps, old_per_token_logps, sampling_per_token_logps, advantages,
                  completion_mask, epsilon_low, epsilon_high, mode, clip_min,
                  clip_max):  # fmt: skip
    """TRL GRPOTrainer: the vLLM importance-sampling ratio (token_truncate / token_mask), the
    clipped loss multiplied by it, loss_type="dapo" (sum over tokens / tokens)."""
    ratio = torch.exp(old_per_token_logps - sampling_per_token_logps)
    if mode == "token_truncate":
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        invalid = (ratio < (clip_min if clip_min is not None else -math.inf)) | (ratio > clip_max)
        ratio = ratio.masked_fill(invalid, value=0.0)
    coef_1 = torch.exp(per_token_logps - old_per_token_logps)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    per_token_loss = per_token_loss * ratio
    return (per_token_loss * completion_mask).sum() / completion_mask.sum().clamp(min=1.0)


def _random_batch(seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    shape = (6, 9)
    logp = -torch.rand(shape, generator=generator, dtype=torch.float64) * 4
    # samplers off by up to ±3 nats (and one token by 40: beyond the clamp)
    sampler = logp + (torch.rand(shape, generator=generator, dtype=torch.float64) - 0.5) * 6
    sampler[0, 0] = logp[0, 0] - 40.0
    advantages = torch.randn(shape[0], generator=generator, dtype=torch.float64)[:, None]
    mask = (torch.rand(shape, generator=generator) > 0.2).to(torch.float64)
    mask[:, 0] = 1.0
    return logp, sampler, advantages.expand(shape), mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bypass_is_verls_vanilla_loss_with_dual_clip(seed: int) -> None:
    logp, sampler, advantages, mask = _random_batch(seed)
    theta = logp.clone().requires_grad_(True)
    settings = LossSettings(0.2, 0.28, clip_ratio_c=3.0, **BYPASS)
    got, metrics = policy_loss(theta, sampler, advantages, mask, settings)
    (g_got,) = torch.autograd.grad(got, theta)
    ref = theta.detach().clone().requires_grad_(True)
    want, clipfrac = verl_vanilla(sampler, ref, advantages, mask, 0.2, 0.28, 3.0)
    (g_want,) = torch.autograd.grad(want, ref)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(g_got, g_want)
    torch.testing.assert_close(metrics["clip_fraction"], clipfrac)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_token_truncate_is_trls_and_verls_truncated_importance_sampling(seed: int) -> None:
    logp, sampler, advantages, mask = _random_batch(seed)
    theta = logp.clone().requires_grad_(True)
    got, metrics = policy_loss(theta, sampler, advantages, mask, LossSettings(0.2, 0.28))
    (g_got,) = torch.autograd.grad(got, theta)
    # TRL: old_per_token_logps recomputed by the learner (the same weights: θ before the step).
    ref = theta.detach().clone().requires_grad_(True)
    old = ref.detach()
    want = trl_grpo_dapo(ref, old, sampler, advantages, mask, 0.2, 0.28, "token_truncate",
                         None, 2.0)  # fmt: skip
    (g_want,) = torch.autograd.grad(want, ref)
    # TRL's exp without a clamp: the ±40-nat token overflows nothing here (exp(40) < 2^127)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(g_got, g_want)
    # verl's decoupled mode: its vanilla loss against π_old, multiplied by the token TIS weights
    ref2 = theta.detach().clone().requires_grad_(True)
    weights = verl_token_tis_weights(ref2.detach(), sampler, mask, 2.0)
    pg = -advantages * torch.exp(torch.clamp(ref2 - ref2.detach(), -20, 20))
    verl = _masked_mean(pg * weights, mask)  # r = 1: no clip, no dual-clip at the single step
    (g_verl,) = torch.autograd.grad(verl, ref2)
    torch.testing.assert_close(got, verl)
    torch.testing.assert_close(g_got, g_verl)
    torch.testing.assert_close(metrics["is_weight"], _masked_mean(weights, mask))


def test_token_mask_is_trls_masked_importance_sampling() -> None:
    logp, sampler, advantages, mask = _random_batch(5)
    theta = logp.clone().requires_grad_(True)
    got, metrics = policy_loss(
        theta, sampler, advantages, mask, LossSettings(0.2, 0.28, correction="token_mask")
    )
    want = trl_grpo_dapo(theta.detach(), theta.detach(), sampler, advantages, mask, 0.2, 0.28,
                         "token_mask", 0.5, 2.0)  # fmt: skip
    torch.testing.assert_close(got.detach(), want)
    assert 0 < metrics["is_cut_fraction"].item() < 1


def test_mismatch_metrics_are_trls_logp_difference_and_verls_k3() -> None:
    logp, sampler, advantages, mask = _random_batch(3)
    sampler[0, 0] = logp[0, 0] - 1.5  # inside the clamp: the formulas compare without it
    _, metrics = policy_loss(logp, sampler, advantages, mask)
    # TRL: delta = |old_per_token_logps - sampling_per_token_logps| over completion tokens
    delta = torch.abs(logp - sampler)[mask.bool()]
    assert metrics["mismatch_abs_logp"].item() == pytest.approx(delta.mean().item())
    # verl compute_offpolicy_metrics: log_ratio = old - rollout; k3 = exp(lr) - lr - 1
    log_ratio = logp - sampler
    k3 = _masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)
    assert metrics["mismatch_k3"].item() == pytest.approx(k3.item())


def test_on_policy_the_corrections_agree_and_weights_are_one() -> None:
    # The sampler is the learner exactly: every mode is the plain policy gradient.
    logp, _, advantages, mask = _random_batch(7)
    losses = [
        policy_loss(logp, logp, advantages, mask, LossSettings(correction=c))[0]
        for c in ("token_truncate", "token_mask", "bypass")
    ]
    for other in losses[1:]:
        torch.testing.assert_close(other, losses[0])


def test_settings_refuse_unbounded_values() -> None:
    with pytest.raises(ValueError, match="clip_ratio_c"):
        LossSettings(clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="is_cap"):
        LossSettings(is_cap=0.5)
    with pytest.raises(ValueError, match="correction"):
        LossSettings(correction="sequence")
