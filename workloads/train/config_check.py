"""A training run's configuration, checked: :func:`validate` (the rules, naming the flag to
change), :func:`parse_args` (the entrypoint's flags, checked), :func:`resolve` (filled in from
the cluster, then checked) and :func:`training_entrypoint` (infra's command line, checked at
preview).

Above workloads/train/config.py (the dataclass, its flags) and workloads/train/config_rules.py
(the allowed values and parsers), which import nothing of this module: protocol, flags and the
config in one direction. Torch-free: the infra side runs these rules at preview time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from workloads import flags
from workloads.flags import ConfigError
from workloads.protocol import flag, render_entrypoint
from workloads.train.config import (
    DEFAULT_BATCH_PER_WORKER,
    TrainConfig,
    build_parser,
    detect_accelerator,
)
from workloads.train.config_rules import (
    BUILTIN_DATA,
    BUILTIN_MODELS,
    BUILTIN_PREFIX,
    CHOICES,
    DATA_SUFFIXES,
    HF_DATA_PREFIX,
    data_kind,
    default_torch_tpu_topology,
    devices_per_chip,
    is_folder,
    parse_size,
    topology_chips,
)


def validate(cfg: TrainConfig) -> None:
    """Raise ConfigError naming the flag to fix; accepts an unresolved (auto) config."""
    for name, allowed in CHOICES.items():
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


def _check_positive(cfg: TrainConfig, *names: str, optional: bool = False) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is None and optional:
            continue
        if value is None or value <= 0:
            raise ConfigError(f"{flag(name)} must be > 0, got {value}")


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


# ---- the CLI, the cluster, infra's entrypoint --------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> TrainConfig:
    """CLI flags over the config file over the defaults; checks what needs no cluster."""
    return flags.parse_config(TrainConfig, build_parser(), argv, validate)


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


def training_entrypoint(fields: Mapping[str, Any]) -> str:
    """Render, after checking that the fields form a valid TrainConfig (the job's own rules):
    a flag the workload does not know fails here, at preview, not in the pod."""
    from workloads.train.config import TrainConfig
    from workloads.train.config_check import validate

    validate(TrainConfig.from_dict(fields))
    return render_entrypoint(fields)
