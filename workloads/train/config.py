"""The training run's configuration: one dataclass, its CLI, its config file, its validation.

The RayJob renders ``python -m workloads.train --flag value ...``; the flag names are a contract
with the infra side, so they are derived from the field names here (``num_workers`` →
``--num-workers``) and :func:`to_entrypoint` renders them back from the same table. Precedence:
dataclass defaults < ``--config FILE`` (YAML or JSON) < CLI flags.

Nothing here imports torch or Ray: the driver validates a run before it touches a cluster.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from workloads import flags
from workloads.flags import from_mapping, opt
from workloads.protocol import TRAIN_COMMAND, flag, render_entrypoint

ACCELERATORS = ("auto", "tpu", "gpu", "cpu")
STRATEGIES = ("ddp", "fsdp2")
MODEL_SIZES = ("tiny", "small", "gpt2-small", "gpt2-medium", "1b")
PRECISIONS = ("auto", "bf16", "fp32")
INITS = ("auto", "pretrained", "config")
OBJECTIVES = ("clm", "sft")
LR_SCHEDULES = ("cosine", "linear", "constant")
EXPORT_DTYPES = ("auto", "float32", "bfloat16")
# Token files (ids, sampled as random windows) and text files (tokenized with the model's
# tokenizer, streamed in order). ``.txt`` is text for a Hugging Face model and bytes for a preset.
TOKEN_SUFFIXES = (".bin", ".npy")
TEXT_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt")
DATA_SUFFIXES = (".txt", ".bin", ".npy", ".jsonl", ".json", ".parquet")
BUILTIN_PREFIX = "park:"  # models and data sets built on the worker, no download
HF_DATA_PREFIX = "hf:"  # a data set of the Hugging Face hub, through `datasets`
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


class ConfigError(ValueError):
    """A flag combination that cannot run; the message says which flag to change."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything a training run needs; every field is a ``--flag`` of the entrypoint."""

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
    num_slices: int = opt(1, "TPU slices (multi-slice: HSDP across slices)", type=int)
    peak_tflops_per_device: float | None = opt(
        None, "peak bf16 TFLOP/s of one device, for MFU (default: built-in table)", type=float
    )
    # What to train.
    strategy: str = opt("ddp", "data parallelism: ddp or fsdp2", choices=STRATEGIES)
    model: str | None = opt(
        None,
        "Hugging Face causal LM: a hub id (e.g. Qwen/Qwen2.5-0.5B), gs://bucket/folder, a local "
        "folder, or park:tiny-llama (built here); default: the GPT preset of --model-size",
    )
    tokenizer: str | None = opt(None, "tokenizer source like --model (default: the model's)")
    init: str = opt(
        "auto",
        "pretrained (the source's weights) or config (random weights, pretraining from "
        "scratch); auto: config for park: models, pretrained otherwise",
        choices=INITS,
    )
    model_size: str = opt(
        "tiny", "GPT preset when no --model (synthetic or token-file runs)", choices=MODEL_SIZES
    )
    vocab_size: int | None = opt(None, "override the preset's vocabulary size", type=int)
    precision: str = opt("auto", "bf16 on TPU/GPU, fp32 on CPU when auto", choices=PRECISIONS)
    compile: bool = opt(False, "torch.compile each block (backend 'tpu' on TPU)", type=bool)
    activation_checkpointing: bool = opt(
        False, "recompute each block's activations in backward (non-reentrant)", type=bool
    )
    # How long and how fast.
    steps: int = opt(100, "optimizer steps in total (a resumed run continues to this)", type=int)
    global_batch_size: int | None = opt(
        None, "sequences per step across all workers (default: 4 per worker)", type=int
    )
    micro_batch_size: int | None = opt(
        None,
        "sequences per forward/backward on each worker; a step accumulates gradients over "
        "global-batch-size / num-workers / micro-batch-size of them (default: the worker's "
        "whole share in one pass)",
        type=int,
    )
    seq_len: int | None = opt(
        None,
        f"tokens per sequence (default: the preset's context; {DEFAULT_HF_SEQ_LEN} for --model, "
        "at most its max_position_embeddings)",
        type=int,
    )
    lr: float = opt(3e-4, "peak learning rate (AdamW)", type=float)
    warmup_steps: int = opt(10, "linear warmup steps, then --lr-schedule", type=int)
    lr_schedule: str = opt(
        "cosine",
        "after warmup: cosine or linear decay to --min-lr-ratio, or constant",
        choices=LR_SCHEDULES,
    )
    min_lr_ratio: float = opt(0.1, "final learning rate as a fraction of --lr", type=float)
    weight_decay: float = opt(0.1, "AdamW weight decay on matrices", type=float)
    grad_clip: float = opt(1.0, "max global gradient norm (0: off)", type=float)
    seed: int = opt(0, "seed for weights and data order", type=int)
    # Data.
    data: str = opt(
        "synthetic",
        "synthetic; token files .bin/.npy; text .jsonl/.json/.parquet/.txt (a file, a folder "
        "or gs://...); hf:NAME[:CONFIG] (a hub data set, needs `datasets`); park:facts",
    )
    objective: str = opt(
        "clm",
        "clm: next-token loss on packed text; sft: chat template, loss on the responses only",
        choices=OBJECTIVES,
    )
    data_split: str = opt("train", "split of an hf: data set")
    text_field: str = opt("text", "record field holding the text (--objective clm)")
    messages_field: str = opt(
        "messages", "record field holding a chat, [{role, content}, ...] (--objective sft)"
    )
    prompt_field: str = opt(
        "prompt",
        "record field(s) of the prompt when a record has no chat, comma-separated fields are "
        "joined by a blank line (e.g. instruction,input)",
    )
    response_field: str = opt("completion", "record field of the response (with --prompt-field)")
    # Checkpoints, exports, fault tolerance, reporting.
    checkpoint_every: int = opt(
        50, "checkpoint every N steps and at the end (0: only at the end)", type=int
    )
    keep_checkpoints: int = opt(2, "checkpoints kept in storage", type=int)
    storage_path: str = opt("~/park-runs", "gs://bucket/path on GKE, a local path otherwise")
    run_name: str = opt("park-train", "run name; rerunning a name resumes its last checkpoint")
    export: bool = opt(
        True, "write a Hugging Face folder at the end of the run (--model only)", type=bool
    )
    export_every: int = opt(
        0, "also export at every Nth checkpoint, into step_NNNNNNNN/ (0: only at the end)", type=int
    )
    export_path: str | None = opt(
        None, "where exports go (default: <storage-path>/<run-name>/export); final/ at the end"
    )
    export_dtype: str = opt(
        "auto",
        "weights' dtype in the export; auto: bfloat16 if trained in bf16, else float32",
        choices=EXPORT_DTYPES,
    )
    export_max_shard_size: str = opt(
        "5GB", "largest safetensors file of an export (e.g. 500MB, 5GB, 2GiB); more get an index"
    )
    max_failures: int = opt(3, "worker failures to recover from (-1: forever)", type=int)
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

    # ---- derived values -------------------------------------------------------------------

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TrainConfig:
        """Build from a mapping whose keys are field names, with dashes or underscores."""
        return from_mapping(cls, values, ConfigError)


# ---- CLI and config file ----------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The entrypoint's parser; every default is None so that only given flags override."""
    return flags.build_parser(
        TrainConfig,
        prog=ENTRYPOINT,
        description="Train a decoder-only LM with Ray Train (TPU, GPU or CPU).",
    )


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML or JSON mapping (JSON is YAML, but JSON needs no PyYAML)."""
    text = Path(path).read_text()
    if str(path).endswith(".json"):
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of flag names to values")
    return data


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
    """CLI flags over the config file over the defaults; checks what needs no cluster."""
    cfg = TrainConfig.from_dict(flags.merge_args(build_parser(), argv, load_config_file))
    validate(cfg)
    return cfg


def to_entrypoint(cfg: TrainConfig | Mapping[str, Any]) -> str:
    """Render the RayJob entrypoint for a config: only the values that differ from defaults.

    ``parse_args(shlex.split(to_entrypoint(c))[3:]) == c`` for any valid config ``c``.
    """
    if not isinstance(cfg, TrainConfig):
        cfg = TrainConfig.from_dict(cfg)
    values = cfg.to_dict()
    return render_entrypoint(
        {f.name: values[f.name] for f in fields(TrainConfig) if values[f.name] != f.default}
    )


# ---- validation -------------------------------------------------------------------------


def topology_chips(topology: str) -> int:
    """Chips in a topology string: ``4x4`` → 16, ``4,4,1`` → 16."""
    parts = topology.lower().replace(",", "x").split("x")
    if not 1 <= len(parts) <= 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(f"topology {topology!r} is not of the form AxB, AxBxC or A,B,C")
    return math.prod(int(p) for p in parts)


def default_torch_tpu_topology(tpu_topology: str) -> str:
    """``4x4`` → ``4,4,1``: torch_tpu's own reading of a 2-D topology (missing dims are 1)."""
    dims = tpu_topology.lower().split("x")
    return ",".join([*dims, "1", "1"][:3])


def validate(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the flag to fix; accepts an unresolved (auto) config."""
    for name, allowed in (
        ("accelerator", ACCELERATORS),
        ("strategy", STRATEGIES),
        ("model_size", MODEL_SIZES),
        ("precision", PRECISIONS),
        ("init", INITS),
        ("objective", OBJECTIVES),
        ("lr_schedule", LR_SCHEDULES),
        ("export_dtype", EXPORT_DTYPES),
    ):
        if getattr(cfg, name) not in allowed:
            raise ConfigError(
                f"{flag(name)} must be one of {', '.join(allowed)}, got {getattr(cfg, name)!r}"
            )
    _check_positive(cfg, "steps", "report_every", "keep_checkpoints", "num_slices")
    _check_positive(
        cfg,
        "num_workers",
        "global_batch_size",
        "micro_batch_size",
        "seq_len",
        "vocab_size",
        "chips_per_host",
        "peak_tflops_per_device",
        optional=True,
    )
    for name in ("checkpoint_every", "warmup_steps", "grad_clip", "weight_decay", "export_every"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"{flag(name)} must be >= 0, got {getattr(cfg, name)}")
    if cfg.lr <= 0:
        raise ConfigError(f"--lr must be > 0, got {cfg.lr}")
    if not 0 <= cfg.min_lr_ratio <= 1:
        raise ConfigError(f"--min-lr-ratio must be in [0, 1], got {cfg.min_lr_ratio}")
    if cfg.max_failures < -1:
        raise ConfigError(f"--max-failures must be >= -1, got {cfg.max_failures}")
    if not cfg.run_name or "/" in cfg.run_name:
        raise ConfigError(f"--run-name must be a non-empty name without '/', got {cfg.run_name!r}")
    parse_size(cfg.export_max_shard_size, "export_max_shard_size")
    _validate_model(cfg)
    _validate_data(cfg)
    if cfg.is_tpu:
        _validate_tpu(cfg)
    if cfg.num_workers and cfg.global_batch_size and cfg.global_batch_size % cfg.num_workers:
        raise ConfigError(
            f"--global-batch-size ({cfg.global_batch_size}) must be a multiple of "
            f"--num-workers ({cfg.num_workers})"
        )
    _validate_micro_batch(cfg)


def _validate_micro_batch(cfg: TrainConfig) -> None:
    """A micro-batch must split each worker's share of the global batch into whole passes."""
    micro = cfg.micro_batch_size
    if micro is None or not (cfg.num_workers and cfg.global_batch_size):
        return
    share = cfg.global_batch_size // cfg.num_workers
    if share % micro:
        divisors = [d for d in range(1, share + 1) if share % d == 0]
        raise ConfigError(
            f"--micro-batch-size {micro} does not divide the {share} sequences each worker "
            f"takes per step (--global-batch-size {cfg.global_batch_size} / --num-workers "
            f"{cfg.num_workers}); use one of {', '.join(map(str, divisors))}"
        )


_SIZE_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


def parse_size(text: str, name: str = "export_max_shard_size") -> int:
    """``5GB`` → 5·10⁹, ``2GiB`` → 2·2³⁰ (Hugging Face's reading of shard sizes), ``1000`` bytes."""
    cleaned = str(text).strip().upper().replace(" ", "")
    number = cleaned.rstrip("KMGTIB")
    unit = cleaned[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _SIZE_UNITS or value <= 0:
        raise ConfigError(f"{flag(name)}: expected a size such as 500MB, 5GB or 2GiB, got {text!r}")
    return int(value * _SIZE_UNITS[unit])


def _check_positive(cfg: TrainConfig, *names: str, optional: bool = False) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is None and optional:
            continue
        if value is None or value <= 0:
            raise ConfigError(f"{flag(name)} must be > 0, got {value}")


BUILTIN_MODELS = ("tiny-llama",)
BUILTIN_DATA = ("facts",)


def _validate_model(cfg: TrainConfig) -> None:
    model = cfg.model
    if model is None:
        for name in ("tokenizer",):
            if getattr(cfg, name):
                raise ConfigError(f"{flag(name)} needs --model (a Hugging Face model)")
        if cfg.init == "pretrained":
            raise ConfigError("--init pretrained needs --model; the GPT presets start from random")
        if cfg.objective == "sft":
            raise ConfigError(
                "--objective sft needs --model: a tokenizer with a chat template (a GPT preset "
                "has neither)"
            )
        if cfg.export_every:
            raise ConfigError("--export-every needs --model: exports are Hugging Face folders")
        return
    if not model.strip():
        raise ConfigError("--model must name a hub id, gs://..., a folder or park:tiny-llama")
    if cfg.vocab_size is not None:
        raise ConfigError("--vocab-size only applies to the GPT presets; --model has its own")
    if model.startswith(BUILTIN_PREFIX):
        name = model.removeprefix(BUILTIN_PREFIX)
        if name not in BUILTIN_MODELS:
            raise ConfigError(
                f"--model {model!r}: built-in models are "
                + ", ".join(BUILTIN_PREFIX + m for m in BUILTIN_MODELS)
            )
        if cfg.init == "pretrained":
            raise ConfigError(
                f"--model {model} is a config without weights: use --init config (or auto)"
            )


def data_kind(data: str) -> str:
    """What ``--data`` names: ``synthetic``, ``tokens`` (ids), ``text``, ``hf`` or ``builtin``."""
    if data == "synthetic":
        return "synthetic"
    if data.startswith(HF_DATA_PREFIX):
        return "hf"
    if data.startswith(BUILTIN_PREFIX):
        return "builtin"
    suffix = Path(data.rstrip("/")).suffix
    if suffix in TOKEN_SUFFIXES:
        return "tokens"
    if suffix in TEXT_SUFFIXES:
        return "text"
    return "folder"  # a folder or gs:// prefix: its files decide


def _validate_data(cfg: TrainConfig) -> None:
    data = cfg.data
    kind = data_kind(data)
    suffix = Path(data.rstrip("/")).suffix
    if kind == "folder" and suffix and "://" not in data:
        raise ConfigError(
            f"--data {data!r}: expected 'synthetic', hf:NAME, park:facts, gs://..., a folder, "
            f"or a file ending in {', '.join(DATA_SUFFIXES)}"
        )
    if kind == "builtin" and data.removeprefix(BUILTIN_PREFIX) not in BUILTIN_DATA:
        raise ConfigError(
            f"--data {data!r}: built-in data sets are "
            + ", ".join(BUILTIN_PREFIX + d for d in BUILTIN_DATA)
        )
    if kind == "hf" and not data.removeprefix(HF_DATA_PREFIX).strip(":"):
        raise ConfigError("--data hf: needs a data set name, e.g. hf:tatsu-lab/alpaca")
    if (not cfg.is_hf and kind in ("hf", "builtin")) or (
        not cfg.is_hf and kind == "text" and suffix != ".txt"
    ):
        raise ConfigError(
            f"--data {data}: text records need a tokenizer, so --model (e.g. park:tiny-llama); "
            "the GPT presets read synthetic tokens, .bin/.npy ids or .txt bytes"
        )
    if cfg.objective == "sft":
        if kind in ("synthetic", "tokens"):
            raise ConfigError(
                f"--objective sft needs chat or prompt/response records (.jsonl, .json, "
                f".parquet, hf:, park:facts), not --data {data}"
            )
        if suffix == ".txt":
            raise ConfigError(
                "--objective sft needs chat or prompt/response records; a .txt file has only "
                "lines of text (use --objective clm)"
            )


def _validate_tpu(cfg: TrainConfig) -> None:
    if not cfg.tpu_topology:
        raise ConfigError(
            "--accelerator tpu needs --tpu-topology (e.g. 4x4); the RayJob passes "
            "it from the TPU catalog"
        )
    if not cfg.tpu_accelerator_type.upper().startswith("TPU-"):
        raise ConfigError(
            f"--tpu-accelerator-type must be a Ray TPU type such as TPU-V6E, "
            f"got {cfg.tpu_accelerator_type!r}"
        )
    slice_chips = topology_chips(cfg.tpu_topology)
    if cfg.torch_tpu_topology and topology_chips(cfg.torch_tpu_topology) != slice_chips:
        raise ConfigError(
            f"--torch-tpu-topology {cfg.torch_tpu_topology} has "
            f"{topology_chips(cfg.torch_tpu_topology)} chips but --tpu-topology "
            f"{cfg.tpu_topology} has {slice_chips}"
        )
    if cfg.chips_per_host and slice_chips % cfg.chips_per_host:
        raise ConfigError(
            f"--tpu-topology {cfg.tpu_topology} ({slice_chips} chips) is not a "
            f"whole number of hosts of --chips-per-host {cfg.chips_per_host}"
        )
    if cfg.num_workers is None:
        return
    if cfg.chips_per_host and cfg.num_workers % cfg.chips_per_host:
        raise ConfigError(
            f"--num-workers ({cfg.num_workers}) must be a multiple of "
            f"--chips-per-host ({cfg.chips_per_host}) on TPU: one worker per chip, "
            f"whole hosts"
        )
    expected = slice_chips * cfg.num_slices
    if cfg.num_workers != expected:
        raise ConfigError(
            f"--num-workers ({cfg.num_workers}) must equal the chips of "
            f"--num-slices {cfg.num_slices} times --tpu-topology {cfg.tpu_topology} "
            f"({expected}): one worker per chip"
        )


def detect_accelerator(cluster_resources: Mapping[str, float]) -> str:
    """What ``--accelerator auto`` means on a cluster: TPU, then GPU, else CPU."""
    if cluster_resources.get("TPU", 0) > 0:
        return "tpu"
    if cluster_resources.get("GPU", 0) > 0:
        return "gpu"
    return "cpu"


def resolve(cfg: TrainConfig, cluster_resources: Mapping[str, float]) -> TrainConfig:
    """Fill what depends on the cluster (accelerator, worker count) and validate the result."""
    accelerator = cfg.accelerator
    if accelerator == "auto":
        accelerator = detect_accelerator(cluster_resources)
    cfg = replace(cfg, accelerator=accelerator)
    num_workers = cfg.num_workers
    torch_tpu_topology = cfg.torch_tpu_topology
    if accelerator == "tpu":
        validate(cfg)  # says what is missing before we compute with it
        assert cfg.tpu_topology is not None
        if num_workers is None:
            num_workers = topology_chips(cfg.tpu_topology) * cfg.num_slices
        torch_tpu_topology = torch_tpu_topology or default_torch_tpu_topology(cfg.tpu_topology)
    elif num_workers is None:
        gpus = int(cluster_resources.get("GPU", 0))
        num_workers = max(gpus, 1) if accelerator == "gpu" else 2
    storage_path = cfg.storage_path
    if "://" not in storage_path:
        storage_path = os.path.abspath(os.path.expanduser(storage_path))
    cfg = replace(
        cfg,
        num_workers=num_workers,
        torch_tpu_topology=torch_tpu_topology,
        storage_path=storage_path,
        global_batch_size=cfg.global_batch_size or DEFAULT_BATCH_PER_WORKER * num_workers,
    )
    validate(cfg)
    return cfg
