"""Where a request's CPU goes, per process and per code path: py-spy on every process a request
meets, beside exact per-thread CPU from /proc.

A profiled pass is a pass of its own (py-spy's sampling costs CPU): ``py-spy record
--nonblocking`` (the target is never paused; ptrace reads its memory) on each process of the
request path and the engine. Each sample's stack is put in the first category whose pattern
matches a frame, leaf first; a group's exact CPU per request (psutil, over the same pass) is
split in the categories' shares of its Python samples. What py-spy cannot see (threads running
no Python: Ray's C++ core worker, gRPC, uvloop's I/O) is the group's CPU minus its Python
samples' time, and the thread table names it.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from benchmarks.serve import cpu

PY_SPY = Path(sys.executable).with_name("py-spy")
RATE_HZ = 100
# Groups profiled: the request path and the engine (Ray's control plane is accounted by CPU).
PROFILED = (
    "api_server",
    "llm_server_replica",
    "llm_router_replica",
    "ingress_replica",
    "serve_proxy",
    "engine_core",
    "engine_worker",
)
# (category, substrings of a frame "function (file:line)"); leaf first, first match wins.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # A Ray worker's main thread in C++ (core worker: gRPC, task events, metrics export).
    ("ray_core_worker_main_loop", ("Worker.main_loop (ray/_private/worker.py",)),
    ("logging", ("logging/__init__.py", "logging_utils.py", "access_log")),
    (
        "metrics",
        (
            "prometheus_client",
            "ray/util/metrics.py",
            "metrics_utils.py",
            "/metrics/",
            "opentelemetry",
            "metrics_manager",
            "_report_cached_metrics",
            "loggers.py",
        ),
    ),
    ("detokenize", ("detokenizer.py", "tokenizers/", "transformers/tokenization")),
    ("tokenize_render", ("renderer", "preprocess", "input_processor", "tokenizer")),
    ("engine_client_ipc", ("zmq", "msgspec", "core_client.py", "serial_utils.py")),
    ("output_processing", ("output_processor.py", "async_llm.py")),
    ("openai_serving", ("vllm/entrypoints/",)),
    ("http_server", ("uvicorn", "h11", "httptools", "starlette", "fastapi", "aiohttp")),
    ("ray_llm", ("ray/llm/",)),
    ("serve_replica_router", ("ray/serve/",)),
    ("ray_core", ("ray/_private", "ray/_raylet", "ray/actor.py", "ray/remote_function")),
    ("engine_shm_queue", ("shm_broadcast.py", "shm_object_storage")),
    ("engine_scheduler", ("vllm/v1/core/",)),
    ("model_forward", ("vllm/model_executor", "torch/", "vllm/v1/worker", "vllm/v1/attention")),
    ("engine_core_loop", ("vllm/v1/engine/core.py", "vllm/v1/executor")),
    ("asyncio_loop", ("asyncio/", "uvloop", "selectors.py")),
    # Leaf in threading: C code under a thread's run() (uvloop's loop, zmq, socket writes).
    ("native_under_thread_run", ("threading.py", "concurrent/futures")),
)


def category(stack: str) -> str:
    frames = stack.split(";")
    for frame in reversed(frames):  # leaf first
        for name, needles in CATEGORIES:
            if any(n in frame for n in needles):
                return name
    return "other"


def parse_raw(text: str) -> Counter[str]:
    """py-spy's ``--format raw`` (collapsed stacks: ``frame;frame;... count``) by category."""
    out: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out[category(stack)] += int(count)
    return out


def thread_names(pid: int) -> dict[int, str]:
    """Python thread names by native id (``py-spy dump``): /proc's comm is the process title
    for every Python thread of a Ray worker."""
    try:
        text = subprocess.run(
            [str(PY_SPY), "dump", "--nonblocking", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = re.findall(r'^Thread (\d+) \(\w+\): "([^"]*)"', text, flags=re.M)
    return {int(tid): name for tid, name in found}


def thread_cpu(sid: int) -> dict[tuple[str, str], float]:
    """(group, thread) -> CPU seconds, for the profiled groups of a session; a thread is named
    by its Python name where it has one, else by /proc's comm."""
    out: dict[tuple[str, str], float] = {}
    for p in cpu.session(sid):
        group = cpu.group_of(p)
        if group not in PROFILED:
            continue
        names = _NAMES.setdefault(p.pid, thread_names(p.pid))
        for t in _threads(p):
            key = (group, names.get(t.id) or _comm(p.pid, t.id))
            out[key] = out.get(key, 0.0) + t.user_time + t.system_time
    return out


_NAMES: dict[int, dict[int, str]] = {}


def _threads(p: psutil.Process) -> list[Any]:
    with contextlib.suppress(psutil.Error):
        return list(p.threads())
    return []


def _comm(pid: int, tid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    return "?"


@contextmanager
def recording(sid: int, out: Path) -> Iterator[Callable[[], dict[str, Counter[str]]]]:
    """py-spy on each profiled process of ``sid`` for the body's duration; yields a function
    returning the samples per group and category once the body is done."""
    out.mkdir(parents=True, exist_ok=True)
    procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    for p in cpu.session(sid):
        group = cpu.group_of(p)
        if group in PROFILED:
            path = out / f"{group}.{p.pid}.txt"
            cmd = [str(PY_SPY), "record", "--nonblocking", "-r", str(RATE_HZ), "--format", "raw"]
            with (out / f"{group}.{p.pid}.log").open("wb") as log:
                spy = subprocess.Popen(
                    [*cmd, "-o", str(path), "-p", str(p.pid)], stdout=log, stderr=log
                )
            procs.append((group, spy, path))
    samples: dict[str, Counter[str]] = {}

    def result() -> dict[str, Counter[str]]:
        return samples

    try:
        yield result
    finally:
        for _, spy, _ in procs:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        for group, spy, path in procs:
            try:
                spy.wait(60)
            except subprocess.TimeoutExpired:
                spy.kill()
            if path.exists():
                samples.setdefault(group, Counter()).update(parse_raw(path.read_text()))


def budget(
    samples: dict[str, Counter[str]],
    threads: dict[tuple[str, str], float],
    requests: int,
    output_len: int,
) -> dict[str, Any]:
    """Per group: exact CPU ms per request (its threads' CPU over the recording, which also
    spans the warm-ups: ``requests`` counts them), split by category (py-spy shares of the
    Python part), the part py-spy cannot see, the busiest threads; and per output token."""
    groups: dict[str, Any] = {}
    totals: dict[str, float] = {}
    for (group, _), s in threads.items():
        totals[group] = totals.get(group, 0.0) + 1000 * s / max(requests, 1)
    for group, total in sorted(totals.items(), key=lambda kv: -kv[1]):
        total_ms = round(total, 2)
        counts = samples.get(group, Counter())
        python_ms = min(total_ms, 1000 * sum(counts.values()) / RATE_HZ / max(requests, 1))
        n = sum(counts.values()) or 1
        split = {c: round(python_ms * k / n, 2) for c, k in counts.most_common()}
        split["not_python (C++/native threads)"] = round(total_ms - python_ms, 2)
        top = sorted(
            ((k[1], v) for k, v in threads.items() if k[0] == group), key=lambda kv: -kv[1]
        )
        groups[group] = {
            "cpu_ms_per_request": total_ms,
            "cpu_ms_per_token": round(total_ms / output_len, 3),
            "by_category_ms_per_request": split,
            "samples": sum(counts.values()),
            "threads_cpu_ms_per_request": {
                name: round(1000 * s / max(requests, 1), 2) for name, s in top[:8] if s > 0
            },
        }
    return {"rate_hz": RATE_HZ, "requests_in_recording": requests, "groups": groups}
