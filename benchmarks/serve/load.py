"""The load: ``vllm bench serve`` itself, run in process from the same argv a plain client uses.

``client_argv`` is the one definition of the run (benchmarks/README.md prints it as a shell
command for ``python -m benchmarks.serve.vllm_bench``); ``trial`` parses it with vLLM's own
parser and awaits vLLM's own ``main_async``, so the benchmark's client and a plain client differ
in nothing but the process they run in. Server CPU is counted from vLLM's "Starting main
benchmark run..." line (after its warm-ups) to the end of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import time
from collections.abc import Callable
from typing import Any

from benchmarks.serve import cpu

ENDPOINTS = {  # name -> (vllm bench serve --backend, --endpoint)
    "completions": ("openai", "/v1/completions"),
    "chat": ("openai-chat", "/v1/chat/completions"),
}
MAIN_RUN_MARKER = "Starting main benchmark run..."  # vllm/benchmarks/serve.py prints it


def client_argv(
    base_url: str,
    model: str,
    served: str,
    *,
    endpoint: str = "completions",
    concurrency: int = 8,
    prompts: int = 640,
    input_len: int = 64,
    output_len: int = 64,
    warmups: int = 8,
    seed: int = 0,
    request_rate: float | None = None,
) -> list[str]:
    """``vllm bench serve`` arguments for one pass: random prompts, ``ignore_eos``, greedy.
    ``request_rate``: an open loop at that many requests/s (Poisson arrivals drawn from
    ``seed``: the same schedule for every side), ``concurrency`` then only a ceiling."""
    backend, path = ENDPOINTS[endpoint]
    rate = ["--request-rate", f"{request_rate:g}"] if request_rate else []
    return [
        *("--backend", backend, "--endpoint", path, "--base-url", base_url),
        *("--model", model, "--served-model-name", served),
        *("--dataset-name", "random", "--random-input-len", str(input_len)),
        *("--random-output-len", str(output_len), "--ignore-eos", "--seed", str(seed)),
        *("--num-prompts", str(prompts), "--max-concurrency", str(concurrency)),
        *("--num-warmups", str(warmups), "--temperature", "0", *rate),
        *("--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99"),
        *("--ready-check-timeout-sec", "120", "--disable-tqdm"),
    ]


class _Marker(io.StringIO):
    """Captures vLLM's stdout and calls ``at_main`` when its main run starts."""

    def __init__(self, at_main: Callable[[], None]) -> None:
        super().__init__()
        self._at_main, self._seen = at_main, False

    def write(self, text: str) -> int:
        if not self._seen and MAIN_RUN_MARKER in text:
            self._seen = True
            self._at_main()
        return super().write(text)


def run_bench(argv: list[str], at_main: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """vLLM's own ``bench serve`` main on ``argv``; its result dict."""
    from vllm.benchmarks.serve import add_cli_args, main_async
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(argv)
    with contextlib.redirect_stdout(_Marker(at_main)):
        return asyncio.run(main_async(args))


def _ms(result: dict[str, Any], metric: str) -> dict[str, float]:
    return {
        "mean": round(result[f"mean_{metric}_ms"], 2),
        "p50": round(result[f"median_{metric}_ms"], 2),
        "p90": round(result.get(f"p90_{metric}_ms", float("nan")), 2),
        "p99": round(result[f"p99_{metric}_ms"], 2),
    }


def trial(sid: int, argv: list[str], alone: Callable[[str], None]) -> dict[str, Any]:
    """One pass of ``argv`` against the server of session ``sid``, with its CPU per request.

    ``alone(when)`` raises if a process of another side is alive; it is called when the main
    run starts and when it ends (what the rest of the machine used is reported)."""
    mark: dict[str, Any] = {}

    def at_main() -> None:
        alone("at the main run's start")
        mark.update(
            snap=cpu.cpu_snapshot(sid),
            machine=cpu.machine_cpu_s(),
            me=_self_cpu_s(),
            load=os.getloadavg()[0],
            t=time.monotonic(),
        )

    result = run_bench(argv, at_main)
    groups = cpu.cpu_delta(mark["snap"], cpu.cpu_snapshot(sid))
    machine, me = cpu.machine_cpu_s() - mark["machine"], _self_cpu_s() - mark["me"]
    wall = time.monotonic() - mark["t"]
    alone("at the main run's end")
    server_cpu = sum(groups.values())
    control_plane = sum(s for g, s in groups.items() if g in cpu.CONTROL_PLANE)
    completed, tokens = result["completed"], result["total_output_tokens"]
    per_request = {
        g: round(1000 * s / max(completed, 1), 1)
        for g, s in sorted(groups.items(), key=lambda kv: -kv[1])
        if s >= 0.005
    }
    return {
        "completed": completed,
        "failed": result["failed"],
        "duration_s": round(result["duration"], 2),
        "output_tokens": tokens,
        "output_tokens_per_s": round(result["output_throughput"], 1),
        "requests_per_s": round(result["request_throughput"], 3),
        "ttft_ms": _ms(result, "ttft"),
        "tpot_ms": _ms(result, "tpot"),
        "itl_ms": _ms(result, "itl"),
        "e2el_ms": _ms(result, "e2el"),
        "server_cpu_s_per_1k_tokens": round(1000 * server_cpu / max(tokens, 1), 3),
        "server_cpu_ms_per_request": per_request,
        # Per output token and in cores, per group: what a matched-rate comparison reads.
        "server_cpu_ms_per_output_token": {
            g: round(1000 * s / max(tokens, 1), 4) for g, s in groups.items() if s >= 0.005
        },
        "cores_by_group": {
            g: round(s / max(wall, 1e-9), 4) for g, s in groups.items() if s >= 0.005
        },
        "cpu_ms_per_request_by_role": cpu.by_role(per_request),
        # Ray's control plane runs per second, not per request: in cores over the pass.
        "control_plane_cpu_s_per_s": round(control_plane / max(wall, 1e-9), 3),
        "client_cpu_s": round(me, 2),
        # CPU that neither the server nor this client used: other jobs on the machine.
        "other_jobs_cpu_s": round(max(0.0, machine - server_cpu - me), 2),
        "load_average_1m": [round(mark["load"], 2), round(os.getloadavg()[0], 2)],
        "wall_s": round(wall, 1),
    }


def _self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system
