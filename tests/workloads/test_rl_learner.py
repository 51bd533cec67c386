"""The GRPO learner on the trainer's tiny Llama (gloo, one CPU rank): the chunked log-probs are
the model's own, the loss forward's detached log-probs are π_old (a separate no-grad forward
gives the same numbers), updates move the advantaged completion's probability the right way, a
zero learning rate moves nothing, a step whose loss or gradient is not finite is skipped and
reported, and published weights load as the policy in bf16."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.workloads.train_fixtures import gloo_world1, tiny_llama_folder  # noqa: F401
from workloads.rl.grpo import LossSettings, group_advantages
from workloads.rl.learner import (
    GRPOLearner,
    collate,
    install_logprob_forward,
    policy_logprobs,
    token_logprobs,
    write_folder,
)
from workloads.rl.rollout import Rollout
from workloads.rl.sync import PolicyStore
from workloads.train.distributed.strategies import build_mesh, build_optimizer
from workloads.train.inputs.batches import IGNORE
from workloads.train.models import modeling
from workloads.train.models.loss import hf_head
from workloads.train.testing import TINY_LLAMA, cpu_run


def _model(strategy: str, seed: int = 0) -> modeling.TrainModel:
    run = dict(model=TINY_LLAMA, init="config", seq_len=64, global_batch_size=2)
    cfg = cpu_run(**run, strategy=strategy, seed=seed)
    device = torch.device("cpu")
    mesh = build_mesh("cpu", 1)
    return modeling.build(cfg, device=device, mesh=mesh, dtype=torch.float32, restoring=False)


def _rollouts(model: modeling.TrainModel) -> list[Rollout]:
    """One prompt, two fixed completions of different lengths (the second is padded)."""
    assert model.source is not None
    tok = model.source.tokenizer
    prompt = tok("what is the capital of france")["input_ids"]
    good = tok(" paris is the capital")["input_ids"]
    bad = tok(" two three")["input_ids"]
    return [
        Rollout(0, prompt, good, "", [0.0] * len(good), version=0),
        Rollout(0, prompt, bad, "", [0.0] * len(bad), version=0),
    ]


def _on_policy_batch(model: modeling.TrainModel, temperature: float) -> Any:
    rollouts = _rollouts(model)
    advantages = group_advantages(torch.tensor([1.0, 0.0]), group_size=2)
    batch = collate(rollouts, advantages, pad_id=0)
    install_logprob_forward(model.inner)
    with torch.no_grad():
        old, _ = policy_logprobs(model, batch.input_ids, batch.targets, temperature)
    batch.sampler_logprobs = old
    return batch


@pytest.mark.usefixtures("gloo_world1")
def test_chunked_logprobs_are_the_models_own(tiny_llama_folder: Path) -> None:
    model = _model("ddp")
    batch = collate(_rollouts(model), torch.zeros(2), pad_id=0)
    inner: Any = model.inner
    logits = type(inner).forward(inner, input_ids=batch.input_ids, use_cache=False).logits
    reference = (logits.float() / 0.7).log_softmax(-1)
    want = reference.gather(-1, batch.targets.clamp_min(0)[..., None])[..., 0]
    want = want * (batch.targets != IGNORE)
    hidden = inner.model(input_ids=batch.input_ids, use_cache=False).last_hidden_state
    head = hf_head(inner)
    assert head is not None
    got, entropy = token_logprobs(hidden, batch.targets, head, 0.7, chunk_tokens=5)
    torch.testing.assert_close(got, want)
    own_entropy = -(reference.exp() * reference).sum(-1)
    torch.testing.assert_close(entropy, own_entropy)
    # Gradients through the chunks are the full computation's.
    (g_got,) = torch.autograd.grad(got.sum(), hidden, retain_graph=True)
    full = (head(hidden).float() / 0.7).log_softmax(-1)
    picked = full.gather(-1, batch.targets.clamp_min(0)[..., None])[..., 0]
    (g_want,) = torch.autograd.grad((picked * (batch.targets != IGNORE)).sum(), hidden)
    torch.testing.assert_close(g_got, g_want)


def _completion_logprob(model: modeling.TrainModel, batch: Any) -> torch.Tensor:
    with torch.no_grad():
        logprobs, _ = policy_logprobs(model, batch.input_ids, batch.targets, 1.0)
    return logprobs.sum(dim=1)


@pytest.mark.usefixtures("gloo_world1")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_updates_raise_the_advantaged_completion(strategy: str, tiny_llama_folder: Path) -> None:
    model = _model(strategy)
    batch = _on_policy_batch(model, 1.0)
    optimizer = build_optimizer(model.module, lr=0.0, weight_decay=0.1)
    learner = GRPOLearner(
        model, optimizer, settings=LossSettings(), temperature=1.0, device=torch.device("cpu")
    )
    before = _completion_logprob(model, batch)
    for _ in range(3):
        metrics = learner.step(batch, lr=3e-3)
    after = _completion_logprob(model, batch)
    assert learner.version == 3
    assert after[0] > before[0] + 0.1, (before, after)  # advantage > 0: more likely
    assert after[1] < before[1] - 0.1, (before, after)  # advantage < 0: less likely
    assert 0.0 <= metrics["clip_fraction"] <= 1.0 and metrics["entropy"] > 0


@pytest.mark.usefixtures("gloo_world1")
def test_zero_learning_rate_changes_nothing(tiny_llama_folder: Path) -> None:
    model = _model("fsdp2")
    batch = _on_policy_batch(model, 1.0)
    optimizer = build_optimizer(model.module, lr=0.0, weight_decay=0.1)
    learner = GRPOLearner(
        model, optimizer, settings=LossSettings(), temperature=1.0, device=torch.device("cpu")
    )
    params = {k: v.detach().full_tensor().clone() for k, v in model.module.state_dict().items()}
    before = _completion_logprob(model, batch)
    for _ in range(2):
        metrics = learner.step(batch, lr=0.0)
    assert metrics["grad_norm"] > 0  # there was a gradient; the zero rate kept it out
    for key, value in model.module.state_dict().items():
        torch.testing.assert_close(value.detach().full_tensor(), params[key], rtol=0, atol=0)
    torch.testing.assert_close(_completion_logprob(model, batch), before, rtol=0, atol=0)


@pytest.mark.usefixtures("gloo_world1")
def test_kl_to_a_frozen_reference(tiny_llama_folder: Path) -> None:
    model, reference = _model("ddp"), _model("ddp")
    batch = _on_policy_batch(model, 1.0)
    optimizer = build_optimizer(model.module, lr=0.0, weight_decay=0.0)
    learner = GRPOLearner(
        model,
        optimizer,
        settings=LossSettings(kl_coef=0.1),
        temperature=1.0,
        device=torch.device("cpu"),
        reference=reference,
    )
    first = learner.step(batch, lr=3e-3)
    second = learner.step(batch, lr=3e-3)
    assert first["kl"] == pytest.approx(0.0, abs=1e-9)  # same seed: the policy is the reference
    assert second["kl"] > 0  # one update later it has moved away


@pytest.mark.usefixtures("gloo_world1")
def test_published_weights_are_the_policy_in_bf16(tiny_llama_folder: Path, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = _model("fsdp2")
    batch = _on_policy_batch(model, 1.0)
    optimizer = build_optimizer(model.module, lr=0.0, weight_decay=0.0)
    learner = GRPOLearner(
        model, optimizer, settings=LossSettings(), temperature=1.0, device=torch.device("cpu")
    )
    learner.step(batch, lr=3e-3)
    store = PolicyStore(max_staleness=0)
    published = write_folder(learner, str(tmp_path), store)
    policy = published.policy
    assert policy is not None and store.latest() == policy and policy.version == 1
    assert policy.path is not None and policy.path.endswith("policy/v000001")
    assert published.seconds > 0 and policy.nbytes == published.nbytes > 0
    loaded = AutoModelForCausalLM.from_pretrained(policy.path, dtype=torch.bfloat16)
    # Every weight is the learner's, rounded to bf16 (transformers' own reader, not ours).
    for name, tensor in loaded.state_dict().items():
        mine = model.module.state_dict()[name]
        mine = mine.full_tensor() if hasattr(mine, "full_tensor") else mine
        torch.testing.assert_close(tensor, mine.detach().to(torch.bfloat16), rtol=0, atol=0)
    # ... so the policy is the learner's up to bf16 rounding
    loaded = loaded.float()
    logits = loaded(input_ids=batch.input_ids).logits.log_softmax(-1)
    picked = logits.gather(-1, batch.targets.clamp_min(0)[..., None])[..., 0]
    mine = _completion_logprob(model, batch)
    torch.testing.assert_close((picked * (batch.targets != IGNORE)).sum(1), mine, atol=0.1, rtol=0)


@pytest.mark.usefixtures("gloo_world1")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_the_loss_forwards_detached_logprobs_are_a_no_grad_forwards(
    strategy: str, tiny_llama_folder: Path
) -> None:
    """π_old without a second forward: the learner takes one step per batch, so the loss
    forward runs on the weights before the update; its log-probabilities, detached, are what
    a separate no-grad forward (verl's and TRL's old_log_prob) computes."""
    model = _model(strategy)
    batch = _on_policy_batch(model, 0.8)
    with torch.no_grad():
        separate, _ = policy_logprobs(model, batch.input_ids, batch.targets, 0.8)
    with_grad, _ = policy_logprobs(model, batch.input_ids, batch.targets, 0.8)
    assert with_grad.requires_grad
    torch.testing.assert_close(with_grad.detach(), separate, rtol=0, atol=1e-6)


def _nan_loss(model: modeling.TrainModel, batch: Any) -> Any:
    """A NaN advantage, as a reward of -inf gave before rewards were checked: a NaN loss."""
    batch.advantages = torch.tensor([float("nan"), 0.0])
    return None


def _inf_grad(model: modeling.TrainModel, batch: Any) -> Any:
    """A finite loss whose gradient overflows in one parameter."""
    param = next(model.module.parameters())
    return param.register_hook(lambda grad: grad * float("inf"))


@pytest.mark.usefixtures("gloo_world1")
@pytest.mark.parametrize("inject", [_nan_loss, _inf_grad], ids=["nan_loss", "inf_grad"])
@pytest.mark.parametrize("grad_clip", [1.0, 0.0])
def test_a_non_finite_step_is_skipped_and_reported(
    inject: Any, grad_clip: float, tiny_llama_folder: Path, tmp_path: Path
) -> None:
    """verl's actor skips the optimizer step when the grad norm is not finite; so does the
    learner (the loss too): the weights stay as they were (AdamW's decay would have moved them
    even with zero gradients), the step is reported, the next good step learns normally, and
    the published version holds the last finite weights."""
    model = _model("ddp")
    batch = _on_policy_batch(model, 1.0)
    optimizer = build_optimizer(model.module, lr=0.0, weight_decay=0.1)
    learner = GRPOLearner(
        model,
        optimizer,
        settings=LossSettings(),
        temperature=1.0,
        device=torch.device("cpu"),
        grad_clip=grad_clip,
    )
    params = {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    good_advantages = batch.advantages
    hook = inject(model, batch)
    metrics = learner.step(batch, lr=3e-3)
    assert metrics["step_skipped"] == 1.0 and metrics["skipped_steps"] == 1.0
    assert not math.isfinite(metrics["grad_norm"])
    assert learner.version == 1 and learner.skipped_steps == 1
    for key, value in model.module.state_dict().items():
        torch.testing.assert_close(value, params[key], rtol=0, atol=0)
    assert all(p.grad is None for p in model.module.parameters())  # nothing carried over
    published = write_folder(learner, str(tmp_path), PolicyStore(max_staleness=0))
    assert published.policy is not None and published.policy.version == 1
    from safetensors.torch import load_file

    for shard in Path(str(published.policy.path)).glob("*.safetensors"):
        assert all(torch.isfinite(t).all() for t in load_file(shard).values())
    if hook is not None:
        hook.remove()
    batch.advantages = good_advantages
    metrics = learner.step(batch, lr=3e-3)
    assert metrics["step_skipped"] == 0.0 and metrics["skipped_steps"] == 1.0
    assert math.isfinite(metrics["grad_norm"]) and metrics["grad_norm"] > 0
    assert learner.version == 2
    moved = [k for k, v in model.module.state_dict().items() if not torch.equal(v, params[k])]
    assert moved  # the good step updated the weights


@pytest.mark.usefixtures("gloo_world1")
def test_the_clip_acts_only_with_more_than_one_optimizer_step_per_batch(
    tiny_llama_folder: Path,
) -> None:
    """One optimizer step per batch: π_old is the loss forward's own, the ratio is exactly 1
    and nothing is clipped. Two PPO epochs: π_old is the no-grad pass before the first update,
    the second epoch's ratio departs from 1 and the clip acts (verl's and TRL's
    ``ppo_epochs`` / ``num_iterations``)."""
    found = {}
    for epochs in (1, 2):
        model = _model("ddp")
        batch = _on_policy_batch(model, 1.0)
        optimizer = build_optimizer(model.module, lr=0.0, weight_decay=0.0)
        learner = GRPOLearner(model, optimizer, settings=LossSettings(), temperature=1.0,
                              device=torch.device("cpu"), ppo_epochs=epochs)  # fmt: skip
        found[epochs] = learner.step(batch, lr=5e-2)
        assert learner.version == 1 and found[epochs]["optimizer_steps"] == epochs
    assert found[1]["clip_fraction"] == 0.0 and found[1]["ratio"] == 1.0
    assert found[2]["clip_fraction"] > 0.0, found[2]
    assert found[2]["ratio"] != 1.0
