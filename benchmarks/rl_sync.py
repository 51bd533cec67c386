"""The RL weight sync per learner step, two schemes side by side, on this machine's CPU; and
the same counting for the shipped stacks' 1.5B, a 7B and the 8B stack on v6e, with the estimate
of seconds per phase and the source of each phase's rate (infra/resolve/rl.py ``sync_phases``).

- **before** (the scheme issue 31 replaced): the learner writes the weights as an fp32
  safetensors folder (the trainer's exporter); every tensor-parallel worker of every engine reads
  the whole folder into memory, engines one after another.
- **now** (workloads/rl/sync.py): the learner puts bf16 buckets into Ray's object store
  (``publish_buckets``, the job's own code); one ``HostReceiver`` per engine host pulls them once,
  several gets in flight, and writes them into host memory; every engine's tensor-parallel
  workers, all engines at once, stream the files memory-mapped and copy out their own slice
  (what vLLM's weight loaders do with ``reload_weights``).

Every actor is started and **warmed before the clock** (its imports, and a first tiny version
published, staged and read through the same calls), so what is timed is the transfer, not
``import torch`` in a fresh process. "now" is timed per phase: **publish** (the learner packs and
puts its buckets), **pull** (the receiver's gets, from the first to the last bucket in),
**write** (the receiver writing the buckets into host memory, summed; overlapped with the pulls),
**stage** (the receiver's pull and write, wall), **load** (every worker reading its slices, all at
once, wall) and **total** (publish to the last load, wall, Ray's calls included). On one machine
the pull is Ray's local get (no network: the object is already in this host's store), so the
pull seconds here are Ray's overhead only; the network's share is the v6e estimate's.

The engines here are stand-ins (Ray actors doing the reads and slice copies a vLLM worker does),
so the run measures the transport, not vLLM: vLLM's own reload is in the v6e estimate (its rate
from vLLM's measurements) and tested in tests/workloads/test_rl_rollout.py. Bytes are counted
where they move: for "before", the bytes written and each worker's bytes read; for "now", the
bytes each host pulled from the object store (this machine is one host) and, apart, the bytes
each worker copied out of host memory. The byte counts are checked against the formulas the
preview uses (``infra.resolve.rl.SyncEstimate``), which then size the v6e stacks.

``python benchmarks/rl_sync.py [--out FILE]`` (JSON on stdout, and in FILE). Run it on a quiet
machine: it starts a local Ray.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Three Llama shapes built from configs (random weights, nothing downloaded).
SIZES: dict[str, dict[str, Any]] = {
    "llama-20m": {"hidden_size": 256, "num_hidden_layers": 4, "intermediate_size": 688},
    "llama-60m": {"hidden_size": 512, "num_hidden_layers": 8, "intermediate_size": 1376},
    "llama-170m": {"hidden_size": 1024, "num_hidden_layers": 8, "intermediate_size": 2752},
}
ENGINES = 2
TENSOR_PARALLEL = 2
# The v6e layouts: the rl stack (1.5B), the rl stack with a 7B its fit accepts, the rl-8b stack.
STACKS = (("rl", None), ("rl", "Qwen/Qwen2.5-7B-Instruct"), ("rl-8b", None))


def build_model(shape: dict[str, Any]) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32000,
        num_attention_heads=max(shape["hidden_size"] // 64, 1),
        num_key_value_heads=max(shape["hidden_size"] // 128, 1),
        tie_word_embeddings=False,
        **shape,
    )
    return LlamaForCausalLM(config).eval()


class WorkerStandIn:
    """One engine's tensor-parallel worker: reads a version as a vLLM worker would."""

    def __init__(self, rank: int, tp: int) -> None:
        self.rank, self.tp = rank, tp

    def warm(self, fp32_folder: str, staged_folder: str) -> bool:
        """Both reads once on a tiny version, untimed: the imports (torch, safetensors) and
        the first memory maps happen here, not under the clock."""
        self.read_whole(fp32_folder)
        self.copy_slice(staged_folder)
        return True

    def read_whole(self, folder: str) -> tuple[int, float]:
        """Before: every tensor of the folder copied out whole (what a worker loading its
        parameters did with each; safetensors' get_tensor alone maps the file, reading
        nothing)."""
        from safetensors import safe_open

        started = time.perf_counter()
        read = 0
        for path in sorted(Path(folder).glob("*.safetensors")):
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for key in handle.keys():  # noqa: SIM118
                    read += handle.get_tensor(key).clone().nbytes
        return read, time.perf_counter() - started

    def copy_slice(self, folder: str) -> tuple[int, float]:
        """Now: the memory-mapped files streamed, this rank's dim-0 slice copied out."""
        from workloads.rl.sync import stream_safetensors

        started = time.perf_counter()
        copied = 0
        for _, tensor in stream_safetensors(folder):
            rows = tensor.shape[0] if tensor.ndim else 1
            share = max(rows // self.tp, 1)
            piece = (
                tensor.narrow(0, min(self.rank * share, rows - share), share)
                if tensor.ndim
                else tensor
            )
            copied += piece.clone().nbytes
        return copied, time.perf_counter() - started


@dataclass
class Actors:
    """The run's actors, started once and warmed: the engines' workers and the host's
    receiver, and the policy store the learner publishes into."""

    store: Any
    receiver: Any
    workers: list[Any]  # engine-major: engine e's ranks are workers[e * TP:(e + 1) * TP]

    def engines(self) -> list[list[Any]]:
        return [self.workers[e * TENSOR_PARALLEL : (e + 1) * TENSOR_PARALLEL]
                for e in range(ENGINES)]  # fmt: skip


def start_actors(scratch: Path) -> tuple[Actors, float]:
    """Every actor up and warmed on a tiny model (publish, stage, both reads), before any
    timing; returns them and the seconds the warm-up took (what the old runs timed)."""
    import ray

    from workloads.rl.sync import HostReceiver, PolicyStore

    store = ray.remote(PolicyStore).options(num_cpus=0).remote(1, 16)
    receiver: Any = ray.remote(HostReceiver).options(num_cpus=0)
    receiver = receiver.remote(f"park-rl-bench-{scratch.name}")
    stand_in: Any = ray.remote(WorkerStandIn).options(num_cpus=0)
    ranks = [r for _ in range(ENGINES) for r in range(TENSOR_PARALLEL)]
    actors = Actors(store, receiver, [stand_in.remote(r, TENSOR_PARALLEL) for r in ranks])
    started = time.perf_counter()
    tiny = build_model({"hidden_size": 64, "num_hidden_layers": 1, "intermediate_size": 128})
    _write_fp32(tiny, scratch / "warm")
    published = _publish(tiny, store, 1)
    staged: Any = ray.get(receiver.stage.remote(published.policy))
    ray.get([w.warm.remote(str(scratch / "warm"), staged.path) for w in actors.workers])
    return actors, time.perf_counter() - started


def before(model: Any, actors: Actors, scratch: Path) -> dict[str, Any]:
    """The fp32 folder, read whole by every worker of every engine, engines in series."""
    import ray

    folder = scratch / "fp32"
    started = time.perf_counter()
    _write_fp32(model, folder)
    write_s = time.perf_counter() - started
    written = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    started = time.perf_counter()
    read = 0
    for engine in actors.engines():  # one engine after another
        for got, _ in ray.get([w.read_whole.remote(str(folder)) for w in engine]):
            read += got
    read_s = time.perf_counter() - started
    shutil.rmtree(folder)
    return {
        "written_bytes": written,
        "read_bytes": read,
        "bytes_per_step": written + read,
        "write_s": round(write_s, 3),
        "read_s": round(read_s, 3),
        "seconds": round(write_s + read_s, 3),
    }


def _write_fp32(model: Any, folder: Path) -> None:
    """The weight file the exporter wrote (its config and tokenizer files left out here)."""
    import torch
    from safetensors.torch import save_file

    from workloads.train.models import hf

    folder.mkdir(parents=True, exist_ok=True)
    tied = hf.tied_export_keys(model)
    state = model.state_dict()
    tensors = {
        k: v.detach().to(torch.float32).contiguous() for k, v in state.items() if k not in tied
    }
    save_file(tensors, folder / "model.safetensors")


def _publish(model: Any, store: Any, version: int) -> Any:
    """The job's own publish_buckets, the model as a one-rank learner at ``version``."""
    from workloads.rl.learner import publish_buckets

    learner = SimpleNamespace(model=SimpleNamespace(inner=model), version=version)
    return publish_buckets(learner, store)


def now(model: Any, actors: Actors, version: int) -> dict[str, Any]:
    """bf16 buckets through Ray's object store, one receiver per host, engines at once; each
    phase timed."""
    import ray

    started = time.perf_counter()
    published = _publish(model, actors.store, version)
    publish_s = time.perf_counter() - started
    staging = time.perf_counter()
    staged: Any = ray.get(actors.receiver.stage.remote(published.policy))
    stage_call_s = time.perf_counter() - staging
    loading = time.perf_counter()
    copies = ray.get([w.copy_slice.remote(staged.path) for w in actors.workers])  # all at once
    load_s = time.perf_counter() - loading
    sync_s = time.perf_counter() - staging  # what the runs before the warm-up timed as sync_s
    total_s = time.perf_counter() - started
    return {
        "published_bytes": published.nbytes,
        "pulled_bytes_per_host": staged.nbytes,
        "hosts": 1,
        "bytes_per_step": staged.nbytes,
        "buckets": len(published.policy.buckets),
        "slice_bytes_copied_per_worker": [c for c, _ in copies],
        "publish_s": round(publish_s, 4),
        "pull_s": round(staged.pull_s, 4),
        "write_s": round(staged.write_s, 4),
        "stage_s": round(staged.seconds, 4),
        "stage_call_s": round(stage_call_s, 4),
        "load_s": round(load_s, 4),
        "load_worker_max_s": round(max(s for _, s in copies), 4),
        "sync_s": round(sync_s, 4),
        "total_s": round(total_s, 4),
    }


def _rates(new: dict[str, Any]) -> dict[str, float]:
    """Bytes per second of the phases infra/resolve/rl.py takes from this run."""
    nbytes = new["published_bytes"]
    return {
        "publish_bytes_per_s": round(nbytes / max(new["publish_s"], 1e-9)),
        "write_bytes_per_s": round(nbytes / max(new["write_s"], 1e-9)),
    }


def v6e_estimates() -> list[dict[str, Any]]:
    """The stacks' layouts on v6e: bytes per step both ways, and the estimate's seconds phase
    by phase with the rates' sources (infra/resolve/rl.py)."""
    import copy

    from infra.resolve.rl import SYNC_RATES, sync_phases
    from infra.schema.read import read_stack_file
    from infra.stack import from_values

    rows = []
    for stack, model in STACKS:
        values, _ = read_stack_file(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
        values = copy.deepcopy(values)
        if model:
            values["park:rl"]["model"] = model
        plan = from_values(values, stack).rl
        assert plan is not None and plan.sync is not None and plan.fit is not None and plan.fit.fits
        sync = plan.sync
        phases = sync_phases(sync.params, sync.learner_hosts, sync.rollout_hosts)
        rows.append(
            {
                "stack": stack,
                "model": plan.spec.model,
                "params": sync.params,
                "learner_hosts": sync.learner_hosts,
                "rollout_hosts": sync.rollout_hosts,
                "engines": sync.engines,
                "tensor_parallel": sync.tensor_parallel,
                "now_bytes_per_step": sync.bytes_per_step,
                "before_bytes_per_step": sync.legacy_bytes_per_step,
                "before_written": sync.legacy_written,
                "before_read": sync.legacy_read,
                "reduction": round(sync.legacy_bytes_per_step / sync.bytes_per_step, 1),
                "now_seconds_v6e_estimate": None
                if sync.seconds is None
                else round(sync.seconds, 1),
                "phases_s": {
                    "publish": round(phases.publish_s, 2),
                    "pull": round(phases.pull_s, 2),
                    "write": round(phases.write_s, 2),
                    "stage (pull and write overlapped, then the last write)": round(
                        phases.stage_s, 2
                    ),
                    "reload": round(phases.reload_s, 2),
                    "total": round(phases.total_s, 2),
                },
                "rollout_host_memory_bytes": sync.host_memory_bytes,
                "rates": SYNC_RATES,
            }
        )
    return rows


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run's counts, each time field as the median over the runs (and its range)."""
    out = dict(runs[0])
    for key, value in runs[0].items():
        if key.endswith("_s") or key == "seconds":
            values = sorted(run[key] for run in runs)
            out[key] = values[len(values) // 2]
            out[f"{key}_range"] = [values[0], values[-1]]
        elif isinstance(value, int) and any(run[key] != value for run in runs):
            raise AssertionError(f"{key} differs between rounds: {[run[key] for run in runs]}")
    return out


def _size(
    name: str, model: Any, actors: Actors, scratch: Path, version: int, rounds: int
) -> dict[str, Any]:
    """One model size: ``rounds`` before/now pairs, alternating, medians reported."""
    params = sum(p.numel() for p in model.parameters())
    olds, news = [], []
    for round_ in range(rounds):
        olds.append(before(model, actors, scratch / name / f"r{round_}"))
        news.append(now(model, actors, version * 100 + round_))
    old, new = _median(olds), _median(news)
    # the counts the preview's estimate uses, against what moved here
    expect_before = params * 4 * (1 + ENGINES * TENSOR_PARALLEL)
    return {
        "model": name,
        "params": params,
        "engines": ENGINES,
        "tensor_parallel": TENSOR_PARALLEL,
        "before": old,
        "now": new,
        "now_rates": _rates(new),
        "reduction_bytes": round(old["bytes_per_step"] / new["bytes_per_step"], 2),
        "speedup_seconds": round(old["seconds"] / max(new["total_s"], 1e-9), 2),
        "formula_before_bytes": expect_before,
        "formula_now_bytes": params * 2,
        "formulas_hold_within_headers": (
            abs(old["bytes_per_step"] - expect_before) < 0.001 * expect_before
            and abs(new["bytes_per_step"] - params * 2) < 0.001 * params * 2
        ),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    parser.add_argument("--rounds", type=int, default=3, help="before/now pairs per size")
    args = parser.parse_args(argv)

    import ray
    import torch

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    scratch = Path(tempfile.mkdtemp(prefix="park-rl-sync-"))
    results = []
    try:
        actors, warm_s = start_actors(scratch)
        for version, (name, shape) in enumerate(SIZES.items(), start=1):
            model = build_model(shape)
            results.append(_size(name, model, actors, scratch, version, args.rounds))
            del model
            shutil.rmtree(scratch / name, ignore_errors=True)
        ray.get(actors.receiver.close.remote())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        ray.shutdown()
    smallest = results[0]["now"]
    report: dict[str, Any] = {
        "benchmark": "rl_sync",
        "machine": {
            "cpus": torch.get_num_threads(),
            "python": platform.python_version(),
            "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        },
        "warm_up_s": round(warm_s, 2),
        "floor": {  # llama-20m: the 2026-12-02 run (no warm-up) timed 3.573 s of sync_s
            "before_warm_up_sync_s": 3.573,
            "sync_s": smallest["sync_s"],
            "total_s": smallest["total_s"],
            "gone": smallest["sync_s"] < 1.0,
        },
        "cpu": results,
        "v6e": v6e_estimates(),
    }
    seven = next(r for r in report["v6e"] if "7B" in r["model"])
    report["goal"] = {
        "7b_reduction_at_least": 4,
        "7b_reduction": seven["reduction"],
        "met": seven["reduction"] >= 4,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
