"""A private local Ray head for `park local`: `ray start --head --block` on free ports, in its
own temp dir, with a token of its own; stopped by its process id (others may run Ray here)."""

from __future__ import annotations

import os
import random
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.plan.kubelet import as_run
from infra.tools.outdir import open_new, write_new
from workloads import protocol
from workloads.protocol import free_port

# The local Ray: what the RayJob's cluster would have had as TPU hosts, CPU here.
RAY_NUM_CPUS = max(4, os.cpu_count() or 1)  # logical CPUs: 2 train workers, or LLM server (2)
# Logical CPUs each served model's LLM server asks for on CPU (its replica and its engine's
# bundle): every model is served beside the training job, whatever the machine's cores.
CPUS_PER_SERVED_MODEL = 2
TRAIN_CPUS = 2  # the CPU profile's two Ray Train workers


def logical_cpus(served_models: int) -> int:
    """The local head's logical CPUs: the training workers and every served model's server
    at once (they start together, as on GKE), and at least the machine's cores."""
    return max(RAY_NUM_CPUS, TRAIN_CPUS + CPUS_PER_SERVED_MODEL * served_models)


RAY_OBJECT_STORE_BYTES = 400 * 1024**2


# Ray settings of the local head (the caller's environment wins), each read in Ray 2.60.
LOCAL_RAY_ENV = {
    # On a busy 2-core machine the dashboard agent can take over a minute to come up; the
    # raylet would give up on it and crash the node.
    "RAY_agent_register_timeout_ms": "600000",
    "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "600",
    # Stopped at the end of a run, its apps deleted and its jobs ended, the head has no
    # traffic to drain: Ray would wait 30 s on SIGTERM (_private/ray_constants.py; 0: none),
    # and a direct-ingress replica being deleted drains 30 s (serve/_private/constants.py).
    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
    # Ray Train's controller polls its workers every 2 s (train/v2/_internal/constants.py), so
    # it notices a started, finished or failed worker group up to 2 s late at each step of a
    # run (measured: ~6 s of a 2-worker fit's overhead). On one local node a poll is a local
    # call; a poll that misses this timeout is only counted after 10 minutes of them.
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25",
}


# Ports Serve's HAProxy binds on every interface, fixed by default (9101, 8404: Ray 2.60
# serve/_private/constants.py): a second local run on the machine could not start its proxy.
# Each run gets free ones of its own.
PRIVATE_PORT_ENV = ("RAY_SERVE_HAPROXY_METRICS_PORT", "RAY_SERVE_HAPROXY_STATS_PORT")


class LocalRunError(RuntimeError):
    """The local run failed; the message says at which step and where the logs are."""


@dataclass
class LocalRay:
    """A private Ray head: `ray start --head --block` on free ports, stopped by its pid."""

    temp_dir: Path
    log_path: Path
    gcs_port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    # Ray's settings the RayService's pods carry (serve_tuning.ray_env: throughput mode, HAProxy,
    # direct streaming...): Serve reads them at import in every Ray process.
    env: dict[str, str] = field(default_factory=dict)
    num_cpus: int = RAY_NUM_CPUS  # logical: what Ray schedules by, not the cores

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def command(self) -> list[str]:
        base = random.randrange(20000, 31000, 500)  # workers: a window others are unlikely to use
        ports = {
            "--port": self.gcs_port,
            "--dashboard-port": self.dashboard_port,
            "--ray-client-server-port": free_port(),
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
            "--metrics-export-port": free_port(),
            "--min-worker-port": base,
            "--max-worker-port": base + 499,
        }
        ray = Path(sys.executable).with_name("ray")
        return [
            str(ray) if ray.exists() else "ray",
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            f"--num-cpus={self.num_cpus}",
            f"--object-store-memory={RAY_OBJECT_STORE_BYTES}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            *[f"{flag}={port}" for flag, port in ports.items()],
        ]

    def start(self, timeout_s: float = 300) -> None:
        env = {**os.environ, **self.env, **ray_auth_env()}
        # The entrypoint says `python`: make it this interpreter (the one with workloads).
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        for name, value in LOCAL_RAY_ENV.items():
            env.setdefault(name, value)
        for name in PRIVATE_PORT_ENV:
            env[name] = str(free_port())
        env["PYTHONUNBUFFERED"] = "1"
        with open_new(self.log_path, "wb") as log:
            # Own session: a Ctrl-C in the terminal reaches park, which stops Ray in order.
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.temp_dir,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LocalRunError(
                    f"ray start exited with {self.process.returncode}; see {self.log_path}"
                )
            try:
                with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=5):
                    return
            except urllib.error.HTTPError:
                return  # it answers (e.g. 401 before a token is shown): it is up
            except (OSError, ValueError):
                pass
            time.sleep(1)
        raise LocalRunError(
            f"Ray's dashboard did not answer in {timeout_s:.0f}s; see {self.log_path}"
        )

    def stop(self) -> None:
        """SIGTERM our `ray start --block`, which stops the processes it started; then any of
        ours left (found by our temp dir in their command line), by pid."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        for pid in _pids_mentioning(str(self.temp_dir)):
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)


def pods_ray_env(manifest: dict[str, Any] | None) -> dict[str, str]:
    """The ``RAY_*`` variables with literal values in the head container of a rendered RayService
    (or RayJob): what the plan gives Ray's processes in the pods, for the local Ray to carry."""
    spec = (manifest or {}).get("spec") or {}
    cluster = spec.get("rayClusterConfig") or spec.get("rayClusterSpec") or {}
    pod = ((cluster.get("headGroupSpec") or {}).get("template") or {}).get("spec") or {}
    containers = pod.get("containers") or [{}]
    return {
        e["name"]: as_run(str(e["value"]))  # as the kubelet passes it on
        for e in containers[0].get("env") or []
        if str(e.get("name", "")).startswith("RAY_") and "value" in e
    }


def ray_auth_env() -> dict[str, str]:
    """Token authentication with a token private to this run, for the head and every client.

    Ray 2.60 turns token auth on by itself when ~/.ray/auth_token exists, and then clients that
    do not find the token are refused. A token of our own, in the environment of the head, of
    this process (the Jobs API client) and of the serving subprocess, works either way.
    """
    global _TOKEN
    if _TOKEN is None:
        _TOKEN = secrets.token_hex(32)
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": _TOKEN}


_TOKEN: str | None = None


def _pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains `text` (our private temp dir), except us."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        with suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="ignore")
            if text in cmdline and int(entry.name) != os.getpid():
                pids.append(int(entry.name))
    return pids


def follow_job(
    client: Any,
    job_id: str,
    log_path: Path,
    *,
    timeout_s: float,
    label: str,
    on_record: Callable[[str, dict[str, Any]], None],
) -> Any:
    """Poll a Ray job until it ends and return its status. Every protocol line it prints
    (workloads/protocol.py: metrics, result) reaches `on_record` once, in order; its whole log
    is kept at `log_path`; it is stopped on a timeout or Ctrl-C."""
    from ray.job_submission import JobStatus

    started = time.monotonic()
    status, seen = None, 0
    try:
        while True:
            status = client.get_job_status(job_id)
            lines = client.get_job_logs(job_id).splitlines()
            for line in lines[seen:]:
                parsed = protocol.parse_line(line)
                if parsed:
                    on_record(*parsed)
            seen = len(lines)
            if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                return status
            if time.monotonic() - started > timeout_s:
                client.stop_job(job_id)
                raise LocalRunError(f"{label} did not finish in {timeout_s:.0f}s")
            time.sleep(1)  # the Jobs API has no push: poll once a second
    except KeyboardInterrupt:
        with suppress(Exception):
            client.stop_job(job_id)
        raise
    finally:
        with suppress(Exception):
            write_new(log_path, client.get_job_logs(job_id))


def log_tail(log_path: Path, lines: int = 30) -> str:
    """The end of a job's kept log, to show with its failure."""
    return "\n".join(log_path.read_text().splitlines()[-lines:]) if log_path.exists() else ""
