"""Fixtures for the serving tests: one real CPU deployment shared by every ``serve`` test.

The server is the real entrypoint, ``python -m workloads.serve.local --keep``, in its own process
(and so its own Ray cluster on random ports): a cold start costs ~1 min, so it is started once
per test module, the first one when the session starts (tests/conftest.py EARLY_FIXTURES: it
comes up beside the fast tier). Its output goes to a log file that the fixture reads for the
``PARK_ENDPOINT`` line; teardown sends SIGTERM and expects a clean exit with every process of
the tree gone.

Import a fixture into a test module by assignment (``local_server = fx.local_server``) so that
pytest registers it there.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from infra.tools.local.ray_head import LOCAL_RAY_ENV
from tests.conftest import lower_priority

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"

# The contract with the infra side: what the plan layer renders into the RayService.
TPU_SERVE_CONFIG_YAML = """\
applications:
- name: llm
  route_prefix: /
  import_path: ray.serve.llm:build_openai_app
  args:
    llm_configs:
    - model_loading_config: {model_id: "llama-3.1-8b-instruct", model_source: "gs://b/models/x"}
      accelerator_type: TPU-V6E
      accelerator_config: {kind: tpu, topology: "4x4"}
      engine_kwargs: {tensor_parallel_size: 16, max_model_len: 8192, enable_expert_parallel: false}
      deployment_config: {autoscaling_config: {min_replicas: 1, max_replicas: 1}}
      runtime_env: {env_vars: {TPU_MULTIHOST_BACKEND: ray, VLLM_DISABLE_COMPILE_CACHE: "1"}}
"""
READY_TIMEOUT_S = 600


def tpu_serve_config() -> dict[str, Any]:
    return yaml.safe_load(TPU_SERVE_CONFIG_YAML)


def rendered_serve_configs() -> dict[str, str]:
    """serveConfigV2 of every stack's golden RayService (what ``park render`` emits)."""
    out = {}
    for path in sorted(GOLDEN.glob("*/manifests/rayservice-*.yaml")):
        doc = yaml.safe_load(path.read_text())
        out[path.parts[-3]] = doc["spec"]["serveConfigV2"]
    return out


def serve_config_for_local() -> tuple[str, str]:
    """(label, YAML) to deploy: the dev stack's rendered config, else the contract example."""
    rendered = rendered_serve_configs()
    if "dev" in rendered:
        return "stack dev (golden render)", rendered["dev"]
    return "contract example", TPU_SERVE_CONFIG_YAML


class TreeMemory:
    """Samples the summed RSS of a process and all its descendants; keeps the peak."""

    def __init__(self, pid: int, period_s: float = 2.0) -> None:
        self.pid, self.period_s, self.peak_bytes = pid, period_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> int:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += p.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.peak_bytes = max(self.peak_bytes, self.now())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class LocalServer:
    endpoint: str
    ray_address: str
    model_id: str
    log: Path
    proc: subprocess.Popen[bytes]
    memory: TreeMemory
    cold_start_s: float
    config_label: str
    notes: dict[str, Any] = field(default_factory=dict)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def _wait_for_line(proc: subprocess.Popen[bytes], log: Path, prefix: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
        if proc.poll() is not None:
            break
        time.sleep(1)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    raise RuntimeError(f"no {prefix!r} line (exit code {proc.poll()}); log tail:\n{tail}")


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 90) -> tuple[int, list[int]]:
    """SIGTERM, wait, then return (exit code, pids of the tree still alive)."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait(30)
    _, alive = psutil.wait_procs(tree, timeout=15)
    for p in alive:  # our own leftovers, by pid
        p.kill()
    return code, [p.pid for p in alive]


@dataclass
class StartingServer:
    """The server's process, started, not yet known to answer."""

    proc: subprocess.Popen[bytes]
    log: Path
    model_id: str
    config_label: str
    memory: TreeMemory
    started: float

    def stop(self) -> tuple[int, list[int]]:
        self.memory.stop()
        return _stop(self.proc)


def start_local_server(config: pytest.Config) -> StartingServer:
    """``python -m workloads.serve.local --keep`` on the stack's serveConfigV2, started."""
    work = config._tmp_path_factory.mktemp("serve")  # type: ignore[attr-defined]
    label, text = serve_config_for_local()
    config_file = work / "serveConfigV2.yaml"
    config_file.write_text(text)
    model_id = yaml.safe_load(text)["applications"][0]["args"]["llm_configs"][0][
        "model_loading_config"
    ]["model_id"]
    log = work / "local.log"
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "workloads.serve.local"),
                *("--serve-config", str(config_file), "--keep", "--timeout", str(READY_TIMEOUT_S)),
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # park local's Ray settings (the environment wins): no drain when it stops
            env={**LOCAL_RAY_ENV, **os.environ, "PYTHONUNBUFFERED": "1"},
        )
    lower_priority(proc.pid)  # it may start early, beside the fast tier: below it
    return StartingServer(proc, log, model_id, label, TreeMemory(proc.pid), started)


@pytest.fixture(scope="module")
def local_server(request: pytest.FixtureRequest) -> Iterator[LocalServer]:
    """The stack's serveConfigV2 deployed on CPU by ``python -m workloads.serve.local --keep``:
    the one the session started early (tests/conftest.py EARLY_FIXTURES), else started now."""
    from tests.conftest import take_early

    starting = take_early("local_server") or start_local_server(request.config)
    try:
        endpoint = _wait_for_line(
            starting.proc, starting.log, "PARK_ENDPOINT ", READY_TIMEOUT_S + 120
        )
        ray_address = _wait_for_line(starting.proc, starting.log, "PARK_RAY_ADDRESS ", 30)
    except BaseException:
        starting.stop()
        raise
    server = LocalServer(
        endpoint=endpoint,
        ray_address=ray_address,
        model_id=starting.model_id,
        log=starting.log,
        proc=starting.proc,
        memory=starting.memory,
        cold_start_s=time.monotonic() - starting.started,
        config_label=starting.config_label,
    )
    yield server
    code, leftovers = starting.stop()
    print(
        f"\n[serve] {server.config_label}: up {server.cold_start_s:.0f}s after its start, "
        f"peak RSS of the tree {server.memory.peak_bytes / 2**30:.1f} GiB, exit {code}, "
        f"{server.notes}"
    )
    assert code == 0, f"local server exited {code}; log: {server.log}"
    assert not leftovers, f"processes left after shutdown: {leftovers}"


KILL_REPLICA = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
         if a["namespace"] == "serve" and a["name"].startswith("SERVE_REPLICA::")
         and "LLMServer" in a["name"]]
assert len(names) == 1, names
ray.kill(ray.get_actor(names[0], namespace="serve"), no_restart=True)
print(names[0])
"""

LIST_REPLICAS = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
print("\\n".join(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
      if a["namespace"] == "serve" and "LLMServer" in a["name"]))
"""


def ray_driver(script: str, address: str) -> str:
    """Run a short Ray driver against the server's cluster (keeps Ray out of pytest's process).

    ``RAY_AUTH_MODE=token``: Ray 2.60 starts local clusters with token auth (~/.ray/auth_token),
    and a driver attaching by address sends the token only in token mode.
    """
    done = subprocess.run(
        [sys.executable, "-c", script, address],
        env={**os.environ, "RAY_AUTH_MODE": "token"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()
