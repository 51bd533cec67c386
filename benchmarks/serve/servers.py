"""The servers compared. Each pass starts its side's server afresh and stops it before the next
pass starts (``passes.alone``), so nothing of one side runs while another is measured. Every
server runs in a session of its own and every process it starts carries ``TAG_ENV`` in its
environment: both find all of a server's processes (Ray's re-parented daemons included), to
stop them and to prove that none is left.

- ``vllm``: vLLM's own OpenAI server, ``python -m vllm.entrypoints.openai.api_server``;
- ``vllm_check``: the same bare server again, as a side of its own: the self-check (bare vs
  bare must come out within its spread of 1.0);
- ``ray_serve_llm``: the dev stack's rendered ``serveConfigV2`` (``infra/plan/ray.py:
  serve_config``, with ``infra/plan/serve_tuning.py``'s keys), deployed by ``python -m
  workloads.serve.local --keep`` in a Ray whose processes get the pods' environment
  (``serve_tuning.ray_env()``), i.e. the RayService as shipped;
- ``ray_defaults``: the same deployment on Ray 2.60's defaults (no serve_tuning keys, no env),
  which is also what ``park local dev --only serve`` ran before it passed the pods' env on;
- ``ray_nice0``: as shipped but Ray's workers at nice 0 (measured, not shipped);
- ``ray_replica_direct``: the ``ray_serve_llm`` deployment, measured at its LLM replica's own
  HTTP port, past HAProxy: the client-side split of the Ray path;
- ``ray_openai_app``: as shipped, but built by Ray's ``build_openai_app`` instead of our builder
  (workloads/serve/app.py): under direct streaming, Ray's LLMRouter deployment is called by
  HAProxy for every POST before it forwards (issue 39, "One hop fewer").

``--builder ray`` builds every as-shipped side (``ray_serve_llm``, ``ray_replica_direct``,
``ray_nice0``) with Ray's builder instead of ours; ``ray_defaults`` is Ray's builder always.
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

import psutil
import yaml

from benchmarks.serve import cpu
from infra.plan import serve_tuning
from workloads.protocol import ENDPOINT_MARKER, free_port
from workloads.serve import app, local

ROOT = Path(__file__).resolve().parents[2]
STACK = ROOT / "stacks" / "Pulumi.dev.yaml"
BARE, SELF_CHECK, SHIPPED, DIRECT = "vllm", "vllm_check", "ray_serve_llm", "ray_replica_direct"
RAYS_APP = "ray_openai_app"
# --builder: the import_path of the as-shipped Ray sides' app (the args are the same)
BUILDERS = {"park": app.IMPORT_PATH, "ray": app.RAYS_IMPORT_PATH}
# "<run>/<side>/<pass>" in the environment of every process a server starts (Ray passes its
# environment on to raylet, GCS, workers and HAProxy).
TAG_ENV = "PARK_SERVE_BENCH_TAG"
STOP_TIMEOUT_S = 120.0  # every process of a stopped server gone within this, or the run fails


@dataclass
class Server:
    side: str
    base_url: str  # http://127.0.0.1:port (the client appends /v1/...)
    sid: int  # the server's session (= the pid it was started as)
    env: dict[str, str] = field(default_factory=dict)  # what was added to the environment
    startup_s: float = 0.0
    tag: str = ""  # "<run>/<side>/<pass>" (TAG_ENV)
    settle: dict[str, Any] = field(default_factory=dict)  # passes.settle's record


@dataclass
class Variant:
    """One side: bare vLLM (``config`` None) or a Ray Serve LLM deployment."""

    name: str
    config: dict[str, Any] | None
    env: dict[str, str]
    note: str
    module: str = "workloads.serve.local"  # deploys ``config`` and prints the endpoint
    replica_direct: bool = False  # measured at the LLM replica's own port, past HAProxy


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


def built_by(serve_config: dict[str, Any], import_path: str) -> dict[str, Any]:
    """``serve_config`` with every app built by ``import_path`` (same args): ours or Ray's."""
    apps = [{**a, "import_path": import_path} for a in serve_config.get("applications") or []]
    return {**serve_config, "applications": apps}


def variants(extra_env: dict[str, str], builder: str = "park") -> dict[str, Variant]:
    rendered = rendered_serve_config(tuned=True)
    tuned = built_by(rendered, BUILDERS[builder])
    untuned = built_by(rendered_serve_config(tuned=False), app.RAYS_IMPORT_PATH)
    env = serve_tuning.ray_env(len(local.served_models(tuned)))
    shipped = Variant(
        SHIPPED,
        tuned,
        {**env, **extra_env},
        f"as shipped: serve_tuning's serveConfigV2 keys and the pods' env (ray_env), built by "
        f"{tuned['applications'][0]['import_path']}",
    )
    return {
        BARE: Variant(BARE, None, {}, "python -m vllm.entrypoints.openai.api_server"),
        SELF_CHECK: self_check_variant(),
        SHIPPED: shipped,
        DIRECT: Variant(
            DIRECT,
            tuned,
            shipped.env,
            "as shipped, measured at the LLM replica's own port (past HAProxy)",
            replica_direct=True,
        ),
        RAYS_APP: Variant(
            RAYS_APP,
            built_by(rendered, app.RAYS_IMPORT_PATH),
            shipped.env,
            "as shipped, but built by Ray's build_openai_app (its LLMRouter in front)",
        ),
        "ray_defaults": Variant(
            "ray_defaults",
            untuned,
            {},
            "Ray 2.60's defaults: build_openai_app, no serve_tuning keys, no env",
        ),
        # The shipped deployment with Ray's workers (the LLM replica and vLLM's engine under it)
        # at nice 0, as the bare server runs, instead of Ray's 15 (measured, not shipped).
        "ray_nice0": Variant(
            "ray_nice0",
            tuned,
            {**env, **extra_env, "RAY_worker_niceness": "0"},
            "as shipped but Ray's workers (the LLM replica and vLLM's engine) at nice 0",
        ),
        # Serve's replicas and routers export their cached metrics every 100 ms (Ray 2.60
        # serve/_private/constants.py RAY_SERVE_METRICS_EXPORT_INTERVAL_MS): every 1 s here
        # (measured, not shipped).
        "ray_metrics_1s": Variant(
            "ray_metrics_1s",
            tuned,
            {**env, **extra_env, "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000"},
            "as shipped but Serve's cached metrics exported every 1 s instead of 100 ms",
        ),
    }


def self_check_variant(note: str = "the bare server again: the self-check") -> Variant:
    """The bare server as a second side: whatever separates it from ``vllm`` is the bench's."""
    return Variant(SELF_CHECK, None, {}, note)


def engine_flags(engine_kwargs: dict[str, Any]) -> list[str]:
    flags = []
    for key, value in engine_kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False:
            flags += [flag, str(value)]
    return flags


def stop(proc: subprocess.Popen[bytes], tag: str) -> None:
    """SIGTERM (a clean shutdown), then SIGKILL whatever of the server is left; returns once
    no process of its session or carrying its tag is alive (RuntimeError past STOP_TIMEOUT_S)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)  # serve.shutdown() can take minutes; the rest is killed next
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while left := members(proc.pid, tag):
        if time.monotonic() > deadline:
            raise RuntimeError(f"server {tag}: processes still alive after SIGKILL: {left}")
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        time.sleep(0.2)


def _tag_of(p: psutil.Process) -> str | None:
    with contextlib.suppress(psutil.Error, OSError):
        return p.environ().get(TAG_ENV)
    return None


def _alive(p: psutil.Process) -> bool:
    with contextlib.suppress(psutil.Error):
        return p.status() != psutil.STATUS_ZOMBIE
    return False


@dataclass(frozen=True)
class Seen:
    """A live process as the census saw it."""

    pid: int
    sid: int
    tag: str | None  # its TAG_ENV (None: none, or not readable)


def census() -> list[Seen]:
    """Every live process on the machine but this one (zombies excluded: they run nothing and
    hold no memory), with its session and tag. Ray's agents (dashboard, runtime env) do not
    inherit the tag, but stay in the session; daemons that leave the session keep the tag."""
    out = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if p.pid != os.getpid() and _alive(p):
                out.append(Seen(p.pid, os.getsid(p.pid), _tag_of(p)))
    return out


def members(sid: int, tag: str, seen: list[Seen] | None = None) -> list[psutil.Process]:
    """Live processes of a server: in its session, or carrying its tag."""
    out = []
    for s in census() if seen is None else seen:
        if s.sid == sid or s.tag == tag:
            with contextlib.suppress(psutil.Error):
                out.append(psutil.Process(s.pid))
    return out


def _normal_priority() -> None:
    """In the server's child before exec: nice 0, whatever the client runs at."""
    os.setpriority(os.PRIO_PROCESS, 0, 0)


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def launched(
    cmd: list[str], log: Path, env: dict[str, str], tag: str
) -> Iterator[subprocess.Popen[bytes]]:
    """``cmd`` in a session of its own, ``tag`` in its environment, at nice 0; stopped on exit
    (``stop``: nothing of it left)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, **env, TAG_ENV: tag},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_normal_priority,
        )
    try:
        yield proc
    finally:
        stop(proc, tag)


def bare_argv(model: str, served: str, port: int, flags: list[str]) -> list[str]:
    """The bare server's arguments (vLLM's ``make_arg_parser`` reads them)."""
    return [
        *("--model", model, "--served-model-name", served),
        *("--host", "127.0.0.1", "--port", str(port), *flags),
    ]


@contextmanager
def bare_vllm(
    model: str,
    served: str,
    flags: list[str],
    work: Path,
    tag: str,
    side: str = BARE,
    env: dict[str, str] | None = None,
) -> Iterator[Server]:
    """vLLM's own OpenAI server: ``flags`` are the engine's (e.g. ``engine_flags``)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        *bare_argv(model, served, port, flags),
    ]
    log, started = work / f"{_file_name(tag)}.log", time.monotonic()
    with launched(cmd, log, env or {}, tag) as proc:
        deadline = time.monotonic() + 900
        while not local.probe(f"http://127.0.0.1:{port}/v1", served):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vLLM server did not come up:\n{_tail(log)}")
            time.sleep(2)
        yield Server(side, f"http://127.0.0.1:{port}", proc.pid, {}, time.monotonic() - started)


@contextmanager
def ray_serve_llm(
    side: str,
    serve_config: dict[str, Any],
    env: dict[str, str],
    work: Path,
    tag: str,
    module: str = "workloads.serve.local",
) -> Iterator[Server]:
    """``python -m workloads.serve.local --keep`` (or ``module``) on the rendered config, with
    ``env`` in the environment of Ray's processes (what the RayService pods get)."""
    config = work / f"{_file_name(tag)}.serveConfigV2.yaml"
    config.write_text(yaml.safe_dump(serve_config))
    env = {**own_ports_env(), **env}
    log, started = work / f"{_file_name(tag)}.log", time.monotonic()
    cmd = [sys.executable, "-m", module, "--serve-config", str(config), "--keep"]
    with launched(cmd, log, env, tag) as proc:
        deadline, endpoint = time.monotonic() + 900, None
        while endpoint is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray Serve LLM did not come up:\n{_tail(log)}")
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith(ENDPOINT_MARKER):
                    endpoint = line[len(ENDPOINT_MARKER) :].strip()
            time.sleep(1)
        yield Server(side, endpoint.removesuffix("/v1"), proc.pid, env, time.monotonic() - started)


@contextmanager
def started(
    v: Variant, model: str, served: str, engine: list[str], work: Path, tag: str
) -> Iterator[Server]:
    """The server of side ``v``, up and answering (for a replica-direct side, its base URL is
    the LLM replica's own port); stopped, every process gone, on exit."""
    if v.config is None:
        with bare_vllm(model, served, engine, work, tag, side=v.name, env=v.env) as server:
            yield server
        return
    with ray_serve_llm(v.name, v.config, v.env, work, tag, v.module) as server:
        if v.replica_direct:
            url = replica_direct_url(server.sid)
            if url is None:
                raise RuntimeError(f"{v.name}: no HAProxy config names the LLM replica")
            server.base_url = url
        yield server


def _file_name(tag: str) -> str:
    return tag.replace("/", "-")


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


def haproxy_configs(sid: int) -> list[str]:
    """The config files' text of the HAProxy processes Serve started in a server's session
    (``haproxy -f FILE``); none without HAProxy."""
    out = []
    for p in cpu.session(sid):
        with contextlib.suppress(Exception):
            args = p.cmdline()
            if "haproxy" in os.path.basename(args[0]) and "-f" in args:
                out.append(Path(args[args.index("-f") + 1]).read_text())
    return out


def replica_direct_url(sid: int) -> str | None:
    """The LLM server replica's own HTTP address, read from the HAProxy config of the Ray side
    (its ``server SERVE_REPLICA_...LLMServer...`` line); None without HAProxy."""
    for text in haproxy_configs(sid):
        found = re.search(r"server SERVE_REPLICA_\S*LLMServer\S* (\S+:\d+)", text)
        if found:
            return f"http://{found.group(1)}"
    return None
