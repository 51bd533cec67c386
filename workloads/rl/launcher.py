"""The RL job's driver: the learner as a Ray Train TorchTrainer, the result printed.

The scaling (one worker per chip; gloo on CPU), the process-group backend (the TPU bridge on
TPU) and the run config (storage, restarts, checkpoints kept) are the trainer's own
(workloads/train/distributed/scaling.py and launcher.py), built from the learner's TrainConfig
(:func:`workloads.rl.parts.train_config`). Rank 0 of the trainer drives the rollouts
(workloads/rl/loop.py says why).
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.train.torch import TorchTrainer

from workloads.protocol import RESULT_PREFIX
from workloads.rl.config import RLRunConfig
from workloads.rl.loop import train_loop_per_worker
from workloads.rl.parts import train_config
from workloads.train.config_check import resolve
from workloads.train.distributed.scaling import build_scaling_config, build_torch_config
from workloads.train.launcher import build_run_config
from workloads.train.run.metrics import emit


def build_trainer(cfg: RLRunConfig) -> tuple[TorchTrainer, RLRunConfig]:
    """The learner's TorchTrainer, and the config with the cluster's answers filled in."""
    train = resolve(train_config(cfg), ray.cluster_resources())
    cfg = RLRunConfig.from_dict(
        cfg.to_dict()
        | {
            "accelerator": train.accelerator,
            "num_workers": train.num_workers,
            "torch_tpu_topology": train.torch_tpu_topology,
            "storage_path": train.storage_path,
        }
    )
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=cfg.to_dict(),
        torch_config=build_torch_config(train),
        scaling_config=build_scaling_config(train),
        run_config=build_run_config(train),
    )
    return trainer, cfg


def run(cfg: RLRunConfig) -> dict[str, Any]:
    """Run the job and return the ``PARK_RESULT`` summary (also printed)."""
    if not ray.is_initialized():
        ray.init()
    trainer, cfg = build_trainer(cfg)
    started = time.perf_counter()
    result = trainer.fit()
    metrics = result.metrics or {}
    summary = {
        "status": "succeeded" if result.error is None else "failed",
        "objective": "grpo",
        "final_step": metrics.get("step"),
        "reward_first": metrics.get("reward_first"),
        "reward_last": metrics.get("reward_mean"),
        "policy_version": metrics.get("version"),
        "checkpoint_path": result.checkpoint.path if result.checkpoint else None,
        "run_path": result.path,
        "resumes": metrics.get("resumes"),
        "export_path": metrics.get("export_path"),
        "accelerator": cfg.accelerator,
        "num_workers": cfg.num_workers,
        "strategy": cfg.strategy,
        "model": cfg.model,
        "seconds": round(time.perf_counter() - started, 1),
    }
    if result.error is not None:
        summary["error"] = str(result.error)
    emit(RESULT_PREFIX, summary)
    first, last = summary["reward_first"], summary["reward_last"]
    if first is not None and last is not None:
        print(f"reward  {first:.2f} → {last:.2f}", flush=True)
    return summary
