"""What Ray Serve LLM costs over the bare vLLM engine, as a client of the endpoint sees it.

Every side's server is started once and stays resident; the load is ``vllm bench serve``
itself (``load.client_argv``, the same argv as benchmarks/README.md's plain command), run in
process. Trials interleave: each round runs one pass of every side, the order alternating
(ABBA...), while the bare server not measured is frozen (SIGSTOP) and Ray's idle cost is
reported (``idle_servers_cpu_s``). Each figure is reported as its median and min-max over the
rounds, and each ratio per round. The default run is the goal's cell: completions, 64/64
tokens, concurrency 8, 160 prompts, 8 warm-ups, 3 rounds. One JSON document on stdout.

    python benchmarks/serve_overhead.py                       # the goal's cell, ~10 min on 2 cores
    python benchmarks/serve_overhead.py --concurrency 1 8 --profile --replica-direct
    python benchmarks/serve_overhead.py --sides vllm,ray_serve_llm,ray_defaults
    python benchmarks/serve_overhead.py --gpu                 # H200 etc.: benchmarks/serve/gpu.py

``--profile`` adds one py-spy pass per side and cell (benchmarks/serve/profile.py) and writes the
per-request / per-token budget; ``--replica-direct`` adds the Ray replica's own port as a side
(past HAProxy and the LLMRouter call). Not a test: run it when the machine is quiet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from benchmarks.serve import cpu, load, profile, servers, stats  # noqa: E402
from infra.plan import serve_tuning  # noqa: E402
from workloads.serve import local  # noqa: E402
from workloads.serve.cpu_profile import to_cpu  # noqa: E402
from workloads.serve.tiny_model import build_tiny_model  # noqa: E402

DIRECT = "ray_replica_direct"


def log(msg: str) -> None:
    print(f"[serve-bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prompts_for(concurrency: int, prompts: int | None) -> int:
    """160 at concurrency 8 (the goal's cell); 20 per concurrent stream, 32..320, elsewhere."""
    return prompts or max(32, min(320, 20 * concurrency))


def order(sides: list[str], rounds: int) -> list[list[str]]:
    return [sides if r % 2 == 0 else list(reversed(sides)) for r in range(rounds)]


def parse(argv: list[str] | None) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        description=doc.splitlines()[0],
        epilog=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sides", default="vllm,ray_serve_llm", help="comma-separated")
    parser.add_argument("--replica-direct", action="store_true", help=f"add the {DIRECT} side")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[stats.GOAL_CONCURRENCY])
    parser.add_argument("--endpoints", nargs="+", default=[stats.GOAL_ENDPOINT])
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=None, help="default: prompts_for()")
    parser.add_argument("--warmups", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved trials per side")
    parser.add_argument("--profile", action="store_true", help="+1 py-spy pass per side/cell")
    parser.add_argument(
        "--plain-check", action="store_true", help="+1 plain `vllm_bench` process per side"
    )
    parser.add_argument("--pin", action="store_true", help="Ray's processes off the model core")
    parser.add_argument("--ray-env", action="append", default=[], metavar="K=V")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy server logs here")
    parser.add_argument("--gpu", action="store_true", help="CUDA vLLM: benchmarks/serve/gpu.py")
    parser.add_argument("--gpu-model", default="Qwen/Qwen3-8B", help="--gpu: catalogued shape")
    return parser.parse_args(argv)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM like Ctrl-C: the servers' context managers stop them


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupted)
    args = parse(argv)
    if args.gpu:
        from benchmarks.serve import gpu

        return gpu.main(args)
    model = str(build_tiny_model())
    known = servers.variants(dict(kv.split("=", 1) for kv in args.ray_env))
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    unknown = [s for s in sides if s not in known]
    if unknown:
        raise SystemExit(f"unknown sides {unknown}; known: {', '.join(known)}")
    shipped = known["ray_serve_llm"]
    assert shipped.config is not None
    served = local.served_models(shipped.config)[0]
    cpu_config, _ = to_cpu(shipped.config, model, direct_streaming=False)
    engine_kwargs = cpu_config["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]
    return run(args, model, served, engine_kwargs, known, sides)


def run(
    args: argparse.Namespace,
    model: str,
    served: str,
    engine_kwargs: dict[str, Any],
    known: dict[str, servers.Variant],
    sides: list[str],
) -> int:
    started, load_at_start = time.time(), [round(x, 2) for x in os.getloadavg()]
    up: dict[str, servers.Server] = {}
    info: dict[str, dict[str, Any]] = {}
    cells = [(e, c) for c in args.concurrency for e in args.endpoints]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    budgets: dict[str, dict[str, Any]] = {}
    plain: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        for side in sides:
            v = known[side]
            log(f"starting {side}")
            cm = (
                servers.bare_vllm(model, served, servers.engine_flags(engine_kwargs), work)
                if v.config is None
                else servers.ray_serve_llm(side, v.config, v.env, work, v.module)
            )
            up[side] = server = stack.enter_context(cm)
            log(f"{side} up in {server.startup_s:.0f}s at {server.base_url}")
            info[side] = {"startup_s": round(server.startup_s, 1), "base_url": server.base_url}
            if v.config is None:
                servers.freeze(server.sid)  # frozen until its own passes
        all_sides = list(sides)
        if args.replica_direct and "ray_serve_llm" in up:
            url = servers.replica_direct_url(up["ray_serve_llm"].sid)
            if url:
                up[DIRECT] = servers.Server(DIRECT, url, up["ray_serve_llm"].sid)
                all_sides.append(DIRECT)
        for side in sides:
            sid = up[side].sid
            servers.thaw(sid)
            info[side]["idle_cpu_s_per_s"] = cpu.idle_cost(sid, 10.0)
            info[side]["nice"] = cpu.niceness(sid)
            info[side]["rss_gib"] = round(
                sum(p.memory_info().rss for p in cpu.session(sid) if p.is_running()) / 2**30, 2
            )
            if args.pin and known[side].config is not None:
                info[side]["pinned"] = cpu.pin(sid)
            if known[side].config is None:
                servers.freeze(sid)
        bench = Bench(args, up, model, served, work)
        for r, round_sides in enumerate(order(all_sides, args.rounds)):
            for side in round_sides:
                for endpoint, c in cells:
                    t = measured(bench, side, endpoint, c)
                    results.setdefault(side, {}).setdefault(f"{endpoint}/c{c}", []).append(t)
                    log(
                        f"round {r} {side} {endpoint} c={c}: {t['output_tokens_per_s']} tok/s, "
                        f"TTFT {t['ttft_ms']['mean']} ms, TPOT {t['tpot_ms']['mean']} ms, other "
                        f"jobs {t['other_jobs_cpu_s']} CPU-s, load {t['load_average_1m']}"
                    )
        if args.plain_check:
            for side in all_sides:
                plain[side] = plain_check(bench, side, results)
        if args.profile:
            for side in all_sides:
                for endpoint, c in cells:
                    budgets[f"{side}/{endpoint}/c{c}"] = profiled(bench, side, endpoint, c)
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for f in work.rglob("*"):
                if f.is_file():
                    dest = args.keep_logs / f.relative_to(work)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(f.read_bytes())
    report = build_report(args, served, engine_kwargs, known, all_sides, cells, results, info)
    report.update(
        plain_client_check=plain,
        profiles=budgets,
        wall_s=round(time.time() - started, 1),
        machine=machine(load_at_start),
    )
    for side, verdict in report["goals"].items():
        log(verdict.get("verdict", f"{side}: goals not evaluated"))
    print(json.dumps(report, indent=2, default=_plain))
    return 0


@dataclass
class Bench:
    """What every pass needs: the options, the resident servers, the model."""

    args: argparse.Namespace
    up: dict[str, servers.Server]
    model: str
    served: str
    work: Path

    def argv(self, side: str, endpoint: str, c: int) -> list[str]:
        a = self.args
        return load.client_argv(
            self.up[side].base_url,
            self.model,
            self.served,
            endpoint=endpoint,
            concurrency=c,
            prompts=prompts_for(c, a.prompts),
            input_len=a.input_len,
            output_len=a.output_len,
            warmups=a.warmups,
            seed=a.seed,
        )

    def others(self, side: str) -> list[int]:
        """Sessions of the servers not measured in this pass."""
        return sorted({s.sid for s in self.up.values() if s.sid != self.up[side].sid})


@contextlib.contextmanager
def active(server: servers.Server) -> Iterator[servers.Server]:
    """The server thawed for its pass; the bare server frozen again after it."""
    servers.thaw(server.sid)
    try:
        yield server
    finally:
        if server.side == "vllm":
            servers.freeze(server.sid)


def measured(b: Bench, side: str, endpoint: str, c: int) -> dict[str, Any]:
    with active(b.up[side]) as server:
        return load.trial(server.sid, b.argv(side, endpoint, c), b.others(side))


def plain_check(
    b: Bench, side: str, results: dict[str, dict[str, list[dict[str, Any]]]]
) -> dict[str, Any]:
    """The goal's cell once more, by the plain client in a process of its own (benchmarks/
    README.md's command): inside the in-process trials' min-max, or not."""
    import subprocess

    name = f"plain-{side}.json"
    c, e = stats.GOAL_CONCURRENCY, stats.GOAL_ENDPOINT
    argv = b.argv(side, e, c)
    cmd = [sys.executable, "-m", "benchmarks.serve.vllm_bench", *argv, "--save-result"]
    cmd += ["--result-dir", str(b.work), "--result-filename", name]
    with active(b.up[side]):
        subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True)
    got = json.loads((b.work / name).read_text())
    trials = results.get(side, {}).get(f"{e}/c{c}", [])
    out: dict[str, Any] = {"command": ["python", "-m", "benchmarks.serve.vllm_bench", *argv]}
    for figure, key in (
        ("output_tokens_per_s", "output_throughput"),
        ("mean_ttft_ms", "mean_ttft_ms"),
    ):
        values = [stats.FIGURES[figure](t) for t in trials]
        value = round(float(got[key]), 2)
        out[figure] = {
            "plain": value,
            "trials_min_max": [min(values), max(values)] if values else None,
            "within": bool(values) and min(values) <= value <= max(values),
        }
    return out


def profiled(b: Bench, side: str, endpoint: str, c: int) -> dict[str, Any]:
    """One more pass under py-spy; the per-request and per-token budget of its processes."""
    with active(b.up[side]) as server:
        argv = b.argv(side, endpoint, c)
        threads = profile.thread_cpu(server.sid)
        folder = b.work / "profiles" / f"{side}-{endpoint}-c{c}"
        with profile.recording(server.sid, folder) as got:
            t = load.trial(server.sid, argv, b.others(side))
        after = profile.thread_cpu(server.sid)
        delta = {k: v - threads.get(k, 0.0) for k, v in after.items()}
        requests = t["completed"] + b.args.warmups + 1  # + vLLM's ready check
        out = profile.budget(got(), delta, requests, b.args.output_len)
        out["trial"] = {k: t[k] for k in ("output_tokens_per_s", "ttft_ms", "tpot_ms")}
        return out


def build_report(
    args: argparse.Namespace,
    served: str,
    engine_kwargs: dict[str, Any],
    known: dict[str, servers.Variant],
    sides: list[str],
    cells: list[tuple[str, int]],
    results: dict[str, dict[str, list[dict[str, Any]]]],
    info: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    table: dict[str, dict[str, Any]] = {}
    for endpoint, c in cells:
        key = f"{endpoint}/c{c}"
        row: dict[str, Any] = {
            s: stats.summary(results[s][key]) for s in sides if key in results.get(s, {})
        }
        bare = results.get("vllm", {}).get(key)
        if bare:
            others = [s for s in sides if s != "vllm" and key in results.get(s, {})]
            row["ratio"] = {s: stats.ratios(results[s][key], bare) for s in others}
            row["extra_cpu_ms_per_request"] = {
                s: stats.extra_cpu_per_request(row[s], row["vllm"]) for s in others
            }
        table[key] = row
    shipped = known["ray_serve_llm"]
    example = load.client_argv("http://127.0.0.1:PORT", "MODEL_DIR", served)
    return {
        "benchmark": "benchmarks/serve_overhead.py (benchmarks/serve/)",
        "client": "vllm bench serve (vllm.benchmarks.serve.main_async, in process)",
        "plain_client_argv": example,
        "model": "tiny-llama (local, random weights, 2 layers)",
        "served_model_name": served,
        "engine_kwargs": engine_kwargs,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "warmups": args.warmups,
        "prompts": {f"c{c}": prompts_for(c, args.prompts) for c in args.concurrency},
        "rounds": args.rounds,
        "order": order(sides, args.rounds),
        "sides": {
            s: {"note": known[s].note, "env": known[s].env} if s in known else {"note": DIRECT}
            for s in sides
        },
        "ray_side": {
            "llm_config_options": serve_tuning.llm_config_options(),
            "deployment_options": serve_tuning.deployment_options(),
            "app_args": serve_tuning.app_args(),
            "ray_env": shipped.env,
        },
        "servers": info,
        "cells": table,
        "goals": {s: stats.goals(table, s) for s in sides if s != "vllm"},
    }


def machine(load_at_start: list[float]) -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "load_average_at_start": load_at_start,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def _plain(value: Any) -> Any:
    """numpy scalars (vLLM's metrics) as Python numbers."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON: {value!r}")
