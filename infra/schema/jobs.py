"""The job sections of the stack spec: `park:training` and `park:rl` (each key a flag of the
job's entrypoint; see infra.schema.models for the rest)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator

from infra.schema._model import _Model
from workloads.train.config import MAX_RETRIES

# Named, so the component arguments' enums (infra/components/_types.py) are these very values:
# the choices of the trainer's flags (workloads/train/config.py).
# BEGIN generated training-enums (python -m infra.tools.fields)
Strategy = Literal["ddp", "fsdp2"]
TrainingInit = Literal["auto", "pretrained", "config"]
ModelSize = Literal["tiny", "small", "gpt2-small", "gpt2-medium", "1b"]
LrSchedule = Literal["cosine", "linear", "constant"]
Objective = Literal["clm", "sft"]
ExportDtype = Literal["auto", "float32", "bfloat16"]
# END generated training-enums


# Bounds of the keys the trainer does not read (its own: workloads/train/config.py).
MAX_DEADLINE_S = 90 * 86_400  # a RayJob's activeDeadlineSeconds: 90 days
MAX_TTL_S = 30 * 86_400


class TrainingConfig(_Model):
    """The training RayJob: a Hugging Face causal LM (or a GPT preset) on the stack's data.

    Most keys are a flag of `python -m workloads.train` (workloads/train/config.py), declared
    there, rendered into the RayJob's entrypoint and checked by that config's own rules at
    preview time; the others are the RayJob's and `park cost`'s."""

    enabled: bool = False
    """Create the RayJob."""
    pool: str = ""
    """TPU pool it runs on."""
    image: str | None = None
    """Image; default: park-workloads, built from this checkout by `pulumi up`."""
    # The keys that are the trainer's flags, each declared once, there (workloads/train/config.py
    # TrainConfig, a field with `stack=`), in its flag order.
    # BEGIN generated training-keys (python -m infra.tools.fields)
    num_slices: int = Field(1, ge=1, le=512)
    """Slices to train across (≤ the pool's slices)."""
    strategy: Strategy = "fsdp2"
    """`ddp` or `fsdp2`."""
    model: str | None = None
    """HF causal LM: hub id, `gs://`, a bucket-mount path, `park:tiny-llama`."""
    tokenizer: str | None = None
    """Tokenizer source like `model` (default: the model's)."""
    init: TrainingInit = "auto"
    """`pretrained` weights or `config` (from scratch); `auto`: by source."""
    model_size: ModelSize = "gpt2-small"
    """GPT preset when no `model`: tiny, small, gpt2-small/-medium, 1b."""
    activation_checkpointing: bool = False
    """Recompute activations in backward (`model` only)."""
    steps: int = Field(1000, ge=1, le=10000000)
    """Optimizer steps in total (a resumed run continues to it)."""
    global_batch_size: int = Field(64, ge=1, le=1048576)
    """Sequences per step, a multiple of the workers (chips)."""
    micro_batch_size: int | None = Field(None, ge=1, le=1048576)
    """Sequences per chip per pass; unset: the most that fit."""
    seq_len: int = Field(1024, ge=8, le=1048576)
    """Tokens per sequence (at most the model's context)."""
    learning_rate: float = Field(0.0003, gt=0, le=1, allow_inf_nan=False)
    """Peak learning rate (AdamW)."""
    warmup_steps: int = Field(10, ge=0, le=10000000)
    """Linear warmup steps, then `lrSchedule`."""
    lr_schedule: LrSchedule = "cosine"
    """`cosine`, `linear` (to `minLrRatio`) or `constant`."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1, allow_inf_nan=False)
    """Final learning rate as a fraction of the peak."""
    data: str = "synthetic"
    """`synthetic`, tokens, jsonl/json/parquet/txt, `hf:NAME`, `park:facts`."""
    objective: Objective = "clm"
    """`clm` (packed text) or `sft` (chat template, loss on responses)."""
    data_split: str = Field("train", max_length=128)
    """Split of an `hf:` data set."""
    text_field: str = "text"
    """Record field with the text (`clm`)."""
    messages_field: str = "messages"
    """Record field with a chat, `[{role, content}]` (`sft`)."""
    prompt_field: str = "prompt"
    """Prompt field(s) of records without a chat (`sft`)."""
    response_field: str = "completion"
    """Response field of records without a chat (`sft`)."""
    checkpoint_every: int = Field(100, ge=1, le=10000000)
    """Steps between checkpoints (sharded DCP, for resume)."""
    keep_checkpoints: int = Field(2, ge=1, le=1000)
    """Checkpoints kept in the bucket."""
    max_failures: int = Field(3, ge=0, le=100)
    """Restarts from the last checkpoint after a lost worker."""
    export: bool = True
    """An HF folder at `.../<run>/export/final` when the run ends."""
    export_every: int = Field(0, ge=0, le=10000000)
    """Also export at every Nth checkpoint (0: only at the end)."""
    export_dtype: ExportDtype = "auto"
    """`auto` (bf16 when trained in bf16), `float32`, `bfloat16`."""
    export_max_shard_size: str = Field("5GB", pattern=r"^[0-9]+(\.[0-9]+)?\s*([KMGT]i?B)$")
    """Largest safetensors file, e.g. `5GB`; more get an index."""
    # END generated training-keys
    ttl_seconds_after_finished: int = Field(600, ge=0, le=MAX_TTL_S)
    """Keep the finished cluster this long, then free TPUs."""
    active_deadline_seconds: int = Field(86400, ge=60, le=MAX_DEADLINE_S)
    """Kill the job after this long."""
    backoff_limit: int = Field(0, ge=0, le=MAX_RETRIES)
    """Retries (each a new Ray cluster)."""
    estimated_step_seconds: float = Field(1.0, gt=0, le=86_400, allow_inf_nan=False)
    """Step time used by `park cost` for the run estimate."""
    # A finished or failed RayJob stays as it is: KubeRay never starts it again, and a
    # `pulumi up` with the same stack sees no change. A new runId is a new RayJob (the old one
    # is replaced) and a new run folder, so the next `up` trains again, from the model.
    run_id: str | None = Field(None, pattern=r"^[a-z0-9]([-a-z0-9]{0,18}[a-z0-9])?$")
    """Names the run; a new value re-runs training on the next `up` (new RayJob and folder)."""


# The RL job's named choices (workloads/rl/config.py), named so that its generated keys fit.
# BEGIN generated rl-enums (python -m infra.tools.fields)
RlCorrection = Literal[
    "token_truncate",
    "token_mask",
    "sequence_truncate",
    "sequence_mask",
    "bypass",
]
# END generated rl-enums


class RlConfig(_Model):
    """`park:rl`: a GRPO job (workloads/rl) on two pools of one Ray cluster: a learner (Ray
    Train, one worker per chip, FSDP2) and vLLM rollout engines exchanging weights. Most keys
    are a flag of `python -m workloads.rl` (workloads/rl/config.py), declared there; the others
    are the RayJob's and `park cost`'s. infra/rules/rl.py checks both sides' fit."""

    enabled: bool = False
    """Create the RL RayJob."""
    learner_pool: str = ""
    """TPU pool of the learner (one Ray Train worker per chip, one slice)."""
    rollout_pool: str = ""
    """TPU or GPU pool of the rollout engines (not the learner's)."""
    image: str | None = None
    """Image; default: park-workloads, built from this checkout by `pulumi up`."""
    # The keys that are the RL workload's flags, each declared once, there (workloads/rl/config.py
    # RLRunConfig, a field with `stack=`), in its flag order.
    # BEGIN generated rl-keys (python -m infra.tools.fields)
    strategy: Literal["ddp", "fsdp2"] = "fsdp2"
    """Learner: `ddp` or `fsdp2`."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Completions per chip per pass; unset: the most that fit."""
    activation_checkpointing: bool = False
    """Learner: recompute activations in backward."""
    tensor_parallel_size: int | None = Field(None, ge=1)
    """Chips per rollout engine; unset: the smallest that fits."""
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, allow_inf_nan=False)
    """Share of each chip's memory a vLLM engine keeps."""
    model: str = ""
    """The policy: HF hub id, `gs://`, or a bucket-mount path."""
    init: Literal["pretrained", "config"] = "pretrained"
    """`pretrained` weights or `config` (random)."""
    data: str = ""
    """Prompts with answers: jsonl/json/parquet or `hf:NAME[:CONFIG]`."""
    data_split: str = "train"
    """Split of an `hf:` data set."""
    prompt_field: str = "prompt"
    """Record field of the prompt."""
    answer_field: str = "answer"
    """Record field of the reference answer."""
    rewards: list[str] = ["numeric"]
    """`exact_match`, `numeric`, `format`, or `module:function`; summed."""
    reward_weights: list[float] | None = None
    """One weight per reward (default 1 each)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantage scale: the `group`'s reward std, the `batch`'s, or `none`."""
    reward_gate: bool = False
    """Rewards after the first count only where the first is right (> 0)."""
    chat_template_args: list[str] | None = None
    """Chat-template arguments, e.g. `[enable_thinking=false]`."""
    mask_truncated: bool = False
    """Truncated completions leave the loss (overlong masking)."""
    dynamic_sampling: int = Field(0, ge=0, le=8)
    """Extra rounds replacing flat groups (DAPO; 0: off, ≤ 8)."""
    group_size: int = Field(8, ge=1, le=64)
    """Completions sampled per prompt (2 to 64: advantages are within a group)."""
    prompts_per_step: int = Field(32, ge=1)
    """Prompts per learner step (x groupSize: a multiple of the chips)."""
    sampling_temperature: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Sampling temperature of the rollouts."""
    max_prompt_tokens: int = Field(512, ge=1)
    """Longest prompt; with maxResponseTokens the engines' context."""
    max_response_tokens: int = Field(1024, ge=1)
    """Tokens sampled per completion at most."""
    prompt_template: str = "{prompt}"
    """The prompt as asked; `{prompt}` is the record's, e.g. with a format instruction."""
    reward_timeout_seconds: float = Field(60.0, gt=0, allow_inf_nan=False)
    """A reward call taking longer scores 0 (rewards run concurrently)."""
    kl_coef: float = Field(0.0, ge=0, allow_inf_nan=False)
    """Weight of the KL to the frozen reference policy (0: none)."""
    off_policy_correction: RlCorrection = "token_truncate"
    """Loss weights π_old/π_sampler: `token_`/`sequence_` + `truncate`/`mask`, or `bypass`."""
    importance_sampling_cap: float = Field(2.0, ge=1, allow_inf_nan=False)
    """C of the importance weights (TRL's and verl's default 2)."""
    clip_ratio_c: float = Field(3.0, gt=1, allow_inf_nan=False)
    """Dual-clip: a token's loss with a negative advantage is at most -A·c."""
    ppo_epochs: int = Field(1, ge=1, le=8)
    """Passes over each batch (> 1: the ratio leaves 1, the clip acts)."""
    mini_batches: int = Field(1, ge=1, le=64)
    """Optimizer steps per pass over a batch."""
    max_staleness: int = Field(1, ge=0, le=8)
    """Policy versions a rollout may lag the learner (≤ 8, ≤ steps)."""
    overlap: bool = True
    """Sample step n+1 while the learner takes step n (one-step-off); false: synchronous."""
    sync_every: int = Field(1, ge=1)
    """Publish the policy to the engines every N learner steps."""
    weight_sync: Literal["ray", "folder"] = "ray"
    """New weights to the engines: `ray` (bf16 via the object store) or `folder`."""
    steps: int = Field(200, ge=1)
    """Learner steps in total."""
    learning_rate: float = Field(1e-06, ge=0, allow_inf_nan=False)
    """Learning rate (AdamW)."""
    eval_every: int = Field(0, ge=0)
    """Score held-out prompts (greedy) every N steps (0: never)."""
    eval_data: str = ""
    """Held-out prompts with answers (as `data`); unset: `evalShare` of it."""
    eval_share: float = Field(0.0, ge=0, le=0.5, allow_inf_nan=False)
    """Share of the prompts held out for evaluation."""
    checkpoint_every: int = Field(50, ge=1)
    """Learner steps between checkpoints."""
    export: bool = True
    """The final policy as an HF folder at `.../<run>/export/final`."""
    max_failures: int = Field(3, ge=0)
    """Restarts from the last checkpoint after a lost learner worker."""
    # END generated rl-keys
    ttl_seconds_after_finished: int = Field(600, ge=0)
    """Keep the finished cluster this long, then free the TPUs."""
    active_deadline_seconds: int = Field(86400, ge=60)
    """Kill the job after this long."""
    backoff_limit: int = Field(0, ge=0)
    """Retries (each a new Ray cluster)."""
    estimated_step_seconds: float = Field(30.0, gt=0, allow_inf_nan=False)
    """Step time (rollout + learner + sync) for `park cost`."""

    @field_validator("reward_weights")
    @classmethod
    def _finite_weights(cls, weights: list[float] | None) -> list[float] | None:
        if weights is not None and not all(math.isfinite(w) for w in weights):
            raise ValueError(f"every weight must be a finite number, got {weights}")
        return weights
