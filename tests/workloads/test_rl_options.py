"""Issue 40's options against their references: reward scaling as TRL's ``scale_rewards``
(group, batch or no std), TRL's sequence-level importance sampling, the format bonus gated on
the answer, the truncation share and overlong masking, prompts as token ids with one BOS
(a local tokenizer whose chat template writes BOS), dynamic sampling and evaluation during
training, and the flags refusing what is out of bounds."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import torch

from workloads.flags import ConfigError
from workloads.rl import loop
from workloads.rl.config_check import parse_args, parse_template_args
from workloads.rl.grpo import LossSettings, group_advantages, policy_loss
from workloads.rl.learner import collate
from workloads.rl.parts import Driver
from workloads.rl.prompts import Prompt, PromptOrder, chat_prompt, prompt_token_ids, round_metrics
from workloads.rl.rewards import Rewards
from workloads.rl.rollout import Rollout
from workloads.train.inputs.batches import IGNORE

BASE = {"model": "park:tiny-llama", "data": "/tmp/prompts.jsonl"}


def _cfg(*words: str) -> Any:
    return parse_args(["--model", "m", "--data", "/d.jsonl", *words])


def trl_advantages(rewards: torch.Tensor, n: int, scale: str) -> torch.Tensor:
    """TRL GRPOTrainer._generate_and_score_completions, as written there: the group's mean
    subtracted; ``group``/``none`` compute the group std, ``batch`` ``rewards.std()``; divided by
    ``std + 1e-4`` unless ``none``."""
    mean = rewards.view(-1, n).mean(dim=1).repeat_interleave(n, dim=0)
    advantages = rewards - mean
    if scale in ("group", "none"):
        std = rewards.view(-1, n).std(dim=1).repeat_interleave(n, dim=0)
    else:
        std = rewards.std().expand_as(rewards)
    if scale != "none":
        advantages = advantages / (std + 1e-4)
    return advantages


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_reward_scaling_is_trls_scale_rewards(scale: str) -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.1, 0.1, 1.1, 0.1, 3.0, -1.0, 0.5, 2.0])
    got = group_advantages(rewards, 4, eps=1e-4, scale=scale)
    torch.testing.assert_close(got, trl_advantages(rewards.double(), 4, scale).float())
    # the scales differ: a group's advantages are not the batch's
    other = "batch" if scale != "batch" else "group"
    assert not torch.allclose(got, group_advantages(rewards, 4, eps=1e-4, scale=other))
    with pytest.raises(ValueError, match="scale"):
        group_advantages(rewards, 4, scale="global")


def test_the_format_bonus_alone_is_a_full_size_advantage_unless_gated() -> None:
    """A group all wrong, half formatted: the 0.1 bonus becomes ±0.87 under group scaling (the
    risk issue 40 names); gated on the answer, it is nothing; batch scaling shrinks it."""
    right = "so #### 7"
    wrong_marked, wrong_plain = "so #### 8", "so 8"
    completions = [
        wrong_marked,
        wrong_plain,
        wrong_marked,
        wrong_plain,
        right,
        wrong_plain,
        right,
        wrong_plain,
    ]
    open_ = Rewards(["numeric", "format"], [1.0, 0.1])
    gated = Rewards(["numeric", "format"], [1.0, 0.1], gate=True)
    values = [open_(prompt="", completion=c, answer="7") for c in completions]
    gated_values = [gated(prompt="", completion=c, answer="7") for c in completions]
    assert values[:4] == [0.1, 0.0, 0.1, 0.0] and gated_values[:4] == [0.0] * 4
    assert gated_values[4] == pytest.approx(1.1) and gated_values[5] == 0.0
    group = group_advantages(torch.tensor(values), 4)
    assert group[:4].abs().min() > 0.8  # a formatted wrong answer as advantaged as a right one
    assert torch.all(group_advantages(torch.tensor(gated_values), 4)[:4] == 0)
    assert group_advantages(torch.tensor(values), 4, scale="batch")[:4].abs().max() < 0.2


def _loss_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    shape = (4, 6)
    sampler = -torch.rand(shape, generator=gen) * 2
    old = sampler + 0.3 * torch.randn(shape, generator=gen)
    new = old + 0.2 * torch.randn(shape, generator=gen)
    advantages = torch.tensor([1.0, -0.5, 0.7, -1.2])
    mask = torch.ones(shape, dtype=torch.bool)
    mask[1, 4:] = False
    mask[3, 2:] = False
    return new, old, sampler, advantages, mask


def trl_loss(new, old, sampler, advantages, mask, mode, cap, eps_low, eps_high):
    """TRL GRPOTrainer: ``is_ratio`` from ``(old - sampling) * mask`` summed per sequence for
    the sequence modes, ``clamp(max=cap)`` (truncate) or ``masked_fill(> cap, 0)`` (mask);
    ``per_token_loss = -min(r·A, clip(r)·A) * is_ratio``; DAPO's token mean."""
    diff = (old - sampler) * mask
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    is_ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        is_ratio = torch.clamp(is_ratio, max=cap)
    else:
        is_ratio = is_ratio.masked_fill(is_ratio > cap, value=0.0)
    ratio = torch.exp(new - old)
    a = advantages[:, None]
    per_token = -torch.min(ratio * a, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * a)
    per_token = per_token * is_ratio
    return (per_token * mask).sum() / mask.sum().clamp(min=1.0)


@pytest.mark.parametrize("mode", ["sequence_mask", "sequence_truncate"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sequence_level_importance_sampling_is_trls(mode: str, seed: int) -> None:
    new, old, sampler, advantages, mask = _loss_inputs(seed)
    # no dual clip in TRL: a bound no token reaches
    settings = LossSettings(0.2, 0.28, correction=mode, is_cap=1.5, clip_ratio_c=1e9)
    theirs_new = new.clone().requires_grad_(True)
    ours_new = new.clone().requires_grad_(True)
    want = trl_loss(theirs_new, old, sampler, advantages, mask, mode, 1.5, 0.2, 0.28)
    got, metrics = policy_loss(ours_new, sampler, advantages, mask, settings, old_logprobs=old)
    torch.testing.assert_close(got, want)
    want.backward()
    got.backward()
    torch.testing.assert_close(ours_new.grad, theirs_new.grad)
    if mode == "sequence_mask":  # some sequence passes the cap in these draws and is masked
        seq = torch.exp(((old - sampler) * mask).sum(-1))
        assert (metrics["is_cut_fraction"] > 0) == bool((seq > 1.5).any())


def test_with_old_logprobs_the_ratio_departs_from_one_and_the_clip_acts() -> None:
    new, old, sampler, advantages, mask = _loss_inputs(0)
    _, own = policy_loss(new, sampler, advantages, mask, LossSettings())
    assert own["clip_fraction"] == 0 and own["ratio"] == pytest.approx(1.0)
    _, moved = policy_loss(new, sampler, advantages, mask, LossSettings(), old_logprobs=old)
    assert moved["clip_fraction"] > 0


def _rollout(text: str, finish: str | None, n: int = 3, index: int = 0) -> Rollout:
    return Rollout(index, [1, 2], list(range(5, 5 + n)), text, [-0.5] * n, 0, finish)


def test_truncation_share_and_overlong_masking() -> None:
    rollouts = [
        _rollout("a", "length"),
        _rollout("b", "stop"),
        _rollout("c", "stop", 2),
        _rollout("d", "length", 1),
    ]
    metrics = round_metrics(rollouts, [1.0, 0.0, 0.5, 0.5], 2, 0)
    assert metrics["truncated"] == 0.5
    kept = collate(rollouts, torch.zeros(4), 0)
    masked = collate(rollouts, torch.zeros(4), 0, mask_truncated=True)
    assert kept.n_tokens == 9 and masked.n_tokens == 5
    assert torch.all(masked.targets[0] == IGNORE) and torch.all(masked.targets[3] == IGNORE)
    assert torch.equal(masked.targets[1], kept.targets[1])
    assert torch.equal(masked.input_ids, kept.input_ids)


def _bos_tokenizer() -> Any:
    """A word-level tokenizer that adds ``<s>`` itself, with a chat template that writes
    ``{{ bos_token }}`` too (as Llama 3's and Gemma's do) and reads ``enable_thinking``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<s>", "</s>", "<unk>", "user:", "assistant:", "<think>", "hi", "there", "\n"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 0)]
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}user: {{ m['content'] }} {% endfor %}"
        "assistant: {% if enable_thinking is defined and not enable_thinking %}<think> {% endif %}"
    )
    return tok


def test_prompts_go_to_the_engine_as_token_ids_with_one_bos() -> None:
    tok = _bos_tokenizer()
    rendered = chat_prompt(tok, "hi there")
    # the old way: the template's text tokenized again (as vLLM does with text) has two BOS
    assert tok(rendered)["input_ids"][:2] == [0, 0]
    ids = prompt_token_ids(tok, "hi there")
    assert ids[0] == 0 and ids.count(0) == 1
    # Hugging Face's own tokenized template is the reference
    reference = tok.apply_chat_template(
        [{"role": "user", "content": "hi there"}], tokenize=True, add_generation_prompt=True
    )
    reference = reference["input_ids"] if not isinstance(reference, list) else reference
    assert ids == list(reference)
    # per-stack template arguments reach the template
    thinking_off = prompt_token_ids(tok, "hi", parse_template_args("enable_thinking=false"))
    assert thinking_off[-1] == tok.convert_tokens_to_ids("<think>")
    assert prompt_token_ids(tok, "hi")[-1] == tok.convert_tokens_to_ids("assistant:")
    # no template: the tokenizer's own single BOS
    tok.chat_template = None
    assert prompt_token_ids(tok, "hi there") == [0, 6, 7]


def test_template_arguments_parse_typed() -> None:
    assert parse_template_args("enable_thinking=false, n=2, t=0.5, s=x") == {
        "enable_thinking": False,
        "n": 2,
        "t": 0.5,
        "s": "x",
    }
    for bad in ("enable_thinking", "=1", "a b=1"):
        with pytest.raises(ValueError):
            parse_template_args(bad)


def test_dynamic_sampling_replaces_flat_groups_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first round has one informative group of two, the next none, the one after two:
    with 0 or 1 extra rounds the step keeps the informative group and fills with a flat one;
    with 2, two informative groups."""
    from workloads.rl.prompts import Scores

    def round_of(values: list[float]) -> tuple[list[Rollout], Scores, Any, float]:
        rollouts = [_rollout(str(v), "stop") for v in values]
        return rollouts, Scores(values, 0, 0.0), None, 0.0

    class FakeDriver:
        def launch(self, cfg: Any) -> Any:
            return None

    first = round_of([1.0, 1.0, 0.0, 1.0])
    cases = ((0, [0.0, 1.0, 1.0, 1.0]), (1, [0.0, 1.0, 1.0, 1.0]), (2, [0.0, 1.0, 0.0, 1.0]))
    for extra, want in cases:
        rounds = iter([round_of([0.0, 0.0, 1.0, 1.0]), round_of([0.0, 1.0, 0.5, 0.0])])
        monkeypatch.setattr(loop, "_collect", lambda *args, it=rounds: next(it))
        cfg = _cfg("--group-size", "2", "--prompts-per-step", "2", "--dynamic-sampling", str(extra))
        driver: Any = FakeDriver()
        _, values, used_rounds = loop._informative(cfg, driver, None, first[0], first[1].values)  # type: ignore[arg-type]
        assert values == want and used_rounds == extra


def test_evaluation_scores_held_out_prompts_greedily() -> None:
    from workloads.rl.parts import _held_out

    asked: dict[str, Any] = {}

    class FakePool:
        def sample(self, prompts: list[Any], sampling: Any) -> list[Rollout]:
            asked.update(prompts=prompts, sampling=sampling)
            return [
                _rollout("paris" if i % 2 == 0 else "rome", "stop", index=i)
                for i in range(len(prompts))
            ]

    prompts = [Prompt(f"q{i}", "paris") for i in range(10)]
    cfg = _cfg(
        "--eval-every",
        "2",
        "--eval-share",
        "0.2",
        "--eval-prompts",
        "2",
        "--rewards",
        "exact_match",
    )
    train, held = _held_out(cfg, prompts, lambda p: 1)
    assert len(held) == 2 and len(train) == 8 and not set(held) & set(train)
    assert _held_out(cfg, prompts, lambda p: 1) == (train, held)  # the same on a resume
    pool: Any = FakePool()
    rewards = Rewards(["exact_match"])
    driver = Driver(PromptOrder(train), lambda p: p.text, rewards, None, pool, {}, held)
    metrics = driver.evaluate(cfg, 4)
    assert metrics["eval_reward"] == 0.5 and metrics["eval_truncated"] == 0.0
    assert asked["prompts"] == [p.text for p in held]
    assert asked["sampling"].temperature == 0.0 and asked["sampling"].group_size == 1
    history = [{"reward_mean": 0.1, "eval_reward": 0.2}, {"reward_mean": 0.3, "eval_reward": 0.6}]
    assert loop.summary(history) == "reward  0.10 → 0.30   eval reward  0.20 → 0.60"


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"scale_rewards": "global"}, "--scale-rewards"),
        ({"off_policy_correction": "sequence"}, "--off-policy-correction"),
        ({"reward_gate": True}, "--reward-gate"),  # one reward: nothing to gate
        ({"chat_template_args": "enable_thinking"}, "--chat-template-args"),
        ({"chat_template_args": ",".join(f"k{i}=1" for i in range(9))}, "--chat-template-args"),
        ({"dynamic_sampling": 9}, "--dynamic-sampling"),
        ({"dynamic_sampling": -1}, "--dynamic-sampling"),
        ({"ppo_epochs": 0}, "--ppo-epochs"),
        ({"ppo_epochs": 9}, "--ppo-epochs"),
        ({"mini_batches": 65}, "--mini-batches"),
        ({"mini_batches": 3, "prompts_per_step": 2, "group_size": 4}, "--mini-batches"),
        (
            {"num_workers": 2, "mini_batches": 8, "prompts_per_step": 2, "group_size": 4},
            "--mini-batches",
        ),
        ({"num_workers": 1, "mini_batches": 2, "micro_batch_size": 3}, "--micro-batch-size"),
        ({"eval_every": 5}, "--eval-every"),  # nothing held out
        ({"eval_every": 201}, "--eval-every"),
        ({"eval_share": 0.6, "eval_every": 1}, "--eval-share"),
        ({"eval_share": float("nan"), "eval_every": 1}, "--eval-share"),
        ({"eval_share": 0.1}, "--eval-every"),
        ({"eval_data": "/e.jsonl", "eval_share": 0.1, "eval_every": 1}, "--eval-data"),
        ({"eval_data": "/e.txt", "eval_every": 1}, "--eval-data"),
        ({"eval_prompts": 0, "eval_every": 1, "eval_share": 0.1}, "--eval-prompts"),
        ({"eval_prompts": 1025, "eval_every": 1, "eval_share": 0.1}, "--eval-prompts"),
    ],
)
def test_new_options_are_bounded_naming_the_flag(change: dict[str, Any], flag: str) -> None:
    from workloads.rl.config import RLRunConfig
    from workloads.rl.config_check import validate

    with pytest.raises(ConfigError, match=flag):  # a stack's values, as the preview reads them
        validate(RLRunConfig.from_dict({**BASE, **change}))


def test_new_options_default_off_and_round_trip() -> None:
    from workloads.rl.config_check import to_entrypoint

    cfg = _cfg()
    assert (
        cfg.scale_rewards,
        cfg.reward_gate,
        cfg.mask_truncated,
        cfg.dynamic_sampling,
        cfg.ppo_epochs,
        cfg.mini_batches,
        cfg.eval_every,
    ) == ("group", False, False, 0, 1, 1, 0)
    on = _cfg(
        "--rewards",
        "numeric,format",
        "--reward-gate",
        "--scale-rewards",
        "batch",
        "--mask-truncated",
        "--dynamic-sampling",
        "2",
        "--ppo-epochs",
        "2",
        "--mini-batches",
        "4",
        "--off-policy-correction",
        "sequence_mask",
        "--eval-every",
        "5",
        "--eval-data",
        "/e.jsonl",
        "--chat-template-args",
        "enable_thinking=false",
    )
    assert parse_args(shlex.split(to_entrypoint(on))[3:]) == on


def test_the_stack_schemas_correction_choices_are_the_workloads() -> None:
    import typing

    from infra.schema.jobs import RlCorrection
    from workloads.rl.config import CORRECTIONS

    assert typing.get_args(RlCorrection) == CORRECTIONS
