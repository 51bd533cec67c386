"""Ray Train's overhead: the same training in a plain torch loop and through TorchTrainer.

Both sides run the workload's own loop (``workloads.train.run.loop.train``) with the same model,
data, batch, steps and threads per worker: (i) processes started by ``torch.multiprocessing``
with a gloo (or nccl) process group, reporting nowhere; (ii) Ray Train workers of a
TorchTrainer on a private local Ray, with the workload's own Ray reporting (metrics go to Ray
with checkpoints only; a final one here). Cases, each run side by side:

- ``gpt-tiny``: the default, the GPT ``tiny`` preset on synthetic tokens (the goal applies);
- ``hf-tiny-llama``: the Hugging Face path, ``park:tiny-llama`` on the shipped facts (SFT);
- ``hf-llama-4m``: a larger Llama (4M parameters, from a config) on the facts as text, where a
  step costs ~20x more and Ray's fixed per-step costs weigh less.

A side's step time is the median over its report windows after the first (which holds
warm-up); a case keeps the best of ``--repeats`` runs per side, the sides alternating so that a
busy moment of the machine hits both alike. CPU seconds per step (rank 0's process, all its
threads) are barely moved by other processes and show the work Ray adds in the worker itself.
Time to first step is from the side's start (spawn, or TorchTrainer construction) to the end
of step 1. The load of the machine (1-minute load average, and the CPU share of every process
on it) is recorded around every run: this machine is shared.

With a GPU it also runs the Hugging Face path on it, both sides, one worker, bf16: tokens/s
and MFU. ``--gpu-memory`` runs only the memory section instead: each shipped stack's training
step on GPU 0 (rank 0 of its chips, a fake process group) with
``torch.cuda.max_memory_allocated`` beside infra.resolve.training_fit's estimate. Prints one JSON
document with every figure and the goals, and whether each holds in this run. Not a test: it
asserts nothing.

    python benchmarks/train_overhead.py [--cases gpt-tiny,hf-tiny-llama] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from workloads.protocol import free_port
from workloads.train.config import TrainConfig
from workloads.train.distributed.runenv import LocalEnv, RayTrainEnv
from workloads.train.run.loop import train
from workloads.train.testing import cpu_run, decoder_shape, facts_sft, process_group

try:  # imported as benchmarks.train_overhead (the tests)
    from . import train_figures, train_memory
except ImportError:  # run as a script: this folder is sys.path[0]
    import train_figures  # type: ignore[no-redef]
    import train_memory  # type: ignore[no-redef]


class _Recording:
    """Wraps a run env: keeps every report, and rank 0 writes them to ``out`` at the end."""

    def __init__(self, inner: Any, out: str) -> None:
        self.inner, self.out = inner, out
        self.rank, self.world_size, self.device = inner.rank, inner.world_size, inner.device
        self.reports: list[dict[str, Any]] = []

    def latest_checkpoint(self) -> Any:
        return self.inner.latest_checkpoint()

    def checkpoint_folder(self, step: int) -> Any:
        return self.inner.checkpoint_folder(step)

    def _keep(self, metrics: dict[str, Any]) -> None:
        # This process's CPU seconds so far: unlike wall time, barely moved by other processes
        # competing for the machine's cores.
        self.reports.append(dict(metrics) | {"cpu_s": time.process_time()})

    def progress(self, metrics: dict[str, Any]) -> None:
        self._keep(metrics)
        self.inner.progress(metrics)

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int) -> None:
        self._keep(metrics)
        self.inner.report(metrics, checkpoint_dir, step)

    def save(self) -> None:
        if self.rank == 0:
            Path(self.out).write_text(
                json.dumps({"reports": self.reports, "worker": worker_settings()})
            )


def worker_settings() -> dict[str, Any]:
    """What decides how a worker's threads share the cores: its priority, torch's intra- and
    inter-op threads, the OpenMP variable, its CPU affinity and how many threads it runs."""
    import threading

    return {
        "nice": os.nice(0),
        "own_session": os.getsid(0) != int(os.environ.get("PARK_BENCH_CALLER_SID", "-1")),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
        "os_threads": len(os.listdir("/proc/self/task")),
        "python_threads": threading.active_count(),
        "loop_in_main_thread": threading.current_thread() is threading.main_thread(),
    }


class _Silent(LocalEnv):
    """The plain loop's env: no reporting at all, like a hand-written torch loop."""

    def progress(self, metrics: dict[str, Any]) -> None:
        pass

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int) -> None:
        pass


def _plain_worker(
    rank: int, world: int, port: int, cfg: dict[str, Any], threads: int, out: str
) -> None:
    sys.stdout = sys.stderr  # the loop's progress lines; stdout carries the JSON document only
    torch.set_num_threads(threads)
    gpu = cfg["accelerator"] == "gpu"
    device = torch.device("cuda", rank) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    env = _Recording(_Silent(tempfile.mkdtemp(), rank=rank, world_size=world, device=device), out)
    backend, nccl_device = ("nccl", device) if gpu else ("gloo", None)
    with process_group(backend, world_size=world, rank=rank, port=port, device=nccl_device):
        train(TrainConfig.from_dict(cfg), env)
        env.save()


def _ray_worker(config: dict[str, Any]) -> None:
    torch.set_num_threads(config["threads"])
    env = _Recording(RayTrainEnv(), config["out"])
    train(TrainConfig.from_dict(config["cfg"]), env)
    env.save()


def _plain_group(cfg: dict[str, Any], workers: int, threads: int, out: str) -> None:
    """The plain side's workers, in a session of their own as Ray's workers are (the Ray head's):
    where the kernel groups CPU time by session (CONFIG_SCHED_AUTOGROUP, on here), a side's
    workers then share the machine with other sessions alike, not with this benchmark's
    caller's session (measured: under other jobs' load the plain side ran at 0.4-0.6x Ray's
    speed while its workers sat in the caller's session)."""
    os.setsid()
    mp.spawn(
        _plain_worker, args=(workers, free_port(), cfg, threads, out), nprocs=workers, join=True
    )


def run_plain(cfg: TrainConfig, threads: int, out: Path) -> float:
    # Ray starts a 1-CPU worker with OMP_NUM_THREADS=1; give the plain processes the same.
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    start = time.time()
    try:
        group = mp.get_context("spawn").Process(
            target=_plain_group, args=(cfg.to_dict(), cfg.workers, threads, str(out))
        )
        group.start()
        group.join()
        if group.exitcode != 0:
            raise RuntimeError(f"the plain side exited with {group.exitcode}")
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    return start


def run_ray(cfg: TrainConfig, threads: int, out: Path) -> float:
    from ray.train.torch import TorchTrainer

    from workloads.train.distributed.scaling import build_scaling_config, build_torch_config
    from workloads.train.launcher import build_run_config

    start = time.time()
    trainer = TorchTrainer(
        _ray_worker,
        train_loop_config={"cfg": cfg.to_dict(), "threads": threads, "out": str(out)},
        torch_config=build_torch_config(cfg),
        scaling_config=build_scaling_config(cfg),
        run_config=build_run_config(cfg, name=out.stem),
    )
    result = trainer.fit()
    if result.error is not None:
        raise RuntimeError(result.error)
    return start


# ---- cases ----------------------------------------------------------------------------------


def _llama_folder(work: Path, name: str, **shape: Any) -> str:
    """A Llama config (``decoder_shape`` of ``shape``) and park:tiny-llama's tokenizer, whose
    special ids it takes, in a local folder: a model for ``--init config``."""
    from transformers import AutoTokenizer, LlamaConfig

    from workloads.train.models import tiny_llama

    folder = work / name
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama.build())
    LlamaConfig(**decoder_shape(**shape, tokenizer=tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


# Every case writes only its final checkpoint, no export: the loop's own work, timed.
UNSAVED: dict[str, Any] = {"checkpoint_every": 0, "export": False}


# Steps per run when --steps is not given. The goal case runs long enough that Ray Train's
# one-off start-up tail falls in fewer than half of its report windows: the controller starts
# its helper actors (DatasetManager, PreemptionWatcher, PlacementGroupCleaner,
# SynchronizationActor: each a fresh worker process importing Ray) as the worker group
# starts, i.e. beside the first steps. Measured on 2 cores, every process sampled every 2 s:
# Ray's other processes took ~0.48 core over the loop's first ~14 s (~6 CPU-s), ~0.09 core
# after. A 60-step run (6 s at ~0.1 s per step) lay entirely inside that tail, so its median
# window was the tail's (1.055x) while 400 steps gave 0.993x.
# The tail is reported beside the steady figure (``transient_s``), not hidden by it.
DEFAULT_STEPS = {"gpt-tiny": 300}
OTHER_CASES_STEPS = 60


def cases(args: argparse.Namespace, work: Path) -> dict[str, TrainConfig]:
    def steps(case: str) -> int:
        return int(args.steps or DEFAULT_STEPS.get(case, OTHER_CASES_STEPS))

    common: dict[str, Any] = dict(
        num_workers=2,
        strategy=args.strategy,
        report_every=args.report_every,
        seq_len=128,
        global_batch_size=16,
        storage_path=str(work / "ray"),
        **UNSAVED,
    )
    # A 4M-parameter Llama: a step costs ~20x more, so half the steps and report windows.
    halved = {
        "steps": max(steps("hf-llama-4m") // 2, 3 * args.report_every // 2),
        "report_every": max(args.report_every // 2, 1),
    }
    llama_4m = dict(hidden=256, intermediate=1024, layers=4, heads=4, kv_heads=2, positions=512)
    available = {
        "gpt-tiny": lambda: cpu_run(**common, steps=steps("gpt-tiny"), model_size="tiny"),
        "hf-tiny-llama": lambda: facts_sft(**common, steps=steps("hf-tiny-llama"), lr=1e-3),
        "hf-llama-4m": lambda: facts_sft(
            **(common | halved),
            lr=1e-3,
            model=_llama_folder(work, "llama-4m", **llama_4m),
            init="config",
            objective="clm",
        ),
    }
    unknown = set(args.cases) - set(available)
    if unknown:
        raise SystemExit(f"unknown --cases {sorted(unknown)}; choose from {sorted(available)}")
    return {name: available[name]() for name in args.cases}


def run_case(cfg: TrainConfig, repeats: int, threads: int, work: Path, name: str) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "ray_train": []}
    for i in range(repeats):
        for side, run in (("plain", run_plain), ("ray_train", run_ray)):
            out = work / f"{name}-{side}-{i}.json"
            load = train_figures.Load(os.getloadavg()[0])
            start = run(cfg, threads, out)
            end = time.time()
            saved = json.loads(out.read_text())
            figures = train_figures.side_figures(saved["reports"], start, end)
            runs[side].append(figures | {"load": load.stop().as_dict(), "worker": saved["worker"]})
            print(f"{name} {side} #{i}: {runs[side][-1]}", file=sys.stderr)
    return train_figures.compare(cfg, threads, runs)


def gpu_case(work: Path, repeats: int) -> dict[str, Any]:
    """One GPU: the Hugging Face path (350M Llama, bf16, synthetic tokens), plain and Ray."""
    # ~350M parameters: 1024 wide, 24 layers, a 32K vocabulary
    size = dict(hidden=1024, intermediate=2816, layers=24, heads=16, kv_heads=8, positions=2048)
    model = _llama_folder(work, "llama-350m", **size, vocab=32768)
    schedule: dict[str, Any] = dict(steps=40, report_every=10, seq_len=2048, global_batch_size=8)
    cfg = TrainConfig(
        accelerator="gpu",
        num_workers=1,
        model=model,
        init="config",
        storage_path=str(work / "ray-gpu"),
        **schedule,
        **UNSAVED,
    )
    result = run_case(cfg, repeats, torch.get_num_threads(), work, "gpu")
    reports = json.loads((work / "gpu-plain-0.json").read_text())["reports"]
    result |= {"device": torch.cuda.get_device_name(0), "mfu": reports[-1]["mfu"]}
    return result


def _autogroup() -> str | None:
    """Whether the kernel shares CPU time out by session first (then each side's session
    matters: ``_plain_group``)."""
    path = Path("/proc/sys/kernel/sched_autogroup_enabled")
    return path.read_text().strip() if path.exists() else None


def pods_train_env() -> dict[str, str]:
    """Ray Train's settings as the RayJob's pods run it. The rendered RayJob sets no
    ``RAY_TRAIN_*`` variable (tests/golden/*/manifests/rayjob-park-train.yaml), so its controller
    polls the workers at Ray's default interval (2 s), not park local's 0.25 s (LOCAL_RAY_ENV,
    there to notice a finished worker group sooner; it adds 8x the polls during the steps).
    The workers themselves get what the launcher gives them (``build_run_config``: nice 0) and
    what Ray gives a 1-CPU worker (OMP_NUM_THREADS=1: torch's 1 intra-op thread)."""
    # Ray 2.60's default (ray/train/v2/_internal/constants.py: DEFAULT_HEALTH_CHECK_INTERVAL_S);
    # not imported: Ray must not be imported before its auth token is in the environment.
    return {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "2"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cases",
        type=lambda s: [c for c in s.split(",") if c],
        default=["gpt-tiny", "hf-tiny-llama", "hf-llama-4m"],
    )
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp2"])
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"steps per run (default: {DEFAULT_STEPS} by case, else {OTHER_CASES_STEPS})",
    )
    parser.add_argument("--report-every", type=int, default=10)
    parser.add_argument("--threads-per-worker", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="runs per side; best is kept")
    parser.add_argument(
        "--gpu-memory",
        action="store_true",
        help="only the GPU memory section: the shipped stacks' per-chip training step on GPU 0, "
        "torch.cuda.max_memory_allocated beside infra.resolve.training_fit's estimate (no Ray)",
    )
    args = parser.parse_args(argv)
    if args.gpu_memory:
        section = {"gpu_memory": train_memory.gpu_memory()}
        print(json.dumps(section, indent=2))
        return section

    os.environ["PARK_BENCH_CALLER_SID"] = str(os.getsid(0))  # workers say if they left it
    work = Path(tempfile.mkdtemp(prefix="park-overhead-"))
    configs = cases(args, work)
    # A private Ray head on free ports (others may run Ray here), as `park local` starts it;
    # its auth token must be in this process's environment before Ray is imported.
    from infra.tools.local import LocalRay, ray_auth_env

    head = LocalRay(
        temp_dir=Path(tempfile.mkdtemp(prefix="rt", dir="/tmp")),
        log_path=work / "ray-head.log",
        env=pods_train_env(),
    )
    machine_before = os.getloadavg()
    head.start()
    results: dict[str, Any] = {}
    try:
        os.environ.update(ray_auth_env())
        import ray

        ray.init(address=head.gcs_address, log_to_driver=False)
        for name, cfg in configs.items():
            results[name] = run_case(cfg, args.repeats, args.threads_per_worker, work, name)
        gpu = gpu_case(work, args.repeats) if torch.cuda.is_available() else None
        ray.shutdown()
    finally:
        head.stop()
    checked = train_figures.goals(results)
    document: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "load_1m_5m_15m_before": [round(v, 2) for v in machine_before],
            "load_1m_5m_15m_after": [round(v, 2) for v in os.getloadavg()],
            "note": "shared machine: see each run's load; ratios are best-of-N, alternating",
            "sched_autogroup": _autogroup(),
        },
        "method": (
            "same loop both sides; step time = median of report windows after the first, "
            "best of --repeats; cpu = rank 0's process CPU seconds per step; time to first "
            "step from the side's start"
        ),
        "settings": {
            "ray_head_env": pods_train_env(),
            "workers": "Ray: the launcher's run config (nice 0), 1 CPU each (OMP_NUM_THREADS=1); "
            "plain: the same threads, nice 0, in a session of their own as Ray's are (each "
            "run's 'worker' record says what its rank 0 had)",
        },
        "cases": results,
        "gpu": gpu if gpu is not None else "no GPU on this machine",
        "load": train_figures.noise(results),
        "goals": checked,
        "all_goals_hold": all(g["holds"] for g in checked),
    }
    print(json.dumps(document, indent=2))
    return document


if __name__ == "__main__":
    main()
    sys.exit(0)
