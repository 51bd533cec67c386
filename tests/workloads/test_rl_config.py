"""workloads/rl/config.py: the RL entrypoint's flags render and parse back, and its own rules
refuse what GRPO cannot run, naming the flag."""

from __future__ import annotations

import shlex

import pytest

from workloads.flags import ConfigError
from workloads.rl.config import RL_COMMAND, RLRunConfig
from workloads.rl.config_check import parse_args, reward_problem, to_entrypoint
from workloads.rl.rewards import BUILTINS

BASE = {"model": "park:tiny-llama", "data": "/tmp/prompts.jsonl"}


@pytest.mark.parametrize(
    "values",
    [
        BASE,
        {**BASE, "rewards": "numeric,format", "reward_weights": "1,0.1", "group_size": 4},
        {**BASE, "accelerator": "tpu", "num_workers": 8, "tpu_topology": "2x4", "export": False},
        {**BASE, "data": "hf:openai/gsm8k:main", "lr": 3e-7, "temperature": 0.7},
        {**BASE, "overlap": False, "max_staleness": 0, "off_policy_correction": "bypass"},
        {**BASE, "prompt_template": "{prompt} Answer after ####.", "weight_sync": "folder"},
    ],
)
def test_entrypoint_round_trips(values):
    cfg = RLRunConfig.from_dict(values)
    words = shlex.split(to_entrypoint(cfg))
    assert tuple(words[:3]) == RL_COMMAND
    assert parse_args(words[3:]) == cfg


def test_builtin_reward_names_are_the_rewards_modules():
    assert all(reward_problem(name) is None for name in BUILTINS)
    assert reward_problem("my_pkg.scoring:check_answer") is None
    assert reward_problem("my_pkg.scoring:Scorer.check") is None
    for bad in ("not a reward", "module:", ":fn", "a-b:c", "numerik"):
        assert reward_problem(bad) is not None


@pytest.mark.parametrize(
    ("change", "flag"),
    [
        ({"group_size": 1}, "--group-size"),
        ({"rewards": "numeric,oops"}, "--rewards"),
        ({"reward_weights": "1,2"}, "--reward-weights"),
        ({"data": "/tmp/notes.txt"}, "--data"),
        ({"model": ""}, "--model"),
        ({"temperature": 0.0}, "--temperature"),
        ({"num_workers": 3, "prompts_per_step": 2, "group_size": 4}, "--num-workers"),
        ({"accelerator": "tpu", "num_workers": 8, "tpu_topology": "2x2"}, "--num-workers"),
        ({"lr": float("nan")}, "--lr"),
        ({"kl_coef": float("inf")}, "--kl-coef"),
        ({"clip_ratio_c": 1.0}, "--clip-ratio-c"),
        ({"importance_sampling_cap": 0.5}, "--importance-sampling-cap"),
        ({"group_size": 65}, "--group-size"),
        ({"prompts_per_step": 4096, "group_size": 8}, "--prompts-per-step"),
        ({"max_staleness": 0}, "--max-staleness"),  # overlap samples one version behind
        ({"max_staleness": 3, "steps": 2}, "--max-staleness"),
        ({"prompt_template": "no placeholder"}, "--prompt-template"),
        ({"reward_timeout_s": 0.0}, "--reward-timeout-s"),
    ],
)
def test_refusals_name_the_flag(change, flag):
    with pytest.raises(ConfigError, match=flag):
        parse_args(shlex.split(to_entrypoint_unchecked({**BASE, **change}))[3:])


def to_entrypoint_unchecked(values):
    """The command line without the rules (the parser then applies them)."""
    from workloads.protocol import render_entrypoint

    return render_entrypoint(values, RL_COMMAND)
