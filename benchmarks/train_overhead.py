"""Ray Train's overhead: the same training in a plain torch loop and through TorchTrainer.

Both sides run the workload's own loop (``workloads.train.loop.train``) with the same model,
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
``torch.cuda.max_memory_allocated`` beside infra.training_fit's estimate. Prints one JSON
document with every figure and the goals, and whether each holds in this run. Not a test: it
asserts nothing.

    python benchmarks/train_overhead.py [--cases gpt-tiny,hf-tiny-llama] [--repeats 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workloads.protocol import free_port
from workloads.train.config import TrainConfig
from workloads.train.loop import train
from workloads.train.runenv import LocalEnv, RayTrainEnv

GOAL_RATIO = 1.05
DEFAULT_CASE = "gpt-tiny"


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
            Path(self.out).write_text(json.dumps(self.reports))


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
    dist.init_process_group(
        "nccl" if gpu else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        device_id=device if gpu else None,
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
    start = time.time()
    try:
        mp.spawn(
            _plain_worker,
            args=(cfg.workers, free_port(), cfg.to_dict(), threads, str(out)),
            nprocs=cfg.workers,
            join=True,
        )
    finally:
        if saved is None:
            os.environ.pop("OMP_NUM_THREADS")
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    return start


def run_ray(cfg: TrainConfig, threads: int, out: Path) -> float:
    from ray.train.torch import TorchTrainer

    from workloads.train.launcher import build_run_config
    from workloads.train.scaling import build_scaling_config, build_torch_config

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


# ---- the machine ----------------------------------------------------------------------------


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


@dataclass
class Load:
    """How busy the machine was over one run."""

    load_1m_before: float
    load_1m_after: float = 0.0
    cpu_busy_share: float = 0.0  # of all CPUs, by every process on the machine
    _start: tuple[int, int] = field(default_factory=_cpu_jiffies, repr=False)

    def stop(self) -> Load:
        busy, total = _cpu_jiffies()
        self.load_1m_after = os.getloadavg()[0]
        span = max(total - self._start[1], 1)
        self.cpu_busy_share = round((busy - self._start[0]) / span, 3)
        return self

    def as_dict(self) -> dict[str, float]:
        return {
            "load_1m_before": round(self.load_1m_before, 2),
            "load_1m_after": round(self.load_1m_after, 2),
            "cpu_busy_share": self.cpu_busy_share,
        }


# ---- cases ----------------------------------------------------------------------------------


def _tiny_llama_4m(work: Path) -> str:
    """A 4M-parameter Llama config with park:tiny-llama's tokenizer, in a local folder."""
    from transformers import AutoTokenizer, LlamaConfig

    from workloads.train import tiny_llama

    folder = work / "llama-4m"
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama.build())
    LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    ).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _gpu_llama(work: Path) -> str:
    """A Llama of ~350M parameters (1024 wide, 24 layers, a 32K vocabulary) from a config."""
    from transformers import AutoTokenizer, LlamaConfig

    from workloads.train import tiny_llama

    folder = work / "llama-350m"
    LlamaConfig(
        vocab_size=32768,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=8,
        max_position_embeddings=2048,
    ).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_llama.build()).save_pretrained(folder)
    return str(folder)


def cases(args: argparse.Namespace, work: Path) -> dict[str, TrainConfig]:
    base = TrainConfig(
        accelerator="cpu",
        num_workers=2,
        strategy=args.strategy,
        steps=args.steps,
        report_every=args.report_every,
        seq_len=128,
        global_batch_size=16,
        checkpoint_every=0,
        export=False,
        storage_path=str(work / "ray"),
    )
    facts = dict(model="park:tiny-llama", data="park:facts", lr=1e-3)
    available = {
        "gpt-tiny": lambda: replace(base, model_size="tiny"),
        "hf-tiny-llama": lambda: replace(base, **facts, objective="sft"),
        "hf-llama-4m": lambda: replace(
            base,
            **(facts | {"model": _tiny_llama_4m(work)}),
            init="config",
            objective="clm",
            steps=max(args.steps // 2, 3 * args.report_every // 2),
            report_every=max(args.report_every // 2, 1),
        ),
    }
    unknown = set(args.cases) - set(available)
    if unknown:
        raise SystemExit(f"unknown --cases {sorted(unknown)}; choose from {sorted(available)}")
    return {name: available[name]() for name in args.cases}


def _side(reports: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """One run's figures; time to first step is split at the loop's start: before it, process
    start-up and (Ray) the controller and worker group; after it, model, data and step 1."""
    first = next((r for r in reports if r.get("first_step_at")), {})
    return {
        "step_time_s": steady_step_time(reports),
        "best_window_step_time_s": min(
            r["step_time_s"] for r in reports[1:] if r.get("step_time_s")
        ),
        "cpu_s_per_step": steady_cpu_per_step(reports),
        "time_to_first_step_s": first["first_step_at"] - start if first else None,
        "until_loop_starts_s": first["started_at"] - start if first else None,
        "wall_s": end - start,
    }


def run_case(cfg: TrainConfig, repeats: int, threads: int, work: Path, name: str) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "ray_train": []}
    for i in range(repeats):
        for side, run in (("plain", run_plain), ("ray_train", run_ray)):
            out = work / f"{name}-{side}-{i}.json"
            load = Load(os.getloadavg()[0])
            start = run(cfg, threads, out)
            end = time.time()
            reports = json.loads(out.read_text())
            runs[side].append(_side(reports, start, end) | {"load": load.stop().as_dict()})
            print(f"{name} {side} #{i}: {runs[side][-1]}", file=sys.stderr)
    best = {side: min(r["step_time_s"] for r in samples) for side, samples in runs.items()}
    window = {
        side: min(r["best_window_step_time_s"] for r in samples) for side, samples in runs.items()
    }
    cpu = {side: min(r["cpu_s_per_step"] for r in samples) for side, samples in runs.items()}

    def least(key: str) -> dict[str, float | None]:
        return {
            side: min((r[key] for r in samples if r[key] is not None), default=None)
            for side, samples in runs.items()
        }

    ttfs, until_loop = least("time_to_first_step_s"), least("until_loop_starts_s")
    tokens = cfg.batch * int(cfg.seq_len or 0)
    return {
        "model": cfg.model or f"gpt:{cfg.model_size}",
        "objective": cfg.objective if cfg.model else "synthetic tokens",
        "strategy": cfg.strategy,
        "workers": cfg.workers,
        "threads_per_worker": threads,
        "steps": cfg.steps,
        "global_batch_size": cfg.batch,
        "seq_len": cfg.seq_len,
        "plain_step_time_s": best["plain"],
        "ray_train_step_time_s": best["ray_train"],
        "ray_over_plain": best["ray_train"] / best["plain"],
        # The fastest report window of each side: least touched by other processes' bursts.
        "plain_best_window_step_time_s": window["plain"],
        "ray_train_best_window_step_time_s": window["ray_train"],
        "ray_over_plain_best_window": window["ray_train"] / window["plain"],
        "plain_tokens_per_s": tokens / best["plain"],
        "ray_train_tokens_per_s": tokens / best["ray_train"],
        "plain_cpu_s_per_step": cpu["plain"],
        "ray_train_cpu_s_per_step": cpu["ray_train"],
        "ray_over_plain_cpu": cpu["ray_train"] / cpu["plain"],
        "plain_time_to_first_step_s": ttfs["plain"],
        "ray_train_time_to_first_step_s": ttfs["ray_train"],
        "plain_until_loop_starts_s": until_loop["plain"],
        "ray_train_until_loop_starts_s": until_loop["ray_train"],
        "runs": runs,
    }


def gpu_case(work: Path, repeats: int) -> dict[str, Any]:
    """One GPU: the Hugging Face path (350M Llama, bf16, synthetic tokens), plain and Ray."""
    cfg = TrainConfig(
        accelerator="gpu",
        num_workers=1,
        model=_gpu_llama(work),
        init="config",
        data="synthetic",
        seq_len=2048,
        global_batch_size=8,
        steps=40,
        report_every=10,
        checkpoint_every=0,
        export=False,
        storage_path=str(work / "ray-gpu"),
    )
    result = run_case(cfg, repeats, torch.get_num_threads(), work, "gpu")
    reports = json.loads((work / "gpu-plain-0.json").read_text())
    result |= {"device": torch.cuda.get_device_name(0), "mfu": reports[-1]["mfu"]}
    return result


# ---- GPU memory: the training memory model beside CUDA's own count ----------------------------


def gpu_memory_settings(stack: str) -> dict[str, Any]:
    """One chip of ``stack``'s training run as the resolve step plans it, and the estimate
    (infra.training_fit, without the runtime reserve, which CUDA's count does not see)."""
    from infra.stack import from_file

    plan = from_file(Path(__file__).resolve().parents[1] / "stacks" / f"Pulumi.{stack}.yaml")
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
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from workloads.train import hf
    from workloads.train.data import Batch
    from workloads.train.loss import install_loss_forward
    from workloads.train.modeling import TrainModel
    from workloads.train.step import forward_backward
    from workloads.train.strategies import autocast, build_mesh, build_optimizer, replicate, shard

    root = Path(__file__).resolve().parents[1]
    entry = json.loads((root / "infra/data/models/configs.json").read_text())["models"]
    raw = dict(entry[settings["model"]]["config"])
    config = transformers.CONFIG_MAPPING[raw.pop("model_type")](**raw).get_text_config()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    fsdp = settings["strategy"] == "fsdp2"
    world = settings["world_size"] if fsdp else 1  # DDP: the same per chip at any world size
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
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
    finally:
        dist.destroy_process_group()


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


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal with this run's value and whether it holds.

    The goal is the step-time ratio of the default run; the CPU-time ratio beside it says
    whether Ray adds work to a training worker, which the machine's load moves far less. The
    other cases show both ratios where a step costs more."""
    out = []
    for name, case in results.items():
        role = "the default run" if name == DEFAULT_CASE else "where a step costs more"
        for key, what in (("ray_over_plain", "step time"), ("ray_over_plain_cpu", "CPU per step")):
            value = case[key]
            out.append(
                {
                    "goal": f"{name} ({role}): {what}, {key} <= {GOAL_RATIO}",
                    "value": round(value, 4),
                    "holds": value <= GOAL_RATIO,
                }
            )
    return out


def noise(results: dict[str, Any]) -> dict[str, Any]:
    """How loaded the machine was during the runs, and what that means for the ratios."""
    loads = [
        run["load"]["load_1m_before"]
        for case in results.values()
        for runs in case["runs"].values()
        for run in runs
    ]
    cpus = os.cpu_count() or 1
    busy = bool(loads) and max(loads) > cpus
    return {
        "load_1m_min": min(loads, default=None),
        "load_1m_max": max(loads, default=None),
        "busy": busy,
        "reading": (
            "other processes kept the CPUs busy during some runs: a step-time ratio below 1 "
            "means the plain side drew the busier moments; the CPU-per-step ratios are the "
            "steady figure"
            if busy
            else "the machine was quiet enough for the step-time ratios to stand on their own"
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--cases",
        type=lambda s: [c for c in s.split(",") if c],
        default=["gpt-tiny", "hf-tiny-llama", "hf-llama-4m"],
    )
    parser.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp2"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--report-every", type=int, default=10)
    parser.add_argument("--threads-per-worker", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="runs per side; best is kept")
    parser.add_argument(
        "--gpu-memory",
        action="store_true",
        help="only the GPU memory section: the shipped stacks' per-chip training step on GPU 0, "
        "torch.cuda.max_memory_allocated beside infra.training_fit's estimate (no Ray)",
    )
    args = parser.parse_args(argv)
    if args.gpu_memory:
        section = {"gpu_memory": gpu_memory()}
        print(json.dumps(section, indent=2))
        return section

    work = Path(tempfile.mkdtemp(prefix="park-overhead-"))
    configs = cases(args, work)
    # A private Ray head on free ports (others may run Ray here), as `park local` starts it;
    # its auth token must be in this process's environment before Ray is imported.
    from infra.tools.local import LocalRay, ray_auth_env

    head = LocalRay(
        temp_dir=Path(tempfile.mkdtemp(prefix="rt", dir="/tmp")), log_path=work / "ray-head.log"
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
    checked = goals(results)
    document: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "load_1m_5m_15m_before": [round(v, 2) for v in machine_before],
            "load_1m_5m_15m_after": [round(v, 2) for v in os.getloadavg()],
            "note": "shared machine: see each run's load; ratios are best-of-N, alternating",
        },
        "method": (
            "same loop both sides; step time = median of report windows after the first, "
            "best of --repeats; cpu = rank 0's process CPU seconds per step; time to first "
            "step from the side's start"
        ),
        "cases": results,
        "gpu": gpu if gpu is not None else "no GPU on this machine",
        "load": noise(results),
        "goals": checked,
        "all_goals_hold": all(g["holds"] for g in checked),
    }
    print(json.dumps(document, indent=2))
    return document


if __name__ == "__main__":
    main()
    sys.exit(0)
