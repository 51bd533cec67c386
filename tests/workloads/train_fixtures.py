"""Fixtures for the training tests: a one-process gloo group and a real local Ray cluster.

The Ray cluster is started with ``ray start --head --block`` on ports picked at run time (the
machine may run other Ray clusters), and stopped by terminating that one process, which takes
down only the Ray processes it started (never ``ray stop``, which would stop everyone's).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from workloads.protocol import free_port  # distinct ports for every Ray server of a test head
from workloads.train.testing import TINY_LLAMA, process_group


@pytest.fixture(scope="session")
def tiny_llama_folder() -> Path:
    """park:tiny-llama's folder (config, tokenizer; no weights), built once into the cache."""
    from workloads.train import tiny_llama

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


def one_rank_batches(units: Any, encoder: Any, **options: Any) -> Any:
    """``text.TextBatches`` of rank 0 in a world of one, seed 0, unless ``options`` say so."""
    from workloads.train import text

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
    """A 2-CPU Ray head with a dashboard, this process connected to it (`ray_head`)."""
    with ray_head() as head:
        yield head


@contextlib.contextmanager
def ray_head(num_cpus: int = 2, runtime_env: dict[str, Any] | None = None) -> Iterator[LocalRay]:
    """A Ray head with a dashboard (for the Jobs API); this process is connected to it.

    Tests that need Ray use this, never ``ray.init(address="local")``: a Ray started inside the
    test process and shut down again leaves state behind that makes a later TorchTrainer's
    controller actor die before it runs (seen with the RL tests before the Ray Train tests).

    Ray 2.60 turns token auth on for a new head when ~/.ray/auth_token exists, but a client
    reads its auth mode once, when Ray is imported, so this process (imported long before)
    could not present a token. The head is therefore started with auth disabled: it lives
    for one test module and listens on ports nobody else was told about.
    """
    import ray

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
    env = dict(os.environ) | {
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Stop at once at the end (no 30 s drain), and be patient at the start on a busy
        # machine, where the dashboard agent can take over a minute to register.
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        "RAY_agent_register_timeout_ms": "600000",
        "RAY_DASHBOARD_STARTUP_TIMEOUT_S": "600",
    }
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
    head = subprocess.Popen(
        command,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    dashboard_url = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        # Slow on a busy 2-core machine: the head can take minutes to come up.
        _wait_for(dashboard_url + "/api/version", time.time() + 300)
        # Ray binds the GCS to the node's own IP, which it writes here once the head is up.
        address_file = temp_dir / "ray_current_cluster"
        deadline = time.time() + 120
        while not address_file.exists() and time.time() < deadline:
            time.sleep(0.5)
        gcs_address = address_file.read_text().strip()
        ray.init(address=gcs_address, log_to_driver=True, runtime_env=runtime_env)
        yield LocalRay(gcs_address=gcs_address, dashboard_url=dashboard_url, temp_dir=temp_dir)
    finally:
        ray.shutdown()
        head.terminate()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)
