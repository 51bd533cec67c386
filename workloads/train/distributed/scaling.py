"""From a resolved TrainConfig to Ray Train's ScalingConfig and TorchConfig (pure functions).

TPU: one worker per chip. ``resources_per_worker={"TPU": 1}`` is what makes it so: without it
Ray gives each worker a whole host (4 chips on v6e), and 16 workers on a 4x4 would ask for four
slices. The values (topology, accelerator type, TORCH_TPU_TOPOLOGY) arrive from the RayJob,
which takes them from the infra's TPU catalog; nothing is re-derived here.
"""

from __future__ import annotations

from ray.train import ScalingConfig
from ray.train.torch import TorchConfig

from workloads.train.config import TrainConfig
from workloads.train.distributed.tpu_bridge import TorchTPUConfig

BACKENDS = {"tpu": "tpu_dist", "gpu": "nccl", "cpu": "gloo"}
DEVICES = {"tpu": "tpu", "gpu": "cuda", "cpu": "cpu"}


def build_scaling_config(cfg: TrainConfig) -> ScalingConfig:
    """Ray's ScalingConfig for a resolved config (accelerator and num_workers known)."""
    if cfg.accelerator == "tpu":
        return ScalingConfig(
            num_workers=cfg.workers,
            use_tpu=True,
            topology=cfg.tpu_topology,
            accelerator_type=cfg.tpu_accelerator_type,
            resources_per_worker={"TPU": 1},
        )
    if cfg.accelerator == "gpu":
        return ScalingConfig(num_workers=cfg.workers, use_gpu=True)
    if cfg.accelerator == "cpu":
        return ScalingConfig(num_workers=cfg.workers, use_gpu=False)
    raise ValueError(f"resolve the accelerator first (got {cfg.accelerator!r})")


def build_torch_config(cfg: TrainConfig) -> TorchConfig:
    """The process-group backend; on TPU the bridge that sets torch_tpu's slice environment."""
    backend = BACKENDS[cfg.accelerator]
    if cfg.accelerator == "tpu":
        assert cfg.torch_tpu_topology is not None, "resolve() fills torch_tpu_topology"
        return TorchTPUConfig(
            backend=backend, torch_tpu_topology=cfg.torch_tpu_topology, num_slices=cfg.num_slices
        )
    return TorchConfig(backend=backend)
