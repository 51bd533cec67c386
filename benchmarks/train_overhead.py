"""Ray Train's overhead: the same training in a plain torch DDP loop and through TorchTrainer.

Both sides run the workload's own loop (``workloads.train.loop.train``) with the same model,
batch, steps and threads per worker: (i) two processes started by ``torch.multiprocessing``
with a gloo process group, reporting nowhere; (ii) two Ray Train workers of a TorchTrainer on a
private local Ray, reporting through ``ray.train.report``. A side's step time is the median
over its report windows after the first (which holds warm-up), best of ``--repeats`` runs, the
sides alternating. Prints one JSON object; the goal is ``ray_over_plain <= 1.05``. Not a test:
it asserts nothing. Worker start-up is not step time; the wall times show it separately.

With a GPU, it also trains on it (plain loop, one process, bf16) and reports tokens/s and MFU.

    python benchmarks/train_overhead.py [--model-size tiny] [--steps 60] [--seq-len 128]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workloads.train.config import TrainConfig
from workloads.train.loop import train
from workloads.train.model import model_config, train_flops_per_token
from workloads.train.runenv import LocalEnv, RayTrainEnv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def steady_step_time(reports: list[dict[str, Any]]) -> float:
    """Median step time over the report windows after the first (which holds warm-up)."""
    windows = [r["step_time_s"] for r in reports[1:] if r.get("step_time_s")]
    if not windows:
        raise ValueError("need at least two report windows: raise --steps")
    return statistics.median(windows)


def steady_cpu_per_step(reports: list[dict[str, Any]]) -> float:
    """Median CPU seconds per step of rank 0 over the windows after the first."""
    timed = [r for r in reports if "cpu_s" in r and r.get("step_time_s")]
    per_step = [
        (b["cpu_s"] - a["cpu_s"]) / (b["step"] - a["step"]) for a, b in itertools.pairwise(timed)
    ]
    return statistics.median(per_step)


class _Recording:
    """Wraps a run env: keeps every report, and rank 0 writes them to ``out`` at the end."""

    def __init__(self, inner: Any, out: str) -> None:
        self.inner, self.out = inner, out
        self.rank, self.world_size, self.device = inner.rank, inner.world_size, inner.device
        self.reports: list[dict[str, Any]] = []

    def latest_checkpoint(self) -> Any:
        return self.inner.latest_checkpoint()

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int) -> None:
        # This process's CPU seconds so far: unlike wall time, barely moved by other processes
        # competing for the machine's cores.
        self.reports.append(dict(metrics) | {"cpu_s": time.process_time()})
        self.inner.report(metrics, checkpoint_dir, step)

    def save(self) -> None:
        if self.rank == 0:
            Path(self.out).write_text(json.dumps(self.reports))


class _Silent(LocalEnv):
    """The plain loop's env: no reporting at all, like a hand-written torch loop."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int) -> None:
        pass


def _plain_worker(
    rank: int, world: int, port: int, cfg: dict[str, Any], threads: int, out: str
) -> None:
    torch.set_num_threads(threads)
    gpu = cfg["accelerator"] == "gpu"
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl" if gpu else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
    )
    env = _Recording(_Silent(tempfile.mkdtemp(), rank=rank, world_size=world, device=device), out)
    train(TrainConfig.from_dict(cfg), env)
    env.save()
    dist.destroy_process_group()


def _ray_worker(config: dict[str, Any]) -> None:
    torch.set_num_threads(config["threads"])
    env = _Recording(RayTrainEnv(), config["out"])
    train(TrainConfig.from_dict(config["cfg"]), env)
    env.save()


def run_plain(cfg: TrainConfig, threads: int, out: Path) -> float:
    # Ray starts a 1-CPU worker with OMP_NUM_THREADS=1; give the plain processes the same.
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    start = time.perf_counter()
    try:
        mp.spawn(
            _plain_worker,
            args=(cfg.workers, _free_port(), cfg.to_dict(), threads, str(out)),
            nprocs=cfg.workers,
            join=True,
        )
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    return time.perf_counter() - start


def run_ray(cfg: TrainConfig, threads: int, out: Path) -> float:
    from ray.train import RunConfig
    from ray.train.torch import TorchTrainer

    from workloads.train.scaling import build_scaling_config, build_torch_config

    start = time.perf_counter()
    trainer = TorchTrainer(
        _ray_worker,
        train_loop_config={"cfg": cfg.to_dict(), "threads": threads, "out": str(out)},
        torch_config=build_torch_config(cfg),
        scaling_config=build_scaling_config(cfg),
        run_config=RunConfig(name=out.stem, storage_path=cfg.storage_path),
    )
    result = trainer.fit()
    if result.error is not None:
        raise RuntimeError(result.error)
    return time.perf_counter() - start


def run_gpu(cfg: TrainConfig, out: Path) -> dict[str, Any]:
    """One GPU, the plain loop, bf16: tokens/s and MFU of the cuda path."""
    mp.spawn(
        _plain_worker,
        args=(1, _free_port(), cfg.to_dict(), torch.get_num_threads(), str(out)),
        nprocs=1,
        join=True,
    )
    reports = json.loads(out.read_text())
    last = reports[-1]
    return {
        "device": torch.cuda.get_device_name(0),
        "model_size": cfg.model_size,
        "seq_len": cfg.seq_len,
        "global_batch_size": cfg.global_batch_size,
        "step_time_s": steady_step_time(reports),
        "tokens_per_s": last["tokens_per_s"],
        "mfu": last["mfu"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-size", default="tiny")
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp2"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--report-every", type=int, default=10)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--threads-per-worker", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2, help="runs per side; best is kept")
    parser.add_argument("--gpu-model-size", default="gpt2-small")
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="park-overhead-"))
    cfg = TrainConfig(
        accelerator="cpu",
        num_workers=2,
        strategy=args.strategy,
        model_size=args.model_size,
        steps=args.steps,
        report_every=args.report_every,
        seq_len=args.seq_len,
        global_batch_size=args.global_batch_size,
        checkpoint_every=0,
        storage_path=str(work / "ray"),
    )

    # A private Ray head on free ports (others may run Ray here), as `park local` starts it;
    # its auth token must be in this process's environment before Ray is imported.
    from infra.tools.local import LocalRay, ray_auth_env

    head = LocalRay(
        temp_dir=Path(tempfile.mkdtemp(prefix="rt", dir="/tmp")), log_path=work / "ray-head.log"
    )
    head.start()
    samples: dict[str, list[float]] = {"plain": [], "ray": []}
    cpu: dict[str, list[float]] = {"plain": [], "ray": []}
    walls: dict[str, list[float]] = {"plain": [], "ray": []}
    try:
        os.environ.update(ray_auth_env())
        import ray

        ray.init(address=head.gcs_address, log_to_driver=False)
        # Alternate the two sides so that a busy moment of the machine hits both alike.
        for i in range(args.repeats):
            for side, run in (("plain", run_plain), ("ray", run_ray)):
                out = work / f"{side}-{i}.json"
                walls[side].append(run(cfg, args.threads_per_worker, out))
                reports = json.loads(out.read_text())
                samples[side].append(steady_step_time(reports))
                cpu[side].append(steady_cpu_per_step(reports))
        ray.shutdown()
    finally:
        head.stop()
    plain, via_ray = min(samples["plain"]), min(samples["ray"])

    model = model_config(cfg.model_size, seq_len=cfg.seq_len)
    tokens_per_step = cfg.batch * model.block_size
    result: dict[str, Any] = {
        "model_size": cfg.model_size,
        "strategy": cfg.strategy,
        "workers": cfg.workers,
        "steps": cfg.steps,
        "global_batch_size": cfg.batch,
        "seq_len": model.block_size,
        "threads_per_worker": args.threads_per_worker,
        "flops_per_token": train_flops_per_token(model, model.block_size),
        "plain_step_time_s": plain,
        "ray_train_step_time_s": via_ray,
        "ray_over_plain": via_ray / plain,
        "plain_tokens_per_s": tokens_per_step / plain,
        "ray_train_tokens_per_s": tokens_per_step / via_ray,
        "plain_cpu_s_per_step": min(cpu["plain"]),
        "ray_train_cpu_s_per_step": min(cpu["ray"]),
        "ray_over_plain_cpu": min(cpu["ray"]) / min(cpu["plain"]),
        "plain_step_time_samples_s": samples["plain"],
        "ray_train_step_time_samples_s": samples["ray"],
        "plain_wall_s": walls["plain"],
        "ray_train_wall_s": walls["ray"],
        "goal": "ray_over_plain <= 1.05",
    }
    if torch.cuda.is_available():
        gpu_cfg = replace(
            cfg,
            accelerator="gpu",
            num_workers=1,
            model_size=args.gpu_model_size,
            seq_len=1024,
            global_batch_size=16,
            steps=40,
        )
        result["gpu"] = run_gpu(gpu_cfg, work / "gpu.json")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
