"""Where the CPU goes: process groups of a server's tree, CPU snapshots, the idle cost, pinning.

Ray names its worker processes after the actor (``ray::ServeReplica:<app>:<deployment>``), vLLM
its engine processes (``VLLM::EngineCore``, ``VLLM::Worker``); a group is a role a request meets.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import psutil

# (group, substrings of the command line / process title); first match wins.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine_worker", ("VLLM::Worker",)),  # the model's forward pass (vLLM binds it to a core)
    ("engine_core", ("EngineCore",)),  # vLLM's scheduler loop
    ("llm_server_replica", ("LLMServer",)),  # Serve replica hosting vLLM's frontend
    ("llm_router_replica", ("LLMRouter",)),  # HAProxy's Lua asks it where each POST goes
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
# Groups no request passes through.
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
ENGINE = ("engine_worker", "engine_core")
# Ray's own processes: all of the Ray side but vLLM's engine and the replica hosting its frontend.
RAY_OWN = (*CONTROL_PLANE, "serve_proxy", "haproxy", "llm_router_replica", "ingress_replica")


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


def session(sid: int) -> list[psutil.Process]:
    """Every process of a session (the server started with start_new_session): Ray's daemons
    are re-parented away from the tree but stay in the session."""
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if os.getsid(p.pid) == sid:
                out.append(p)
    return out


Snapshot = dict[tuple[int, float], tuple[str, float]]


def cpu_snapshot(sid: int) -> Snapshot:
    """(pid, create time) -> (group, user+system CPU seconds) for a server's session."""
    out = {}
    for p in session(sid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            t = p.cpu_times()
            out[(p.pid, p.create_time())] = (group_of(p), t.user + t.system)
    return out


def cpu_delta(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """CPU seconds per group between two snapshots (new processes count from zero)."""
    groups: dict[str, float] = {}
    for key, (group, cpu) in after.items():
        groups[group] = groups.get(group, 0.0) + cpu - before.get(key, (group, 0.0))[1]
    return groups


def machine_cpu_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + t.softirq


def by_role(cpu_ms: dict[str, float]) -> dict[str, float]:
    """CPU ms per request: the engine (vLLM's worker + scheduler), the request path (everything a
    request crosses before the engine), Ray's control plane (no request crosses it)."""
    engine = sum(v for k, v in cpu_ms.items() if k in ENGINE)
    control = sum(v for k, v in cpu_ms.items() if k in CONTROL_PLANE)
    return {
        "engine": round(engine, 1),
        "request_path": round(sum(cpu_ms.values()) - engine - control, 1),
        "control_plane": round(control, 1),
    }


def idle_cost(sid: int, seconds: float) -> dict[str, float]:
    """CPU per second that each process group burns while no request is in flight."""
    before = cpu_snapshot(sid)
    time.sleep(seconds)
    groups = cpu_delta(before, cpu_snapshot(sid))
    return {
        g: round(s / seconds, 4)
        for g, s in sorted(groups.items(), key=lambda kv: -kv[1])
        if s >= 0.001
    }


def niceness(sid: int) -> dict[str, int]:
    """Each group's nice value (Ray starts its workers, and so vLLM's engine under Serve, at 15)."""
    out: dict[str, int] = {}
    for p in session(sid):
        with contextlib.suppress(psutil.Error):
            out.setdefault(group_of(p), p.nice())
    return dict(sorted(out.items()))


def _affinity(proc: psutil.Process) -> set[int]:
    cores: set[int] = set()
    for thread in proc.threads():
        with contextlib.suppress(OSError):
            cores |= os.sched_getaffinity(thread.id)
    return cores


def pin(sid: int) -> dict[str, Any]:
    """Pin Ray's own processes (``RAY_OWN``) off the core vLLM bound its model worker to: what
    the Ray side gains from it is what their competing for the model's core cost (diagnosis)."""
    procs = session(sid)
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
