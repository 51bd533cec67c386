"""The RL run's configuration: one dataclass, its CLI, its prompt template.

The RayJob of `park:rl` renders ``python -m workloads.rl --flag value ...`` from the field
names here (``group_size`` → ``--group-size``), the way the trainer's does from
workloads/train/config.py; ``parse_args(shlex.split(to_entrypoint(c))[3:]) == c``. Its
validation, ``parse_args`` and the entrypoints are in workloads/rl/config_check.py, above this
module. Precedence: dataclass defaults < ``--config FILE`` < CLI flags.

Nothing here imports torch, Ray or vLLM.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from workloads import flags
from workloads.flags import FlagConfig, opt
from workloads.flags import stack as key
from workloads.rl.rewards import BUILTINS
from workloads.train.config_rules import (
    ACCELERATORS,
    STRATEGIES,
)

RL_MODULE = "workloads.rl"
RL_COMMAND = ("python", "-m", RL_MODULE)
ROLLOUT_ACCELERATORS = ("auto", "tpu", "gpu", "cpu")
INITS = ("pretrained", "config")
# `package.module:function` (dotted attributes after the colon allowed, as rewards.resolve).
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
REWARD_NAME = re.compile(rf"^{_IDENT}(\.{_IDENT})*:{_IDENT}(\.{_IDENT})*$")
PROMPT_DATA_KINDS = ("text", "hf", "folder")  # .jsonl/.json/.parquet, hf:, a folder of them
# The off-policy corrections of the loss (workloads/rl/grpo.py says what each is) and their
# defaults: TRL's vllm_importance_sampling_cap and verl's rollout_is_threshold (2), verl's
# clip_ratio_c (3).
CORRECTIONS = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask", "bypass")
# How advantages are scaled (TRL's scale_rewards): by the group's std, the batch's, or not.
REWARD_SCALINGS = ("group", "batch", "none")
# Bounds of the options of issue 40: PPO epochs and mini-batches per batch (each an optimizer
# step), extra rounds of dynamic sampling, chat-template arguments, and evaluation.
MAX_PPO_EPOCHS = 8
MAX_MINI_BATCHES = 64
MAX_RESAMPLE_ROUNDS = 8
MAX_TEMPLATE_ARGS = 8
MAX_EVAL_PROMPTS = 1024
MAX_EVAL_SHARE = 0.5
DEFAULT_IS_CAP = 2.0
DEFAULT_CLIP_RATIO_C = 3.0
# How new weights reach the engines (workloads/rl/sync.py): bf16 buckets through Ray's object
# store, one receiver per engine host; or a bf16 safetensors folder every engine reads.
WEIGHT_SYNCS = ("ray", "folder")
PROMPT_PLACEHOLDER = "{prompt}"
# Bounds that keep one step's work and the preview's arithmetic finite: completions per prompt
# (the references use 4-64), completions per step (rank 0 holds them, the store queues two
# rounds of them), and a staleness no run would want.
MAX_GROUP_SIZE = 64
MAX_BATCH = 16384
MAX_STALENESS = 8
# Rounds the rollout store holds at most: the one the learner takes and the one sampled ahead.
STORE_ROUNDS = 2


@dataclass(frozen=True)
class RLRunConfig(FlagConfig):
    """Everything a GRPO run on a cluster needs; every field is a ``--flag``. A field with a
    ``stack=key(...)`` is also a key of the stack's ``park:rl`` section, declared here (see
    workloads/train/config.py TrainConfig)."""

    # The learner: Ray Train workers, one per chip of the learner slice.
    accelerator: str = opt("auto", "learner: tpu, gpu, cpu or auto", choices=ACCELERATORS)
    num_workers: int | None = opt(None, "learner workers (TPU: chips of the slice)", type=int)
    tpu_topology: str | None = opt(None, "learner slice topology, e.g. 2x4")
    tpu_accelerator_type: str = opt("TPU-V6E", "Ray accelerator type of the learner slice")
    torch_tpu_topology: str | None = opt(None, "learner TORCH_TPU_TOPOLOGY, e.g. 2,4,1")
    chips_per_host: int | None = opt(None, "learner TPU chips per host", type=int)
    strategy: str = opt(
        "fsdp2",
        "learner data parallelism: ddp or fsdp2",
        choices=STRATEGIES,
        stack=key("Learner: `ddp` or `fsdp2`."),
    )
    micro_batch_size: int | None = opt(
        None,
        "sequences per learner forward/backward per worker (default: its whole share)",
        type=int,
        stack=key("Completions per chip per pass; unset: the most that fit.", ge=1),
    )
    activation_checkpointing: bool = opt(
        False,
        "recompute activations in backward",
        type=bool,
        stack=key("Learner: recompute activations in backward."),
    )
    # The rollout engines: vLLM as Ray actors on the rollout slice(s).
    rollout_accelerator: str = opt(
        "auto", "rollout engines: tpu, gpu, cpu or auto", choices=ROLLOUT_ACCELERATORS
    )
    rollout_engines: int = opt(1, "vLLM engines (Ray actors)", type=int)
    rollout_tensor_parallel_size: int = opt(
        1,
        "chips (or GPUs) per engine",
        type=int,
        stack=key(
            "Chips per rollout engine; unset: the smallest that fits.",
            key="tensor_parallel_size",
            default=None,
            ge=1,
        ),
    )
    rollout_torch_tpu_topology: str | None = opt(
        None, "TORCH_TPU_TOPOLOGY of one engine using fewer chips than its host, e.g. 1,1,1"
    )
    rollout_resource: str | None = opt(
        None,
        "a Ray custom resource only the rollout pods advertise (one per chip or GPU); engines "
        "ask for it so they never land on the learner's slice (unset: any node)",
    )
    gpu_memory_utilization: float = opt(
        0.9,
        "share of each chip's memory vLLM keeps",
        type=float,
        stack=key("Share of each chip's memory a vLLM engine keeps.", gt=0, le=1),
    )
    # The policy and the task.
    model: str = opt(
        "",
        "Hugging Face causal LM: hub id, gs://bucket/folder or a local folder",
        stack=key("The policy: HF hub id, `gs://`, or a bucket-mount path."),
    )
    init: str = opt(
        "pretrained",
        "pretrained weights, or config (random)",
        choices=INITS,
        stack=key("`pretrained` weights or `config` (random)."),
    )
    data: str = opt(
        "",
        "prompts with answers: .jsonl/.json/.parquet (file, folder, gs://) or hf:",
        stack=key("Prompts with answers: jsonl/json/parquet or `hf:NAME[:CONFIG]`."),
    )
    data_split: str = opt(
        "train", "split of an hf: data set", stack=key("Split of an `hf:` data set.")
    )
    prompt_field: str = opt(
        "prompt", "record field of the prompt", stack=key("Record field of the prompt.")
    )
    answer_field: str = opt(
        "answer",
        "record field of the reference answer",
        stack=key("Record field of the reference answer."),
    )
    rewards: str = opt(
        "numeric",
        f"comma-separated rewards: {', '.join(BUILTINS)} or module:function",
        stack=key(
            "`exact_match`, `numeric`, `format`, or `module:function`; summed.",
            default=["numeric"],
            type=list[str],
        ),
    )
    reward_weights: str | None = opt(
        None,
        "comma-separated weights, one per reward (default 1)",
        stack=key("One weight per reward (default 1 each).", type=list[float]),
    )
    scale_rewards: str = opt(
        "group",
        "advantages divided by the group's reward std, the batch's, or none (TRL's scale_rewards)",
        choices=REWARD_SCALINGS,
        stack=key("Advantage scale: the `group`'s reward std, the `batch`'s, or `none`."),
    )
    reward_gate: bool = opt(
        False,
        "rewards after the first count only where the first is > 0 (a format bonus when right)",
        type=bool,
        stack=key("Rewards after the first count only where the first is right (> 0)."),
    )
    chat_template_args: str | None = opt(
        None,
        "comma-separated key=value for the chat template, e.g. enable_thinking=false (Qwen3)",
        stack=key("Chat-template arguments, e.g. `[enable_thinking=false]`.", type=list[str]),
    )
    mask_truncated: bool = opt(
        False,
        "completions cut at --max-response-tokens leave the loss (overlong masking)",
        type=bool,
        stack=key("Truncated completions leave the loss (overlong masking)."),
    )
    dynamic_sampling: int = opt(
        0,
        "extra rounds at most that replace groups whose rewards are all equal (0: off)",
        type=int,
        stack=key(
            "Extra rounds replacing flat groups (DAPO; 0: off, ≤ 8).",
            ge=0,
            le=MAX_RESAMPLE_ROUNDS,
        ),
    )
    # GRPO.
    group_size: int = opt(
        8,
        "completions sampled per prompt",
        type=int,
        stack=key(
            "Completions sampled per prompt (2 to 64: advantages are within a group).",
            ge=1,
            le=MAX_GROUP_SIZE,
        ),
    )
    prompts_per_step: int = opt(
        32,
        "prompts per learner step",
        type=int,
        stack=key("Prompts per learner step (x groupSize: a multiple of the chips).", ge=1),
    )
    temperature: float = opt(
        1.0,
        "sampling temperature",
        type=float,
        stack=key("Sampling temperature of the rollouts.", key="sampling_temperature", gt=0),
    )
    max_prompt_tokens: int = opt(
        512,
        "prompts longer than this are left out",
        type=int,
        stack=key("Longest prompt; with maxResponseTokens the engines' context.", ge=1),
    )
    max_response_tokens: int = opt(
        1024,
        "tokens sampled per completion at most",
        type=int,
        stack=key("Tokens sampled per completion at most.", ge=1),
    )
    prompt_template: str = opt(
        PROMPT_PLACEHOLDER,
        "the prompt as asked: {prompt} replaced by the record's prompt",
        stack=key(
            "The prompt as asked; `{prompt}` is the record's, e.g. with a format instruction."
        ),
    )
    reward_timeout_s: float = opt(
        60.0,
        "seconds a reward call may take (then 0)",
        type=float,
        stack=key(
            "A reward call taking longer scores 0 (rewards run concurrently).",
            key="reward_timeout_seconds",
            gt=0,
        ),
    )
    kl_coef: float = opt(
        0.0,
        "weight of the k3 KL to the frozen reference (0: none)",
        type=float,
        stack=key("Weight of the KL to the frozen reference policy (0: none).", ge=0),
    )
    clip_low: float = opt(0.2, "policy-ratio clip below 1", type=float)
    clip_high: float = opt(0.28, "policy-ratio clip above 1", type=float)
    off_policy_correction: str = opt(
        "token_truncate",
        "how the loss corrects for the sampler: token_/sequence_ truncate or mask, or bypass",
        choices=CORRECTIONS,
        stack=key(
            "Loss weights π_old/π_sampler: `token_`/`sequence_` + `truncate`/`mask`, or `bypass`.",
            enum="RlCorrection",
        ),
    )
    importance_sampling_cap: float = opt(
        DEFAULT_IS_CAP,
        "C of the truncated (or masked) importance weights",
        type=float,
        stack=key("C of the importance weights (TRL's and verl's default 2).", ge=1),
    )
    clip_ratio_c: float = opt(
        DEFAULT_CLIP_RATIO_C,
        "dual-clip: a token's loss with A < 0 is at most -A·c",
        type=float,
        stack=key("Dual-clip: a token's loss with a negative advantage is at most -A·c.", gt=1),
    )
    ppo_epochs: int = opt(
        1,
        "passes over each batch (each mini-batch an optimizer step; >1: the clip acts)",
        type=int,
        stack=key(
            "Passes over each batch (> 1: the ratio leaves 1, the clip acts).",
            ge=1,
            le=MAX_PPO_EPOCHS,
        ),
    )
    mini_batches: int = opt(
        1,
        "optimizer steps per pass over a batch",
        type=int,
        stack=key("Optimizer steps per pass over a batch.", ge=1, le=MAX_MINI_BATCHES),
    )
    max_staleness: int = opt(
        1,
        "policy versions a rollout may lag the learner",
        type=int,
        stack=key(
            "Policy versions a rollout may lag the learner (≤ 8, ≤ steps).",
            ge=0,
            le=MAX_STALENESS,
        ),
    )
    overlap: bool = opt(
        True,
        "sample step n+1's rollouts while the learner takes step n (one-step-off)",
        type=bool,
        stack=key(
            "Sample step n+1 while the learner takes step n (one-step-off); false: synchronous."
        ),
    )
    publish_every: int = opt(
        1,
        "publish the policy to the engines every N steps",
        type=int,
        stack=key(
            "Publish the policy to the engines every N learner steps.", key="sync_every", ge=1
        ),
    )
    weight_sync: str = opt(
        "ray",
        "new weights to the engines: ray (object store) or folder",
        choices=WEIGHT_SYNCS,
        stack=key("New weights to the engines: `ray` (bf16 via the object store) or `folder`."),
    )
    steps: int = opt(
        200,
        "learner steps in total (a resumed run continues to this)",
        type=int,
        stack=key("Learner steps in total.", ge=1),
    )
    lr: float = opt(
        1e-6,
        "learning rate (AdamW)",
        type=float,
        stack=key("Learning rate (AdamW).", key="learning_rate", ge=0),
    )
    seed: int = opt(0, "seed for the prompt order and sampling", type=int)
    eval_every: int = opt(
        0,
        "score the held-out prompts (greedy, the run's rewards) every N steps (0: never)",
        type=int,
        stack=key("Score held-out prompts (greedy) every N steps (0: never).", ge=0),
    )
    eval_data: str = opt(
        "",
        "held-out prompts with answers (as --data; default: --eval-share of --data)",
        stack=key("Held-out prompts with answers (as `data`); unset: `evalShare` of it."),
    )
    eval_share: float = opt(
        0.0,
        "share of --data held out for evaluation (0 to 0.5)",
        type=float,
        stack=key("Share of the prompts held out for evaluation.", ge=0, le=MAX_EVAL_SHARE),
    )
    eval_prompts: int = opt(64, "held-out prompts scored each time at most", type=int)
    # Checkpoints, export, reporting.
    checkpoint_every: int = opt(
        50,
        "checkpoint every N steps and at the end",
        type=int,
        stack=key("Learner steps between checkpoints.", ge=1),
    )
    storage_path: str = opt("~/park-runs", "gs://bucket/path on GKE, a local path otherwise")
    run_name: str = opt("park-rl", "run name; rerunning a name resumes its last checkpoint")
    export: bool = opt(
        True,
        "the final policy as a Hugging Face folder",
        type=bool,
        stack=key("The final policy as an HF folder at `.../<run>/export/final`."),
    )
    max_failures: int = opt(
        3,
        "learner worker failures to recover from (-1: forever)",
        type=int,
        stack=key("Restarts from the last checkpoint after a lost learner worker.", ge=0),
    )
    report_every: int = opt(1, "print metrics every N steps", type=int)
    probe_prompts: int = opt(
        0,
        "before the first step, the starting policy's greedy answers to the data's first N "
        "prompts, scored by the rewards (a 'before' to set the final policy's answers against)",
        type=int,
    )

    @property
    def reward_names(self) -> list[str]:
        return [r.strip() for r in self.rewards.split(",") if r.strip()]

    @property
    def weights(self) -> list[float] | None:
        if self.reward_weights is None:
            return None
        return [float(w) for w in self.reward_weights.split(",") if w.strip()]

    @property
    def max_model_len(self) -> int:
        """The engines' context: a prompt and its completion."""
        return self.max_prompt_tokens + self.max_response_tokens

    @property
    def batch(self) -> int:
        """Completions per learner step."""
        return self.prompts_per_step * self.group_size

    @property
    def store_capacity(self) -> int:
        """Rollouts the store may hold: the round the learner takes and the one sampled ahead."""
        return self.batch * STORE_ROUNDS


def build_parser() -> argparse.ArgumentParser:
    """Every default None, so that only given flags override the config file."""
    return flags.build_parser(
        RLRunConfig,
        prog=" ".join(RL_COMMAND),
        description="GRPO: vLLM rollouts and a Ray Train learner.",
    )


# ---- validation -------------------------------------------------------------------------


def render_prompt(template: str, prompt: str) -> str:
    """The prompt as asked: the template with ``{prompt}`` replaced (by text replacement, not
    str.format, so braces in the data stay as they are)."""
    return template.replace(PROMPT_PLACEHOLDER, prompt, 1)
