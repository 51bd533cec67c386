"""The training loop each worker runs: one code path for TPU, GPU and CPU, DDP and FSDP2,
Hugging Face models and the GPT presets, pretraining and fine-tuning.

It restores the latest checkpoint if there is one (a restart after a lost worker, or a rerun
of the same run name): weights, optimizer moments and each rank's data position. It trains to
``--steps``, prints a ``PARK_METRICS {json}`` line on rank 0 every ``--report-every`` steps,
checkpoints every ``--checkpoint-every`` steps and always at the end, and exports a Hugging
Face folder at the end (and every ``--export-every`` checkpoints).

Ray hears from the loop only at checkpoints: ``ray.train.report`` is a barrier across the
workers and a round trip to the controller (whose result queue holds one report and is polled
every couple of seconds), so reporting every few steps cost step time for nothing the run
needs; progress goes to the log, where the CLI and the log-based metrics read it.

The loss is the mean over every target token of the global batch: each rank's summed loss is
divided by the token count of all ranks (an all-reduce when counts differ, as with SFT masks),
so a rank with more response tokens weighs more, as it would on one device. A step may run
as several micro-batches (``--micro-batch-size``) whose gradients add up to that same
gradient (workloads.train.run.step); the loss never holds a micro-batch's full-vocabulary logits
(workloads.train.models.loss).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from workloads.protocol import training_export_path
from workloads.train import storage
from workloads.train.config import TrainConfig
from workloads.train.config_rules import BUILTIN_PREFIX, TEXT_SUFFIXES, data_kind, parse_size
from workloads.train.distributed.runenv import RayTrainEnv, RunEnv
from workloads.train.distributed.strategies import (
    autocast,
    build_mesh,
    build_optimizer,
    compute_dtype,
    lr_at,
    sdpa_backends,
)
from workloads.train.inputs.batches import BatchSource, TokenStream, make_batches
from workloads.train.models import modeling
from workloads.train.outputs import checkpointing
from workloads.train.run.metrics import (
    METRICS_PREFIX,
    ThroughputMeter,
    device_name,
    emit,
    peak_tflops,
)
from workloads.train.run.step import forward_backward


def export_path(cfg: TrainConfig, step: int | None = None) -> str:
    """The final export folder (or the one of checkpoint ``step``): under ``--export-path``,
    by default ``<storage-path>/<run-name>/export/`` (the rule is workloads.protocol's)."""
    return training_export_path(cfg.storage_path, cfg.run_name, cfg.export_path, step)


def make_source(
    cfg: TrainConfig,
    model: modeling.TrainModel,
    *,
    rank: int,
    world_size: int,
    batch_size: int,
    state: dict[str, Any] | None,
) -> BatchSource:
    """The worker's batches for ``--data``: token ids (synthetic or files) or text."""
    kind = data_kind(cfg.data)
    if model.source is not None and kind == "folder":
        found = storage.list_files(cfg.data, TEXT_SUFFIXES) if storage.exists(cfg.data) else []
        kind = "text" if found else "tokens"
    if model.source is None or kind in ("synthetic", "tokens"):
        batches = make_batches(
            cfg.data,
            vocab_size=model.vocab_size,
            seq_len=model.seq_len,
            batch_size=batch_size,
            seed=cfg.seed,
            rank=rank,
        )
        return TokenStream(batches, state)
    from workloads.train.inputs import facts, text

    spec = str(facts.facts_path()) if cfg.data == BUILTIN_PREFIX + "facts" else cfg.data
    tokenizer = model.source.tokenizer
    encoder = text.Encoder.for_run(tokenizer, cfg)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return text.TextBatches(
        text.plan_units(spec, split=cfg.data_split),
        encoder,
        seq_len=model.seq_len,
        batch_size=batch_size,
        seed=cfg.seed,
        rank=rank,
        world_size=world_size,
        split_documents=cfg.objective == "clm",
        pad_id=int(pad),
        state=state,
    )


def train(cfg: TrainConfig, env: RunEnv) -> checkpointing.TrainState:
    """Train until ``cfg.steps``; the default process group must already be initialized."""
    started_at = time.time()
    device = env.device
    dtype = compute_dtype(cfg.precision, device.type)
    mesh = build_mesh(device.type, env.world_size, cfg.num_slices if cfg.is_tpu else 1)
    group = checkpointing.coordination_group(device.type)
    state = checkpointing.TrainState()
    data_state: dict[str, Any] | None = None
    with env.latest_checkpoint() as directory:
        model = modeling.build(
            cfg, device=device, mesh=mesh, dtype=dtype, restoring=directory is not None
        )
        optimizer = build_optimizer(model.module, lr=cfg.lr, weight_decay=cfg.weight_decay)
        if directory is not None:
            state = checkpointing.load(directory, model.module, optimizer, group)
            data_state = checkpointing.load_data_state(directory, env.rank, state.step)
            state.resumes += 1
    resumed_from = state.step

    per_worker = cfg.batch // env.world_size  # rows each step takes from the batch source
    micro_batch = cfg.micro_batch_size or per_worker  # rows per forward/backward
    data = make_source(
        cfg,
        model,
        rank=env.rank,
        world_size=env.world_size,
        batch_size=per_worker,
        state=data_state,
    )
    tokens_per_step = cfg.batch * model.seq_len
    peak = cfg.peak_tflops_per_device or peak_tflops(
        device_name(device, cfg.tpu_accelerator_type if cfg.is_tpu else None)
    )
    meter = ThroughputMeter(
        tokens_per_step=tokens_per_step,
        world_size=env.world_size,
        flops_per_token=model.flops_per_token,
        peak_tflops_per_device=peak,
    )
    amp = autocast(cfg.strategy, device, dtype)
    exports = _Exports(cfg, model, dtype, group)
    first_step_at: float | None = None

    def extra(lr: float) -> dict[str, Any]:
        values: dict[str, Any] = {
            "lr": lr,
            "tokens_seen": state.tokens_seen,
            "resumed_from_step": resumed_from,
            "resumes": state.resumes,
            "world_size": env.world_size,
            "data_epoch": data.epoch,
        }
        if first_step_at is not None:
            values["started_at"] = started_at  # wall clock: the loop began, first step done
            values["first_step_at"] = first_step_at
        if exports.latest:
            values["export_path"] = exports.latest
        return values

    model.module.train()
    for step in range(state.step + 1, cfg.steps + 1):
        lr = lr_at(
            step,
            base_lr=cfg.lr,
            warmup_steps=cfg.warmup_steps,
            total_steps=cfg.steps,
            min_ratio=cfg.min_lr_ratio,
            schedule=cfg.lr_schedule,
        )
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        with sdpa_backends(device.type):
            loss = forward_backward(
                model,
                data.next_batch(),
                micro_batch=micro_batch,
                world_size=env.world_size,
                device=device,
                counts_vary=data.counts_vary,
                amp=amp,
            )
        if cfg.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.module.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        meter.add(loss)
        state.step = step
        state.tokens_seen += tokens_per_step
        if first_step_at is None:
            float(loss.detach())  # waits for the device: the first step has really finished
            first_step_at = time.time()

        last = step == cfg.steps
        # Always at the end: the trained model, and Ray keeps a run's metrics with checkpoints.
        save = last or (cfg.checkpoint_every > 0 and step % cfg.checkpoint_every == 0)
        if not (save or step % cfg.report_every == 0):
            continue
        metrics = meter.flush(step) | extra(lr)
        state.loss = metrics["loss"]
        if save:
            export_now = exports.due(step, last)
            if export_now:
                metrics["export_path"] = export_now
            if env.rank == 0:
                emit(METRICS_PREFIX, metrics)
            # Written where it is kept (the run's storage folder, through the bucket's mount
            # on GKE), registered by Ray without a copy (workloads/train/distributed/runenv.py).
            with env.checkpoint_folder(step) as directory:
                checkpointing.save(
                    directory, model.module, optimizer, state, group, data.state_dict()
                )
                env.report(metrics, directory, step)
            if export_now:
                exports.write(export_now, step, state)
        else:
            if env.rank == 0:
                emit(METRICS_PREFIX, metrics)
            env.progress(metrics)
        meter.restart_clock()

    if resumed_from >= cfg.steps:  # nothing left to do: say where the run stands
        final = exports.due(state.step, True)
        if final and not storage.exists(storage.join(final, "config.json")):
            exports.write(final, state.step, state)  # the last attempt died while exporting
        env.report(
            {
                "step": state.step,
                "loss": state.loss,
                "tokens_per_s": None,
                "tokens_per_s_per_worker": None,
                "mfu": None,
            }
            | extra(0.0)
            | ({"export_path": final} if final else {}),
            None,
            state.step,
        )
    return state


class _Exports:
    """When and where Hugging Face exports go: ``final/`` at the end, ``step_N/`` every
    ``--export-every`` checkpoints."""

    def __init__(
        self,
        cfg: TrainConfig,
        model: modeling.TrainModel,
        dtype: torch.dtype,
        group: dist.ProcessGroup | None,
    ) -> None:
        self.cfg, self.model, self.dtype, self.group = cfg, model, dtype, group
        self.latest: str | None = None

    def due(self, step: int, last: bool) -> str | None:
        cfg = self.cfg
        if not self.model.is_hf:
            return None
        if last and cfg.export:
            return export_path(cfg)
        every = cfg.checkpoint_every * cfg.export_every
        if every and step % every == 0:
            return export_path(cfg, step)
        return None

    def write(self, destination: str, step: int, state: checkpointing.TrainState) -> None:
        from workloads.train.outputs import export

        assert self.model.source is not None
        export.export_model(
            self.model.inner,
            destination,
            source=self.model.source,
            dtype=export.export_dtype(self.cfg.export_dtype, self.dtype),
            max_shard_bytes=parse_size(self.cfg.export_max_shard_size),
            metadata={
                "run_name": self.cfg.run_name,
                "step": step,
                "loss": state.loss,
                "model": self.cfg.model,
                "init": self.model.source.init,
                "objective": self.cfg.objective,
                "data": self.cfg.data,
                "seq_len": self.model.seq_len,
            },
            group=self.group,
        )
        self.latest = destination


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """Ray Train's entry on every worker (Ray has set up the process group; on TPU the bridge
    set torch_tpu's environment before that)."""
    train(TrainConfig.from_dict(config), RayTrainEnv())
