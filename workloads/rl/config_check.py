"""The RL run's configuration, checked: :func:`validate` (the rules, naming the flag to
change), :func:`parse_args` (the entrypoint's flags, validated) and the RayJob's entrypoint
(:func:`to_entrypoint`, :func:`rl_entrypoint`), after the config's own rules.

The infra side checks a stack's RL job by building the config at preview time
(infra/rules/rl.py), so a flag the workload would refuse fails before anything runs. Above
workloads/rl/config.py (the dataclass, its CLI), which imports nothing of this module. Nothing
here imports torch, Ray or vLLM (the reward names are checked by syntax and against the
built-ins' names; importing a ``module:function`` happens at job start, workloads/rl/rewards.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from workloads import flags
from workloads.flags import ConfigError
from workloads.protocol import flag, render_entrypoint
from workloads.rl.config import (
    CORRECTIONS,
    MAX_BATCH,
    MAX_EVAL_PROMPTS,
    MAX_EVAL_SHARE,
    MAX_GROUP_SIZE,
    MAX_MINI_BATCHES,
    MAX_PPO_EPOCHS,
    MAX_RESAMPLE_ROUNDS,
    MAX_STALENESS,
    MAX_TEMPLATE_ARGS,
    PROMPT_DATA_KINDS,
    PROMPT_PLACEHOLDER,
    REWARD_NAME,
    REWARD_SCALINGS,
    RL_COMMAND,
    STORE_ROUNDS,
    RLRunConfig,
    build_parser,
)
from workloads.rl.rewards import BUILTINS
from workloads.train.config_rules import (
    HF_DATA_PREFIX,
    data_kind,
    topology_chips,
)


def parse_args(argv: Sequence[str] | None = None) -> RLRunConfig:
    """CLI flags over the config file over the defaults; validated."""
    return flags.parse_config(RLRunConfig, build_parser(), argv, validate)


def to_entrypoint(cfg: RLRunConfig | Mapping[str, Any]) -> str:
    """The RayJob entrypoint of a valid config: the values that differ from the defaults."""
    if not isinstance(cfg, RLRunConfig):
        cfg = RLRunConfig.from_dict(cfg)
    validate(cfg)
    return render_entrypoint(flags.changed_values(cfg), RL_COMMAND)


def rl_entrypoint(values: Mapping[str, Any]) -> str:
    """The RayJob entrypoint of these fields, every one given (None left out), after the
    config's own rules: a flag the workload does not know or refuses fails at preview."""
    validate(RLRunConfig.from_dict(values))
    return render_entrypoint(values, RL_COMMAND)


def reward_problem(name: str) -> str | None:
    """Why a reward name cannot be one (None: a built-in, or module:function by syntax)."""
    if name in BUILTINS or REWARD_NAME.match(name):
        return None
    return f"reward {name!r} is neither a built-in ({', '.join(BUILTINS)}) nor module:function"


def validate(cfg: RLRunConfig) -> None:
    """Raise ConfigError naming the flag to fix."""
    for name in ("group_size", "prompts_per_step", "max_prompt_tokens", "max_response_tokens"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{flag(name)} must be >= 1, got {getattr(cfg, name)}")
    for name in ("steps", "publish_every", "rollout_engines", "rollout_tensor_parallel_size"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{flag(name)} must be >= 1, got {getattr(cfg, name)}")
    if cfg.group_size < 2:
        raise ConfigError(
            f"--group-size must be >= 2, got {cfg.group_size}: GRPO's advantage is a completion's "
            "reward against its group's mean, which one completion does not have"
        )
    for name in FLOAT_FLAGS:
        value = getattr(cfg, name)
        if not math.isfinite(value):
            raise ConfigError(f"{flag(name)} must be a finite number, got {value}")
    if cfg.temperature <= 0:
        raise ConfigError(f"--temperature must be > 0 (GRPO samples), got {cfg.temperature}")
    for name in ("kl_coef", "lr", "max_staleness", "checkpoint_every", "probe_prompts"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{flag(name)} must be >= 0, got {getattr(cfg, name)}")
    _validate_bounds(cfg)
    if not 0 < cfg.gpu_memory_utilization <= 1:
        raise ConfigError(
            f"--gpu-memory-utilization must be in (0, 1], got {cfg.gpu_memory_utilization}"
        )
    if not cfg.model:
        raise ConfigError("--model is required: the policy's Hugging Face model")
    _validate_data(cfg)
    _validate_rewards(cfg)
    _validate_options(cfg)
    _validate_eval(cfg)
    if cfg.num_workers is not None and cfg.batch % cfg.num_workers:
        raise ConfigError(
            f"--prompts-per-step {cfg.prompts_per_step} x --group-size {cfg.group_size} = "
            f"{cfg.batch} completions per step must be a multiple of --num-workers "
            f"({cfg.num_workers}, one learner worker per chip)"
        )
    if cfg.num_workers:
        share = cfg.batch // cfg.num_workers
        if share % cfg.mini_batches:
            raise ConfigError(
                f"--mini-batches {cfg.mini_batches} does not divide the {share} completions "
                "each learner worker takes per step"
            )
        mini = share // cfg.mini_batches
        if cfg.micro_batch_size and mini % cfg.micro_batch_size:
            raise ConfigError(
                f"--micro-batch-size {cfg.micro_batch_size} does not divide the {mini} "
                "completions each learner worker takes per optimizer step"
            )
    if cfg.accelerator == "tpu":
        if not cfg.tpu_topology:
            raise ConfigError("--tpu-topology is required with --accelerator tpu")
        chips = topology_chips(cfg.tpu_topology)
        if cfg.num_workers is not None and cfg.num_workers != chips:
            raise ConfigError(
                f"--num-workers {cfg.num_workers}: a {cfg.tpu_topology} learner slice has "
                f"{chips} chips, one worker each"
            )
    if cfg.rollout_torch_tpu_topology:
        topology_chips(cfg.rollout_torch_tpu_topology)


FLOAT_FLAGS = (
    "temperature",
    "kl_coef",
    "clip_low",
    "clip_high",
    "clip_ratio_c",
    "importance_sampling_cap",
    "lr",
    "gpu_memory_utilization",
    "reward_timeout_s",
    "eval_share",
)


def _validate_bounds(cfg: RLRunConfig) -> None:
    """The loss's coefficients, the batch, the staleness and the template, each bounded."""
    if not 0 <= cfg.clip_low < 1:
        raise ConfigError(f"--clip-low must be in [0, 1), got {cfg.clip_low}")
    if cfg.clip_high < 0:
        raise ConfigError(f"--clip-high must be >= 0, got {cfg.clip_high}")
    if cfg.clip_ratio_c <= 1:
        raise ConfigError(
            f"--clip-ratio-c must be > 1 (dual-clip bounds a ratio above 1), got {cfg.clip_ratio_c}"
        )
    if cfg.importance_sampling_cap < 1:
        raise ConfigError(
            f"--importance-sampling-cap must be >= 1, got {cfg.importance_sampling_cap}"
        )
    if cfg.reward_timeout_s <= 0:
        raise ConfigError(f"--reward-timeout-s must be > 0, got {cfg.reward_timeout_s}")
    if cfg.group_size > MAX_GROUP_SIZE:
        raise ConfigError(
            f"--group-size {cfg.group_size}: at most {MAX_GROUP_SIZE} completions per prompt"
        )
    if cfg.batch > MAX_BATCH:
        raise ConfigError(
            f"--prompts-per-step {cfg.prompts_per_step} x --group-size {cfg.group_size} = "
            f"{cfg.batch} completions per step; allowed: at most {MAX_BATCH} (rank 0 holds a "
            f"step's rollouts and the store {STORE_ROUNDS} steps' worth)"
        )
    if cfg.max_staleness > min(MAX_STALENESS, cfg.steps):
        raise ConfigError(
            f"--max-staleness {cfg.max_staleness}: allowed at most {min(MAX_STALENESS, cfg.steps)}"
            f" (--steps {cfg.steps}, and no more than {MAX_STALENESS})"
        )
    lag = cfg.publish_every if cfg.overlap else cfg.publish_every - 1
    if cfg.max_staleness < lag:
        why = "overlap samples on the weights one step behind, and " if cfg.overlap else ""
        raise ConfigError(
            f"--max-staleness {cfg.max_staleness}: {why}--publish-every {cfg.publish_every} "
            f"makes rollouts up to {lag} updates stale; every round would be dropped (allowed: "
            f">= {lag}, or --overlap false)"
        )
    if cfg.prompt_template.count(PROMPT_PLACEHOLDER) != 1:
        raise ConfigError(
            f"--prompt-template must contain {PROMPT_PLACEHOLDER} exactly once, got "
            f"{cfg.prompt_template!r}"
        )


def _validate_data(cfg: RLRunConfig) -> None:
    data = cfg.data
    if not data:
        raise ConfigError("--data is required: prompts with reference answers")
    kind = data_kind(data)
    if kind not in PROMPT_DATA_KINDS or data.endswith(".txt"):
        raise ConfigError(
            f"--data {data!r}: prompts with answers are records: .jsonl, .json or .parquet "
            "(a file, a folder or gs://...), or hf:NAME[:CONFIG]"
        )
    if kind == "hf" and not data.removeprefix(HF_DATA_PREFIX).strip(":"):
        raise ConfigError("--data hf: needs a data set name, e.g. hf:openai/gsm8k:main")
    for name in ("prompt_field", "answer_field"):
        if not getattr(cfg, name):
            raise ConfigError(f"{flag(name)} must name a record field")


def _validate_rewards(cfg: RLRunConfig) -> None:
    names = cfg.reward_names
    if not names:
        raise ConfigError(
            f"--rewards names none; allowed: {', '.join(BUILTINS)} or module:function"
        )
    for name in names:
        problem = reward_problem(name)
        if problem:
            raise ConfigError(f"--rewards: {problem}")
    weights = cfg.weights
    if weights is not None and len(weights) != len(names):
        raise ConfigError(
            f"--reward-weights gives {len(weights)} weight(s) for {len(names)} reward(s)"
        )


def _within(cfg: RLRunConfig, name: str, low: float, high: float) -> None:
    value = getattr(cfg, name)
    if not low <= value <= high:
        raise ConfigError(f"{flag(name)} must be in [{low:g}, {high:g}], got {value}")


def _validate_options(cfg: RLRunConfig) -> None:
    """Reward scaling and gating, chat-template arguments, dynamic sampling, PPO epochs and
    mini-batches, the correction (issue 40), each bounded."""
    for name, allowed in (
        ("scale_rewards", REWARD_SCALINGS),
        ("off_policy_correction", CORRECTIONS),
    ):
        if getattr(cfg, name) not in allowed:
            raise ConfigError(f"{flag(name)} {getattr(cfg, name)!r}: allowed {', '.join(allowed)}")
    if cfg.reward_gate and len(cfg.reward_names) < 2:
        raise ConfigError(
            f"--reward-gate gates the rewards after the first on it; --rewards {cfg.rewards!r} "
            "names one"
        )
    try:
        args = parse_template_args(cfg.chat_template_args or "")
    except ValueError as err:
        raise ConfigError(f"--chat-template-args {cfg.chat_template_args!r}: {err}") from err
    if len(args) > MAX_TEMPLATE_ARGS:
        raise ConfigError(
            f"--chat-template-args gives {len(args)} arguments; allowed at most {MAX_TEMPLATE_ARGS}"
        )
    _within(cfg, "dynamic_sampling", 0, MAX_RESAMPLE_ROUNDS)
    _within(cfg, "ppo_epochs", 1, MAX_PPO_EPOCHS)
    _within(cfg, "mini_batches", 1, MAX_MINI_BATCHES)
    if cfg.batch % cfg.mini_batches:
        raise ConfigError(
            f"--mini-batches {cfg.mini_batches} does not divide the {cfg.batch} completions "
            "of a step"
        )


def _validate_eval(cfg: RLRunConfig) -> None:
    """Evaluation: every N steps on held-out prompts, a separate file or a share of --data."""
    _within(cfg, "eval_every", 0, cfg.steps)
    _within(cfg, "eval_share", 0, MAX_EVAL_SHARE)
    _within(cfg, "eval_prompts", 1, MAX_EVAL_PROMPTS)
    held_out = bool(cfg.eval_data) or cfg.eval_share > 0
    if cfg.eval_data and cfg.eval_share > 0:
        raise ConfigError(
            f"--eval-data {cfg.eval_data!r} and --eval-share {cfg.eval_share}: give one"
        )
    if cfg.eval_every and not held_out:
        raise ConfigError(
            f"--eval-every {cfg.eval_every} needs held-out prompts: --eval-data or --eval-share"
        )
    if held_out and not cfg.eval_every:
        raise ConfigError(
            "--eval-data / --eval-share hold prompts out, but --eval-every is 0: set how often "
            "they are scored"
        )
    if cfg.eval_data and (
        data_kind(cfg.eval_data) not in PROMPT_DATA_KINDS or cfg.eval_data.endswith(".txt")
    ):
        raise ConfigError(
            f"--eval-data {cfg.eval_data!r}: records as --data (.jsonl, .json, .parquet, hf:)"
        )


def parse_template_args(text: str) -> dict[str, bool | int | float | str]:
    """``key=value,key=value`` as keywords: ``true``/``false`` as booleans, numbers as numbers,
    anything else as text. ValueError on a word without ``=`` or with an empty key."""
    out: dict[str, bool | int | float | str] = {}
    for word in (w.strip() for w in text.split(",") if w.strip()):
        name, sep, raw = (part.strip() for part in word.partition("="))
        if not sep or not name.isidentifier():
            raise ValueError(f"{word!r} is not key=value with a Python name for the key")
        value: bool | int | float | str = raw
        if raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            for kind in (int, float):
                try:
                    value = kind(raw)
                    break
                except ValueError:
                    continue
        out[name] = value
    return out
