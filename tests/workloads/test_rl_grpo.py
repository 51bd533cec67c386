"""GRPO's advantages and loss against numbers worked out by hand (in the comments), and the
gradient autograd gives against the hand-derived one."""

from __future__ import annotations

import math

import pytest
import torch

from workloads.rl.grpo import LossSettings, group_advantages, k3_kl, policy_loss


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
    loss, metrics = policy_loss(logp, old, advantages, mask, LossSettings(0.2, 0.2))
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
        logp, old, advantages, mask, LossSettings(0.2, 0.6), total_tokens=10.0
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
    base, _ = policy_loss(logp, old, advantages, mask, LossSettings(0.2, 0.2))
    loss, metrics = policy_loss(
        logp, old, advantages, mask, LossSettings(0.2, 0.2, kl_coef=0.1), ref_logprobs=ref
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
