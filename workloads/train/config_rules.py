"""What a training run's flags may hold: the allowed values and the parsers of structured ones
(topologies, sizes, data specs).

The lowest of the config's modules: workloads/train/config.py (the dataclass, its CLI) and
workloads/train/config_check.py (:func:`~workloads.train.config_check.validate`, which names
the flag to change) import it, never the other way. Torch-free: the infra side runs these
rules at preview time.
"""

from __future__ import annotations

import math
from pathlib import Path

from workloads.flags import ConfigError
from workloads.protocol import flag

ACCELERATORS = ("auto", "tpu", "gpu", "cpu")
STRATEGIES = ("ddp", "fsdp2")
MODEL_SIZES = ("tiny", "small", "gpt2-small", "gpt2-medium", "1b")
PRECISIONS = ("auto", "bf16", "fp32")
INITS = ("auto", "pretrained", "config")
OBJECTIVES = ("clm", "sft")
LR_SCHEDULES = ("cosine", "linear", "constant")
EXPORT_DTYPES = ("auto", "float32", "bfloat16")
# The flags of a fixed set of values, in the order validate checks them.
CHOICES = {
    "accelerator": ACCELERATORS,
    "strategy": STRATEGIES,
    "model_size": MODEL_SIZES,
    "precision": PRECISIONS,
    "init": INITS,
    "objective": OBJECTIVES,
    "lr_schedule": LR_SCHEDULES,
    "export_dtype": EXPORT_DTYPES,
}
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


def is_folder(model: str) -> bool:
    """`--model` names a folder (a path or a bucket URI), not a hub id or a built-in."""
    return "://" in model or model.startswith(("/", ".", "~"))


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
