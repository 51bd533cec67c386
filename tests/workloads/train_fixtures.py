"""Fixtures for the training tests: a one-process gloo group and a real local Ray cluster.

The Ray cluster is started with ``ray start --head --block`` on ports picked at run time (the
machine may run other Ray clusters), and stopped by terminating that one process, which takes
down only the Ray processes it started (never ``ray stop``, which would stop everyone's).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from infra.tools.local.ray_head import LOCAL_RAY_ENV
from workloads.protocol import free_port  # distinct ports for every Ray server of a test head
from workloads.train.testing import TINY_LLAMA, process_group


@pytest.fixture(scope="session")
def tiny_llama_folder() -> Path:
    """park:tiny-llama's folder (config, tokenizer; no weights), built once into the cache."""
    from workloads.train.models import tiny_llama

    return tiny_llama.build()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_llama_folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_folder)


@pytest.fixture
def gloo_world1() -> Iterator[None]:
    """A default process group of one CPU rank, as the loop expects."""
    with process_group():
        yield


def run_ranks(
    target: Any, args: tuple[Any, ...], *, world_size: int = 2, timeout_s: float = 600
) -> None:
    """Run ``target(rank, *args)`` in ``world_size`` spawned processes and fail unless every
    one exits 0 within ``timeout_s``; a rank still running then is killed, so no child outlives
    the test (a hung non-daemon child would keep pytest from exiting after its summary)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    hang_s = max(1.0, timeout_s - 15)  # a rank still alive then prints its threads' stacks
    procs = [
        context.Process(target=_rank_entry, args=(target, rank, hang_s, args))
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    deadline = time.monotonic() + timeout_s
    try:
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.exitcode not in (None, 0):
                break  # one rank failed: the others would wait for it in a collective
    finally:
        codes = [proc.exitcode for proc in procs]
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=30)
    assert codes == [0] * world_size, f"exit codes of ranks 0..{world_size - 1}: {codes}"


def _rank_entry(target: Any, rank: int, hang_s: float, args: tuple[Any, ...]) -> None:
    """One rank: ``target(rank, *args)``, with every thread's stack printed to stderr (pytest
    shows it with the failure) and the process ended if it is still alive after ``hang_s``
    (in a collective or in ``destroy_process_group``).

    A rank whose target returned has done what the test checks: it flushes its queues and ends
    at once, without the interpreter's teardown, where a library's thread that never ends once
    kept rank 0 alive for the whole bound after rank 1 had exited 0 (CI, 2026-12-02)."""
    import faulthandler
    from multiprocessing.queues import Queue

    faulthandler.dump_traceback_later(hang_s, exit=True)
    target(rank, *args)
    for arg in args:
        if isinstance(arg, Queue):
            arg.close()
            arg.join_thread()  # what was put reaches the parent before the process ends
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def rendezvous(folder: Path) -> str:
    """A process group's meeting place in ``folder`` (a file: no port another process can take
    between picking it and binding it)."""
    return f"file://{folder / 'pg-rendezvous'}"


def one_rank_batches(units: Any, encoder: Any, **options: Any) -> Any:
    """``text.TextBatches`` of rank 0 in a world of one, seed 0, unless ``options`` say so."""
    from workloads.train.inputs import text

    return text.TextBatches(units, encoder, **({"seed": 0, "rank": 0, "world_size": 1} | options))


def toy_rl(root: str | Path, **fields: Any) -> Any:
    """The RL tests' run (an RLRunConfig): park:tiny-llama from its config learning the toy
    vowel-share reward on one CPU worker, DDP, one-step-off (rollouts at most one version
    behind), a checkpoint only at the end, in ``root``, on the toy prompts written to
    ``root``/p.jsonl unless ``data`` is given."""
    from workloads.rl.config import RLRunConfig
    from workloads.rl.toy import write_prompts

    run: dict[str, Any] = {"model": TINY_LLAMA, "init": "config", "max_staleness": 1}
    run |= {"accelerator": "cpu", "num_workers": 1, "strategy": "ddp", "checkpoint_every": 0}
    run |= {"rewards": "workloads.rl.toy:vowel_share", "storage_path": str(root), "run_name": "rl"}
    if "data" not in fields:
        run["data"] = write_prompts(Path(root) / "p.jsonl")
    return RLRunConfig(**(run | fields))


@dataclass(frozen=True)
class LocalRay:
    gcs_address: str
    dashboard_url: str
    temp_dir: Path


def _wait_for(url: str, deadline: float) -> None:
    """Until the server answers at all (401 counts: Ray 2.60 enables token auth by default)."""
    import urllib.error
    import urllib.request

    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"Ray dashboard did not answer at {url}")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[LocalRay]:
    """The session's 2-CPU Ray head with a dashboard, this process connected (`ray_head`)."""
    with ray_head() as head:
        yield head


@dataclass(frozen=True)
class _Head:
    process: subprocess.Popen[bytes]
    info: LocalRay
    num_cpus: int


# The session's Ray head, once a test has asked for one (tests/conftest.py stops it when no
# test ahead is of the ``ray`` kind, and at the end). Starting one costs ~10 s on 2 cores.
SHARED_HEAD_CPUS = 2
_shared: list[_Head] = []


@contextlib.contextmanager
def ray_head(num_cpus: int = 2, runtime_env: dict[str, Any] | None = None) -> Iterator[LocalRay]:
    """A Ray head with a dashboard (for the Jobs API); this process is connected to it.

    A head of ``SHARED_HEAD_CPUS`` is the session's, shared by every test module that asks for
    one: each connects as a job of its own (``runtime_env``), and what it ran goes with it when
    it disconnects, which the next connection checks (every CPU free, no actor alive). Another
    CPU count gets a head of its own, stopped on leaving.

    Tests that need Ray use this, never ``ray.init(address="local")``: a Ray started inside the
    test process and shut down again leaves state behind that makes a later TorchTrainer's
    controller actor die before it runs (seen with the RL tests before the Ray Train tests).
    """
    import ray

    if num_cpus == SHARED_HEAD_CPUS:
        if not _shared:
            _shared.append(_start_head(num_cpus))
        head, own = _shared[0], None
    else:
        head = own = _start_head(num_cpus)
    try:
        ray.init(address=head.info.gcs_address, log_to_driver=True, runtime_env=runtime_env)
        _wait_until_clean(head)
        yield head.info
    finally:
        ray.shutdown()
        if own is not None:
            _stop_head(own)


def stop_shared_head() -> None:
    """Stop the session's head, if one runs (a later test starts a new one)."""
    while _shared:
        _stop_head(_shared.pop())


atexit.register(stop_shared_head)  # however pytest ends: the head runs in a session of its own


def _wait_until_clean(head: _Head, timeout_s: float = 120) -> None:
    """Until every CPU is free and no actor is alive: nothing an earlier job ran is left."""
    import ray
    from ray.util.state import list_actors

    deadline = time.monotonic() + timeout_s
    while True:
        alive = list_actors(address=head.info.dashboard_url, filters=[("state", "=", "ALIVE")])
        free = ray.available_resources().get("CPU", 0.0)
        if not alive and free == head.num_cpus:
            return
        if time.monotonic() > deadline:
            names = [a.class_name for a in alive]
            raise RuntimeError(
                f"the Ray head is not clean after {timeout_s:.0f} s: actors alive {names}, "
                f"{free} of {head.num_cpus} CPUs free"
            )
        time.sleep(0.5)


def _start_head(num_cpus: int) -> _Head:
    """``ray start --head --block`` on ports picked now, once its dashboard answers.

    Ray 2.60 turns token auth on for a new head when ~/.ray/auth_token exists, but a client
    reads its auth mode once, when Ray is imported, so this process (imported long before)
    could not present a token. The head is therefore started with auth disabled: it lives
    for this session's tests and listens on ports nobody else was told about.
    """
    ports = {
        name: free_port()
        for name in (
            "port",
            "dashboard-port",
            "ray-client-server-port",
            "node-manager-port",
            "object-manager-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
        )
    }
    temp_dir = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths
    # park local's head settings (stop at once, patient at the start, Ray Train polling its
    # workers every 0.25 s instead of 2 s), then the test head's own.
    env = (
        dict(os.environ)
        | LOCAL_RAY_ENV
        | {
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("RAY_ADDRESS", None)
    command = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        "--block",
        f"--num-cpus={num_cpus}",
        "--include-dashboard=true",
        "--dashboard-host=127.0.0.1",
        f"--temp-dir={temp_dir}",
        "--object-store-memory=300000000",
        "--disable-usage-stats",
        *(f"--{name}={port}" for name, port in ports.items()),
    ]
    process = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    dashboard_url = f"http://127.0.0.1:{ports['dashboard-port']}"
    info = LocalRay(gcs_address="", dashboard_url=dashboard_url, temp_dir=temp_dir)
    try:
        # Slow on a busy 2-core machine: the head can take minutes to come up.
        _wait_for(dashboard_url + "/api/version", time.time() + 300)
        # Ray binds the GCS to the node's own IP, which it writes here once the head is up.
        address_file = temp_dir / "ray_current_cluster"
        deadline = time.time() + 120
        while not address_file.exists() and time.time() < deadline:
            time.sleep(0.5)
        info = replace(info, gcs_address=address_file.read_text().strip())
    except BaseException:
        _stop_head(_Head(process, info, num_cpus))
        raise
    return _Head(process, info, num_cpus)


def _stop_head(head: _Head) -> None:
    """Terminate the ``ray start`` process: it takes down the Ray processes it started (never
    ``ray stop``, which would stop everyone's)."""
    head.process.terminate()
    try:
        head.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        head.process.kill()
    shutil.rmtree(head.info.temp_dir, ignore_errors=True)
