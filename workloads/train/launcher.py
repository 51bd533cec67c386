"""The driver: resolve the config against the cluster, run the TorchTrainer, print the result.

On GKE this runs on the Ray head as the RayJob's entrypoint (``RAY_ADDRESS`` is set, so
``ray.init()`` attaches); on a laptop ``ray.init()`` starts a local Ray.
"""

from __future__ import annotations

import sys
from typing import Any

import ray
from ray.train import CheckpointConfig, FailureConfig, RunConfig
from ray.train.torch import TorchTrainer

from workloads import ready
from workloads.train import storage
from workloads.train.config import TrainConfig
from workloads.train.config_check import resolve
from workloads.train.distributed.scaling import build_scaling_config, build_torch_config
from workloads.train.run.loop import train_loop_per_worker
from workloads.train.run.metrics import RESULT_PREFIX, emit

# Ray starts worker processes at nice 15 (the raylet's worker_niceness), below everything else
# on the host: any other busy process (a FUSE sidecar, a metrics agent, another job on a shared
# machine) then takes the training workers' CPU first. Those workers are the job; they run at
# normal priority. Only this: the pods' own TORCH_TPU_* variables (the KubeRay TPU webhook's)
# must stay visible to the bridge, which compares them with its plan.
WORKER_ENV = {"RAY_worker_niceness": "0"}


def build_run_config(cfg: TrainConfig, **overrides: Any) -> RunConfig:
    """Checkpoints in storage_path, restarts on failure, workers at normal priority."""
    storage_path, storage_filesystem = storage.ray_storage(cfg.storage_path)
    values: dict[str, Any] = dict(
        name=cfg.run_name,
        storage_path=storage_path,
        storage_filesystem=storage_filesystem,
        failure_config=FailureConfig(max_failures=cfg.max_failures),
        checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_checkpoints),
        worker_runtime_env={"env_vars": dict(WORKER_ENV)},
    )
    values.update(overrides)
    return RunConfig(**values)


def build_trainer(cfg: TrainConfig) -> TorchTrainer:
    """A TorchTrainer for a resolved config."""
    run_config = build_run_config(cfg)
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=cfg.to_dict(),
        torch_config=build_torch_config(cfg),
        scaling_config=build_scaling_config(cfg),
        run_config=run_config,
    )


def wait_for_model(cfg: TrainConfig) -> None:
    """With --model-wait-s, wait here, once, in the driver, for --model's folder to be complete
    (its staging's or its export's marker): a run started with its model's staging waits
    instead of failing on a missing folder in every worker (Ray Train's retries would fail as
    fast, and the RayJob with them)."""
    if cfg.model and cfg.model_wait_s:
        ready.wait_for_model(
            cfg.model,
            timeout_s=cfg.model_wait_s,
            who="--model",
            writer="its staging (the stage Job, `park stage-model`) or the run exporting it",
        )


def run(cfg: TrainConfig) -> dict[str, Any]:
    """Train and return the ``PARK_RESULT`` summary (also printed)."""
    try:
        wait_for_model(cfg)
    except ready.ModelNotReady as err:
        print(f"workloads.train: {err}", file=sys.stderr, flush=True)
        failed = {"status": "failed", "error": str(err), "model": cfg.model}
        emit(RESULT_PREFIX, failed)
        return failed
    if not ray.is_initialized():
        ray.init()
    cfg = resolve(cfg, ray.cluster_resources())
    result = build_trainer(cfg).fit()
    metrics = result.metrics or {}
    summary = {
        "status": "succeeded" if result.error is None else "failed",
        "final_step": metrics.get("step"),
        "final_loss": metrics.get("loss"),
        "checkpoint_path": result.checkpoint.path if result.checkpoint else None,
        "run_path": result.path,
        "resumes": metrics.get("resumes"),
        "resumed_from_step": metrics.get("resumed_from_step"),
        "export_path": metrics.get("export_path"),
        "accelerator": cfg.accelerator,
        "num_workers": cfg.num_workers,
        "strategy": cfg.strategy,
        "model": cfg.model or f"gpt:{cfg.model_size}",
    }
    if result.error is not None:
        summary["error"] = str(result.error)
    emit(RESULT_PREFIX, summary)
    return summary
