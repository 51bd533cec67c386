"""The training run's configuration: one dataclass, its CLI and its rendering.

The RayJob renders ``python -m workloads.train --flag value ...``; the flag names are a contract
with the infra side, so they are derived from the field names here (``num_workers`` →
``--num-workers``) and :func:`to_entrypoint` renders them back from the same table. Precedence:
dataclass defaults < ``--config FILE`` (YAML or JSON) < CLI flags.

The allowed values and the parsers live in workloads/train/config_rules.py, below this module;
:func:`~workloads.train.config_check.validate`, ``parse_args`` and ``resolve`` in
workloads/train/config_check.py, above it; the config file's reader and the CLI plumbing both
entrypoints share in workloads/flags.py. Nothing here imports torch or Ray: the driver
validates a run before it touches a cluster.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workloads import flags
from workloads.flags import MODEL_RUNS, PRESET_RUNS, ConfigError, FlagConfig, opt
from workloads.flags import stack as key
from workloads.protocol import TRAIN_COMMAND, render_entrypoint
from workloads.train.config_rules import (
    ACCELERATORS,
    BUILTIN_PREFIX,
    EXPORT_DTYPES,
    INITS,
    LR_SCHEDULES,
    MODEL_SIZES,
    OBJECTIVES,
    PRECISIONS,
    STRATEGIES,
)

ENTRYPOINT = " ".join(TRAIN_COMMAND)
DEFAULT_BATCH_PER_WORKER = 4
DEFAULT_HF_SEQ_LEN = 1024  # for --model when --seq-len is not given (capped by the model)
# Tokens whose logits the loss computes at once. The loss never holds full-vocabulary fp32
# logits for a whole micro-batch: it runs the head and the fp32 cross-entropy on this many
# tokens at a time and recomputes each chunk's logits in backward. A chunk costs about 12 bytes
# per logit at its peak in backward (bf16 logits, their fp32 copy, its gradient, the bf16
# gradient; MemTracker under FakeTensorMode, Qwen3-1.7B's head: +1.74 GiB from 1024 to 2048
# tokens), so 1024 tokens hold 1.74 GiB for Qwen's 151,936-token vocabulary and 3.0 GiB for
# Gemma 3's 262,144, of a 31.25 GiB v6e chip, where a whole 4 x 2048 micro-batch would need 8
# times that. A 1024-row matmul still fills the 128x128 (v5e) / 256x256 (v6e) matrix units,
# and micro-batches of a multiple of 1024 tokens (seq lens 1024, 2048, ...) split into equal
# chunks, one compiled program for all of them. infra's training fit reads this number.
LOSS_CHUNK_TOKENS = 1024
# Bounds of the stack's training keys: past these a value is a typo (and some drive the
# planner's loops: the micro-batch search runs over the divisors of a chip's share of the batch).
MAX_STEPS = 10_000_000
MAX_BATCH = 1 << 20  # sequences per step
MAX_SEQ_LEN = 1 << 20  # tokens
MAX_RETRIES = 100


@dataclass(frozen=True)
class TrainConfig(FlagConfig):
    """Everything a training run needs; every field is a ``--flag`` of the entrypoint.

    A field with a ``stack=key(...)`` is also a key of the stack's ``park:training`` section:
    infra derives that key's schema (infra/schema/jobs.py), the RayTrainingJob's argument
    (infra/components/_args.py) and the flag's place in the RayJob's entrypoint from it, in
    this order (`python -m infra.tools.fields` rewrites the first two)."""

    # Where and how wide.
    accelerator: str = opt(
        "auto", "tpu, gpu, cpu, or auto (detect from the Ray cluster)", choices=ACCELERATORS
    )
    num_workers: int | None = opt(
        None,
        "training workers; TPU: chips across all slices "
        "(default: all chips; GPU: all GPUs; CPU: 2)",
        type=int,
    )
    tpu_topology: str | None = opt(None, "slice topology, e.g. 4x4 (required on TPU)")
    tpu_accelerator_type: str = opt("TPU-V6E", "Ray accelerator type of the TPU slice")
    torch_tpu_topology: str | None = opt(
        None,
        "TORCH_TPU_TOPOLOGY, e.g. 4,4,1 (from the "
        "catalog; default: --tpu-topology padded to 3 dims)",
    )
    chips_per_host: int | None = opt(None, "TPU chips per host (checks --num-workers)", type=int)
    num_slices: int = opt(
        1,
        "TPU slices (multi-slice: HSDP across slices)",
        type=int,
        stack=key("Slices to train across (≤ the pool's slices).", ge=1, le=512),
    )
    peak_tflops_per_device: float | None = opt(
        None, "peak bf16 TFLOP/s of one device, for MFU (default: built-in table)", type=float
    )
    # What to train.
    strategy: str = opt(
        "ddp",
        "data parallelism: ddp or fsdp2",
        choices=STRATEGIES,
        stack=key("`ddp` or `fsdp2`.", default="fsdp2", enum="Strategy"),
    )
    model: str | None = opt(
        None,
        "Hugging Face causal LM: a hub id (e.g. Qwen/Qwen2.5-0.5B), gs://bucket/folder, a local "
        "folder, or park:tiny-llama (built here); default: the GPT preset of --model-size",
        stack=key("HF causal LM: hub id, `gs://`, a bucket-mount path, `park:tiny-llama`."),
    )
    tokenizer: str | None = opt(
        None,
        "tokenizer source like --model (default: the model's)",
        stack=key("Tokenizer source like `model` (default: the model's)."),
    )
    init: str = opt(
        "auto",
        "pretrained (the source's weights) or config (random weights, pretraining from "
        "scratch); auto: config for park: models, pretrained otherwise",
        choices=INITS,
        stack=key(
            "`pretrained` weights or `config` (from scratch); `auto`: by source.",
            enum="TrainingInit",
            runs=MODEL_RUNS,
        ),
    )
    model_wait_s: int = opt(
        0,
        "when --model is a folder another job writes (a staged hub model, a run's export): wait "
        "up to this many seconds for its completion marker before failing (0: it must exist)",
        type=int,
    )
    model_size: str = opt(
        "tiny",
        "GPT preset when no --model (synthetic or token-file runs)",
        choices=MODEL_SIZES,
        stack=key(
            "GPT preset when no `model`: tiny, small, gpt2-small/-medium, 1b.",
            default="gpt2-small",
            enum="ModelSize",
            runs=PRESET_RUNS,
        ),
    )
    vocab_size: int | None = opt(None, "override the preset's vocabulary size", type=int)
    precision: str = opt("auto", "bf16 on TPU/GPU, fp32 on CPU when auto", choices=PRECISIONS)
    compile: bool = opt(False, "torch.compile each block (backend 'tpu' on TPU)", type=bool)
    activation_checkpointing: bool = opt(
        False,
        "recompute each block's activations in backward (non-reentrant)",
        type=bool,
        stack=key("Recompute activations in backward (`model` only).", runs=MODEL_RUNS),
    )
    # How long and how fast.
    steps: int = opt(
        100,
        "optimizer steps in total (a resumed run continues to this)",
        type=int,
        stack=key(
            "Optimizer steps in total (a resumed run continues to it).",
            default=1000,
            ge=1,
            le=MAX_STEPS,
        ),
    )
    global_batch_size: int | None = opt(
        None,
        "sequences per step across all workers (default: 4 per worker)",
        type=int,
        stack=key(
            "Sequences per step, a multiple of the workers (chips).", default=64, ge=1, le=MAX_BATCH
        ),
    )
    micro_batch_size: int | None = opt(
        None,
        "sequences per forward/backward on each worker; a step accumulates gradients over "
        "global-batch-size / num-workers / micro-batch-size of them (default: the worker's "
        "whole share in one pass)",
        type=int,
        stack=key("Sequences per chip per pass; unset: the most that fit.", ge=1, le=MAX_BATCH),
    )
    seq_len: int | None = opt(
        None,
        f"tokens per sequence (default: the preset's context; {DEFAULT_HF_SEQ_LEN} for --model, "
        "at most its max_position_embeddings)",
        type=int,
        stack=key(
            "Tokens per sequence (at most the model's context).", default=1024, ge=8, le=MAX_SEQ_LEN
        ),
    )
    lr: float = opt(
        3e-4,
        "peak learning rate (AdamW)",
        type=float,
        stack=key("Peak learning rate (AdamW).", key="learning_rate", gt=0, le=1),
    )
    warmup_steps: int = opt(
        10,
        "linear warmup steps, then --lr-schedule",
        type=int,
        stack=key("Linear warmup steps, then `lrSchedule`.", ge=0, le=MAX_STEPS),
    )
    lr_schedule: str = opt(
        "cosine",
        "after warmup: cosine or linear decay to --min-lr-ratio, or constant",
        choices=LR_SCHEDULES,
        stack=key("`cosine`, `linear` (to `minLrRatio`) or `constant`.", enum="LrSchedule"),
    )
    min_lr_ratio: float = opt(
        0.1,
        "final learning rate as a fraction of --lr",
        type=float,
        stack=key("Final learning rate as a fraction of the peak.", ge=0, le=1),
    )
    weight_decay: float = opt(0.1, "AdamW weight decay on matrices", type=float)
    grad_clip: float = opt(1.0, "max global gradient norm (0: off)", type=float)
    seed: int = opt(0, "seed for weights and data order", type=int)
    # Data.
    data: str = opt(
        "synthetic",
        "synthetic; token files .bin/.npy; text .jsonl/.json/.parquet/.txt (a file, a folder "
        "or gs://...); hf:NAME[:CONFIG] (a hub data set, needs `datasets`); park:facts",
        stack=key("`synthetic`, tokens, jsonl/json/parquet/txt, `hf:NAME`, `park:facts`."),
    )
    objective: str = opt(
        "clm",
        "clm: next-token loss on packed text; sft: chat template, loss on the responses only",
        choices=OBJECTIVES,
        stack=key(
            "`clm` (packed text) or `sft` (chat template, loss on responses).", enum="Objective"
        ),
    )
    data_split: str = opt(
        "train",
        "split of an hf: data set",
        stack=key("Split of an `hf:` data set.", runs=MODEL_RUNS, max_length=128),
    )
    text_field: str = opt(
        "text",
        "record field holding the text (--objective clm)",
        stack=key("Record field with the text (`clm`).", runs=MODEL_RUNS),
    )
    messages_field: str = opt(
        "messages",
        "record field holding a chat, [{role, content}, ...] (--objective sft)",
        stack=key("Record field with a chat, `[{role, content}]` (`sft`).", runs=MODEL_RUNS),
    )
    prompt_field: str = opt(
        "prompt",
        "record field(s) of the prompt when a record has no chat, comma-separated fields are "
        "joined by a blank line (e.g. instruction,input)",
        stack=key("Prompt field(s) of records without a chat (`sft`).", runs=MODEL_RUNS),
    )
    response_field: str = opt(
        "completion",
        "record field of the response (with --prompt-field)",
        stack=key("Response field of records without a chat (`sft`).", runs=MODEL_RUNS),
    )
    # Checkpoints, exports, fault tolerance, reporting.
    checkpoint_every: int = opt(
        50,
        "checkpoint every N steps and at the end (0: only at the end)",
        type=int,
        stack=key(
            "Steps between checkpoints (sharded DCP, for resume).", default=100, ge=1, le=MAX_STEPS
        ),
    )
    keep_checkpoints: int = opt(
        2,
        "checkpoints kept in storage",
        type=int,
        stack=key("Checkpoints kept in the bucket.", ge=1, le=1000),
    )
    storage_path: str = opt("~/park-runs", "gs://bucket/path on GKE, a local path otherwise")
    run_name: str = opt("park-train", "run name; rerunning a name resumes its last checkpoint")
    max_failures: int = opt(
        3,
        "worker failures to recover from (-1: forever)",
        type=int,
        stack=key("Restarts from the last checkpoint after a lost worker.", ge=0, le=MAX_RETRIES),
    )
    export: bool = opt(
        True,
        "write a Hugging Face folder at the end of the run (--model only)",
        type=bool,
        stack=key("An HF folder at `.../<run>/export/final` when the run ends.", runs=MODEL_RUNS),
    )
    export_every: int = opt(
        0,
        "also export at every Nth checkpoint, into step_NNNNNNNN/ (0: only at the end)",
        type=int,
        stack=key(
            "Also export at every Nth checkpoint (0: only at the end).",
            runs=MODEL_RUNS,
            ge=0,
            le=MAX_STEPS,
        ),
    )
    export_path: str | None = opt(
        None, "where exports go (default: <storage-path>/<run-name>/export); final/ at the end"
    )
    export_dtype: str = opt(
        "auto",
        "weights' dtype in the export; auto: bfloat16 if trained in bf16, else float32",
        choices=EXPORT_DTYPES,
        stack=key(
            "`auto` (bf16 when trained in bf16), `float32`, `bfloat16`.",
            enum="ExportDtype",
            runs=MODEL_RUNS,
        ),
    )
    export_max_shard_size: str = opt(
        "5GB",
        "largest safetensors file of an export (e.g. 500MB, 5GB, 2GiB); more get an index",
        stack=key(
            "Largest safetensors file, e.g. `5GB`; more get an index.",
            runs=MODEL_RUNS,
            pattern=r"^[0-9]+(\.[0-9]+)?\s*([KMGT]i?B)$",
        ),
    )
    report_every: int = opt(10, "print metrics every N steps", type=int)

    # ---- derived values -------------------------------------------------------------------

    @property
    def is_hf(self) -> bool:
        """A Hugging Face model (``--model``), not a GPT preset."""
        return self.model is not None

    @property
    def init_mode(self) -> str:
        """``pretrained`` or ``config``: what ``--init auto`` means for this model."""
        if self.init != "auto":
            return self.init
        return "config" if (self.model or "").startswith(BUILTIN_PREFIX) else "pretrained"

    @property
    def is_tpu(self) -> bool:
        return self.accelerator == "tpu"

    @property
    def workers(self) -> int:
        """The worker count, once :func:`resolve` has filled it in."""
        if self.num_workers is None:
            raise ConfigError("num_workers is unresolved; call resolve() first")
        return self.num_workers

    @property
    def batch(self) -> int:
        """The global batch size, once :func:`resolve` has filled it in."""
        if self.global_batch_size is None:
            raise ConfigError("global_batch_size is unresolved; call resolve() first")
        return self.global_batch_size


# ---- CLI and config file ----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The entrypoint's parser; every default is None so that only given flags override."""
    return flags.build_parser(
        TrainConfig,
        prog=ENTRYPOINT,
        description="Train a decoder-only LM with Ray Train (TPU, GPU or CPU).",
    )


def to_entrypoint(cfg: TrainConfig | Mapping[str, Any]) -> str:
    """Render the RayJob entrypoint for a config: only the values that differ from defaults.

    ``parse_args(shlex.split(to_entrypoint(c))[3:]) == c`` for any valid config ``c``.
    """
    if not isinstance(cfg, TrainConfig):
        cfg = TrainConfig.from_dict(cfg)
    return render_entrypoint(flags.changed_values(cfg))


def detect_accelerator(cluster_resources: Mapping[str, float]) -> str:
    """What ``--accelerator auto`` means on a cluster: TPU, then GPU, else CPU."""
    if cluster_resources.get("TPU", 0) > 0:
        return "tpu"
    if cluster_resources.get("GPU", 0) > 0:
        return "gpu"
    return "cpu"
