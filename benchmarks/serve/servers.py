"""The servers compared, each in a session of its own (so every process it starts is found
and stopped, Ray's re-parented daemons included), all resident for the whole run.

- ``vllm``: vLLM's own OpenAI server, ``python -m vllm.entrypoints.openai.api_server``;
- ``ray_serve_llm``: the dev stack's rendered ``serveConfigV2`` (``infra/plan/ray.py:
  serve_config``, with ``infra/plan/serve_tuning.py``'s keys), deployed by ``python -m
  workloads.serve.local --keep`` in a Ray whose processes get the pods' environment
  (``serve_tuning.ray_env()``), i.e. the RayService as shipped;
- ``ray_defaults``: the same deployment on Ray 2.60's defaults (no serve_tuning keys, no env),
  which is also what ``park local dev --only serve`` ran before it passed the pods' env on;
- ``ray_replica_direct``: no server of its own; the ``ray_serve_llm`` replica's own HTTP port,
  past HAProxy and the LLMRouter call: the client-side split of the Ray path.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import yaml

from benchmarks.serve import cpu
from infra.plan import serve_tuning
from workloads.protocol import ENDPOINT_MARKER, free_port
from workloads.serve import local

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "stacks" / "Pulumi.dev.yaml"


@dataclass
class Server:
    side: str
    base_url: str  # http://127.0.0.1:port (the client appends /v1/...)
    sid: int  # the server's session (= the pid it was started as)
    env: dict[str, str] = field(default_factory=dict)  # what was added to the environment
    startup_s: float = 0.0


@dataclass
class Variant:
    """One side: bare vLLM (``config`` None) or a Ray Serve LLM deployment."""

    name: str
    config: dict[str, Any] | None
    env: dict[str, str]
    note: str
    module: str = "workloads.serve.local"  # deploys ``config`` and prints the endpoint


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


def variants(extra_env: dict[str, str]) -> dict[str, Variant]:
    tuned, untuned = rendered_serve_config(tuned=True), rendered_serve_config(tuned=False)
    env = serve_tuning.ray_env(len(local.served_models(tuned)))
    return {
        "vllm": Variant("vllm", None, {}, "python -m vllm.entrypoints.openai.api_server"),
        "ray_serve_llm": Variant(
            "ray_serve_llm",
            tuned,
            {**env, **extra_env},
            "as shipped: serve_tuning's serveConfigV2 keys and the pods' env (ray_env)",
        ),
        "ray_defaults": Variant(
            "ray_defaults", untuned, {}, "Ray 2.60's defaults: no serve_tuning keys, no env"
        ),
        # The shipped deployment with Ray's workers (the LLM replica and vLLM's engine under it)
        # at nice 0, as the bare server runs, instead of Ray's 15 (measured, not shipped).
        "ray_nice0": Variant(
            "ray_nice0",
            tuned,
            {**env, **extra_env, "RAY_worker_niceness": "0"},
            "as shipped but Ray's workers (the LLM replica and vLLM's engine) at nice 0",
        ),
    }


def engine_flags(engine_kwargs: dict[str, Any]) -> list[str]:
    flags = []
    for key, value in engine_kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False:
            flags += [flag, str(value)]
    return flags


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (a clean shutdown), then SIGKILL whatever of the server's session is left."""
    thaw(proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)  # serve.shutdown() can take minutes; the session is killed next
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    time.sleep(2)
    for p in cpu.session(proc.pid):
        with contextlib.suppress(Exception):
            if p.pid != os.getpid():
                p.kill()


def freeze(sid: int) -> None:
    """SIGSTOP a resident server while another is measured (bare vLLM only: Ray's health
    checks would count a frozen cluster's processes dead)."""
    for p in cpu.session(sid):
        with contextlib.suppress(Exception):
            p.suspend()


def thaw(sid: int) -> None:
    for p in cpu.session(sid):
        with contextlib.suppress(Exception):
            p.resume()


def _normal_priority() -> None:
    """In the server's child before exec: nice 0, whatever the client runs at."""
    os.setpriority(os.PRIO_PROCESS, 0, 0)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _popen(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_normal_priority,
        )


@contextmanager
def bare_vllm(
    model: str, served: str, flags: list[str], work: Path, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """vLLM's own OpenAI server: ``flags`` are the engine's (e.g. ``engine_flags``)."""
    port = free_port()
    cmd = [
        *(sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model),
        *("--served-model-name", served, "--host", "127.0.0.1", "--port", str(port), *flags),
    ]
    log, started = work / "vllm.log", time.monotonic()
    proc = _popen(cmd, log, env or {})
    try:
        deadline = time.monotonic() + 900
        while not local.probe(f"http://127.0.0.1:{port}/v1", served):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vLLM server did not come up:\n{_tail(log)}")
            time.sleep(2)
        yield Server("vllm", f"http://127.0.0.1:{port}", proc.pid, {}, time.monotonic() - started)
    finally:
        stop(proc)


@contextmanager
def ray_serve_llm(
    side: str,
    serve_config: dict[str, Any],
    env: dict[str, str],
    work: Path,
    module: str = "workloads.serve.local",
) -> Iterator[Server]:
    """``python -m workloads.serve.local --keep`` (or ``module``) on the rendered config, with
    ``env`` in the environment of Ray's processes (what the RayService pods get)."""
    config = work / f"{side}.serveConfigV2.yaml"
    config.write_text(yaml.safe_dump(serve_config))
    env = {**own_ports_env(), **env}
    log, started = work / f"{side}.log", time.monotonic()
    cmd = [sys.executable, "-m", module, "--serve-config", str(config), "--keep"]
    proc = _popen(cmd, log, env)
    try:
        deadline, endpoint = time.monotonic() + 900, None
        while endpoint is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray Serve LLM did not come up:\n{_tail(log)}")
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith(ENDPOINT_MARKER):
                    endpoint = line[len(ENDPOINT_MARKER) :].strip()
            time.sleep(1)
        base = endpoint.removesuffix("/v1")
        yield Server(side, base, proc.pid, env, time.monotonic() - started)
    finally:
        stop(proc)


def own_ports_env() -> dict[str, str]:
    """Free ports for what Serve binds at fixed ports (S/constants.py: the fallback proxy's
    8500/9500, HAProxy's metrics 9101 and stats 8404), so that several Ray sides can be
    resident on one machine. Local to the benchmark; the pods keep Ray's ports."""
    names = (
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT",
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT",
        "RAY_SERVE_HAPROXY_METRICS_PORT",
        "RAY_SERVE_HAPROXY_STATS_PORT",
    )
    return {name: str(free_port()) for name in names}


def replica_direct_url(sid: int) -> str | None:
    """The LLM server replica's own HTTP address, read from the HAProxy config of the Ray side
    (its ``server SERVE_REPLICA_...LLMServer...`` line); None without HAProxy."""
    for p in cpu.session(sid):
        with contextlib.suppress(Exception):
            args = p.cmdline()
            if "haproxy" in os.path.basename(args[0]) and "-f" in args:
                text = Path(args[args.index("-f") + 1]).read_text()
                found = re.search(r"server SERVE_REPLICA_\S*LLMServer\S* (\S+:\d+)", text)
                if found:
                    return f"http://{found.group(1)}"
    return None
