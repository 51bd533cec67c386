"""What a training run's flags may hold: the allowed values, the parsers of structured ones
(topologies, sizes, data specs) and :func:`validate`, which names the flag to change.

Split from workloads/train/config.py (the dataclass, its CLI and resolution), which re-exports
every name here. Torch-free: the infra side runs these rules at preview time.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from workloads.flags import ConfigError
from workloads.protocol import flag

if TYPE_CHECKING:
    from workloads.train.config import TrainConfig

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
BUILTIN_MODELS = ("tiny-llama",)
BUILTIN_DATA = ("facts",)


def topology_chips(topology: str) -> int:
    """Chips in a topology string: ``4x4`` → 16, ``4,4,1`` → 16."""
    parts = topology.lower().replace(",", "x").split("x")
    if not 1 <= len(parts) <= 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(f"topology {topology!r} is not of the form AxB, AxBxC or A,B,C")
    return math.prod(int(p) for p in parts)


def devices_per_chip(torch_tpu_topology: str | None) -> int:
    """Runtime devices per chip: the 4th axis of a TORCH_TPU_TOPOLOGY (``2,2,2,2`` on TPU7x,
    whose chips are two TensorCores each: torch_tpu 0.2.0 hardware.py), else 1."""
    parts = (torch_tpu_topology or "").split(",")
    return int(parts[3]) if len(parts) == 4 and parts[3].isdigit() else 1


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
    for name in (
        "checkpoint_every",
        "warmup_steps",
        "grad_clip",
        "weight_decay",
        "export_every",
        "model_wait_s",
    ):
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


def is_folder(model: str) -> bool:
    """`--model` names a folder (a path or a bucket URI), not a hub id or a built-in."""
    return "://" in model or model.startswith(("/", ".", "~"))


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
        if cfg.model_wait_s:
            raise ConfigError("--model-wait-s needs --model (a folder another job writes)")
        return
    if not model.strip():
        raise ConfigError("--model must name a hub id, gs://..., a folder or park:tiny-llama")
    if cfg.model_wait_s and not is_folder(model):
        raise ConfigError(
            f"--model-wait-s waits for a folder's completion marker: --model must be a path or "
            f"gs://..., got {model!r}"
        )
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
    per_chip = devices_per_chip(cfg.torch_tpu_topology)
    if cfg.torch_tpu_topology and topology_chips(cfg.torch_tpu_topology) != slice_chips * per_chip:
        raise ConfigError(
            f"--torch-tpu-topology {cfg.torch_tpu_topology} has "
            f"{topology_chips(cfg.torch_tpu_topology) // per_chip} chips but --tpu-topology "
            f"{cfg.tpu_topology} has {slice_chips}"
        )
    if cfg.chips_per_host and slice_chips % cfg.chips_per_host:
        raise ConfigError(
            f"--tpu-topology {cfg.tpu_topology} ({slice_chips} chips) is not a "
            f"whole number of hosts of --chips-per-host {cfg.chips_per_host}"
        )
    if cfg.num_workers is None:
        return
    unit = "chip" if per_chip == 1 else f"device ({per_chip} per chip)"
    if cfg.chips_per_host and cfg.num_workers % (cfg.chips_per_host * per_chip):
        raise ConfigError(
            f"--num-workers ({cfg.num_workers}) must be a multiple of "
            f"--chips-per-host ({cfg.chips_per_host}) x {per_chip} on TPU: one worker per "
            f"{unit}, whole hosts"
        )
    expected = slice_chips * per_chip * cfg.num_slices
    if cfg.num_workers != expected:
        raise ConfigError(
            f"--num-workers ({cfg.num_workers}) must equal the {unit.split()[0]}s of "
            f"--num-slices {cfg.num_slices} times --tpu-topology {cfg.tpu_topology} "
            f"({expected}): one worker per {unit}"
        )
