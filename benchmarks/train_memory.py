"""The training benchmark's GPU memory section: each shipped stack's training step on GPU 0
(rank 0 of its chips, a fake process group) with ``torch.cuda.max_memory_allocated`` beside
infra.resolve.training_fit's estimate (``python benchmarks/train_overhead.py --gpu-memory``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from workloads.train.testing import process_group

ROOT = Path(__file__).resolve().parents[1]


def gpu_memory_settings(stack: str) -> dict[str, Any]:
    """One chip of ``stack``'s training run as the resolve step plans it, and the estimate
    (infra.resolve.training_fit, without the runtime reserve, which CUDA's count does not see)."""
    from infra.stack import from_file

    plan = from_file(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    run = plan.training
    if run is None or run.fit is None or run.spec.model is None or run.slices != 1:
        raise ValueError(f"{stack}: no one-slice training run of a known model to measure")
    return {
        "stack": stack,
        "model": run.spec.model,
        "strategy": run.spec.strategy,
        "world_size": run.workers,
        "micro_batch": run.micro_batch,
        "accumulation_steps": run.accumulation_steps,
        "seq_len": run.spec.seq_len,
        "activation_checkpointing": run.spec.activation_checkpointing,
        "estimate_peak_gib": round(run.fit.peak_bytes / 2**30, 2),
        "estimate_phase": run.fit.phase,
    }


def gpu_memory_peak(settings: dict[str, Any]) -> int:
    """``torch.cuda.max_memory_allocated`` over the second of two trainer steps (forward,
    backward, AdamW) on GPU 0 standing for rank 0 of the run's chips: the catalogue's config
    with random weights, a fake process group (real shards and gathered buffers, no traffic)."""
    import transformers
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
    from torch.distributed.tensor import DTensor

    from workloads.train.distributed.strategies import (
        autocast,
        build_mesh,
        build_optimizer,
        replicate,
        shard,
    )
    from workloads.train.inputs.batches import Batch
    from workloads.train.models import hf
    from workloads.train.models.loss import install_loss_forward
    from workloads.train.models.modeling import TrainModel
    from workloads.train.run.step import forward_backward

    entry = json.loads((ROOT / "infra/data/models/configs.json").read_text())["models"]
    raw = dict(entry[settings["model"]]["config"])
    config = transformers.CONFIG_MAPPING[raw.pop("model_type")](**raw).get_text_config()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    fsdp = settings["strategy"] == "fsdp2"
    world = settings["world_size"] if fsdp else 1  # DDP: the same per chip at any world size
    with process_group("fake", world_size=world):
        model: Any = hf.meta_model(config)
        ties, blocks = hf.tie_groups(model), hf.block_modules(model)
        if settings["activation_checkpointing"]:
            model.gradient_checkpointing_enable({"use_reentrant": False})
        if fsdp:
            shard(model, blocks, mesh=build_mesh("cuda", world), dtype=torch.bfloat16)
        model.to_empty(device=device)
        hf.retie(model, ties)
        with torch.no_grad():
            for param in model.parameters():
                (param.to_local() if isinstance(param, DTensor) else param).normal_(0, 0.02)
        hf.init_buffers(model)
        install_loss_forward(model)
        module = model if fsdp else replicate(model, device)
        if not fsdp:
            module.register_comm_hook(None, noop_hook)  # the fake group's all-reduce has no tensor
        seq_len = settings["seq_len"]
        trainer = TrainModel(module, model, config.vocab_size, seq_len, 0.0, object())  # type: ignore[arg-type]
        optimizer = build_optimizer(module, lr=1e-5, weight_decay=0.1)
        rows = settings["micro_batch"] * settings["accumulation_steps"]
        ids = torch.randint(0, config.vocab_size, (rows, settings["seq_len"]))
        batch = Batch(input_ids=ids, labels=ids.clone(), position_ids=None, n_targets=ids.numel())
        for step in range(2):
            if step:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            forward_backward(
                trainer,
                batch,
                micro_batch=settings["micro_batch"],
                world_size=settings["world_size"],
                device=device,
                counts_vary=False,
                amp=autocast(settings["strategy"], device, torch.bfloat16),
            )
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated(device))


def gpu_memory_record(settings: dict[str, Any], peak: int) -> dict[str, Any]:
    measured = peak / 2**30
    return settings | {
        "max_memory_allocated_gib": round(measured, 2),
        "estimate_over_measured": round(settings["estimate_peak_gib"] / measured, 3),
    }


def gpu_memory(stacks: tuple[str, ...] = ("dev", "prod")) -> dict[str, Any] | str:
    """The shipped stacks' per-chip training step on this GPU beside the estimate."""
    if not torch.cuda.is_available():
        return "no GPU on this machine"
    records = {}
    for name in stacks:
        settings = gpu_memory_settings(name)
        records[name] = gpu_memory_record(settings, gpu_memory_peak(settings))
    return records
