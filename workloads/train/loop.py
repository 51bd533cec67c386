"""The training loop each worker runs: one code path for TPU, GPU and CPU, DDP and FSDP2.

It restores the latest checkpoint if there is one (a restart after a lost worker, or a rerun
of the same run name), trains to ``--steps``, reports every ``--report-every`` steps and
checkpoints every ``--checkpoint-every`` steps and always at the end. Rank 0 prints each report as a
``PARK_METRICS {json}`` line.
"""

from __future__ import annotations

import tempfile
from typing import Any

import torch
import torch.nn.functional as F

from workloads.train import checkpointing
from workloads.train.config import TrainConfig
from workloads.train.data import make_batches
from workloads.train.metrics import (
    METRICS_PREFIX,
    ThroughputMeter,
    device_name,
    emit,
    peak_tflops,
)
from workloads.train.model import model_config, train_flops_per_token
from workloads.train.runenv import RayTrainEnv, RunEnv
from workloads.train.strategies import (
    autocast,
    build_mesh,
    build_optimizer,
    compute_dtype,
    lr_at,
    parallelize,
)


def train(cfg: TrainConfig, env: RunEnv) -> checkpointing.TrainState:
    """Train until ``cfg.steps``; the default process group must already be initialized."""
    device = env.device
    model_cfg = model_config(cfg.model_size, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len)
    seq_len = model_cfg.block_size
    dtype = compute_dtype(cfg.precision, device.type)
    mesh = build_mesh(device.type, env.world_size, cfg.num_slices if cfg.is_tpu else 1)
    model = parallelize(
        model_cfg,
        strategy=cfg.strategy,
        device=device,
        mesh=mesh,
        dtype=dtype,
        seed=cfg.seed,
        compile=cfg.compile,
    )
    optimizer = build_optimizer(model, lr=cfg.lr, weight_decay=cfg.weight_decay)
    group = checkpointing.coordination_group(device.type)

    state = checkpointing.TrainState()
    with env.latest_checkpoint() as directory:
        if directory is not None:
            state = checkpointing.load(directory, model, optimizer, group)
            state.resumes += 1
    resumed_from = state.step

    batch_per_worker = cfg.batch // env.world_size
    batches = make_batches(
        cfg.data,
        vocab_size=model_cfg.vocab_size,
        seq_len=seq_len,
        batch_size=batch_per_worker,
        seed=cfg.seed,
        rank=env.rank,
    )
    tokens_per_step = cfg.batch * seq_len
    peak = cfg.peak_tflops_per_device or peak_tflops(
        device_name(device, cfg.tpu_accelerator_type if cfg.is_tpu else None)
    )
    meter = ThroughputMeter(
        tokens_per_step=tokens_per_step,
        world_size=env.world_size,
        flops_per_token=train_flops_per_token(model_cfg, seq_len),
        peak_tflops_per_device=peak,
    )
    amp = autocast(cfg.strategy, device, dtype)

    def extra(lr: float) -> dict[str, Any]:
        return {
            "lr": lr,
            "tokens_seen": state.tokens_seen,
            "resumed_from_step": resumed_from,
            "resumes": state.resumes,
            "world_size": env.world_size,
        }

    model.train()
    for step in range(state.step + 1, cfg.steps + 1):
        lr = lr_at(step, base_lr=cfg.lr, warmup_steps=cfg.warmup_steps, total_steps=cfg.steps)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        inputs, targets = (t.to(device, non_blocking=True) for t in batches.batch(step))
        with amp:
            logits = model(inputs)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
        loss.backward()
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        meter.add(loss)
        state.step = step
        state.tokens_seen += tokens_per_step

        last = step == cfg.steps
        # Always at the end: the trained model, and Ray keeps a run's metrics with checkpoints.
        save = last or (cfg.checkpoint_every > 0 and step % cfg.checkpoint_every == 0)
        if not (save or last or step % cfg.report_every == 0):
            continue
        metrics = meter.flush(step) | extra(lr)
        state.loss = metrics["loss"]
        if env.rank == 0:
            emit(METRICS_PREFIX, metrics)
        if save:
            with tempfile.TemporaryDirectory(prefix="park-ckpt-") as directory:
                checkpointing.save(directory, model, optimizer, state, group)
                env.report(metrics, directory, step)
        else:
            env.report(metrics, None, step)
        meter.restart_clock()

    if resumed_from >= cfg.steps:  # nothing left to do: say where the run stands
        env.report(
            {
                "step": state.step,
                "loss": state.loss,
                "tokens_per_s": None,
                "tokens_per_s_per_worker": None,
                "mfu": None,
            }
            | extra(0.0),
            None,
            state.step,
        )
    return state


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's entry on every worker (Ray has set up the process group)."""
    train(TrainConfig.from_dict(config), RayTrainEnv())
