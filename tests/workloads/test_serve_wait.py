"""On a real local Ray 2.60, Ray's own controller is the reference (issue 27, item 4 and 10).

- A serving replica whose model folder is absent, through the rendered waiting callback
  (workloads/serve/wait.py), stays STARTING past Serve's slow-start warning without a failed
  start being counted, and reaches RUNNING once the folder's marker appears: no redeploy.
- The same deployment with Ray's default callback fails its starts and ends DEPLOY_FAILED
  after exactly the plan's threshold (max_constructor_retry_count and the pods' per-replica
  RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT, infra/ray_serve.py).
- Ray's runtime_env expands the rendered ``${TPU_WORKER_ID}`` of a multi-host replica's
  compile-cache paths from each worker's own environment, in the replica's children too.

Why no vLLM here: what is under test is Serve's controller and Ray Serve LLM's LLMServer
(Ray's builder, its async constructor, the callback hook of the engine start); the engine is
swapped through Ray's own RAYLLM_VLLM_ENGINE_CLS hook for one whose start runs the callback
and then reads the folder, as vLLM's does first (tests/workloads/serve_wait_probe.py). The
real engine waits the same way in `park local dev` (tests/e2e/test_park_local.py).
Each scenario runs in a process of its own (Serve in this process would outlive the test); the
session starts both when it starts (tests/conftest.py EARLY_FIXTURES), beside the fast tier.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra import ray_serve
from infra.plan import serve_tuning
from tests.conftest import Background

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]


# Each scenario's own environment (the process' is the test session's, Ray's settings removed).
SCENARIOS: dict[str, dict[str, str]] = {
    "serve": {
        # the controller's env as the pods carry it (serve_tuning.ray_env)
        **serve_tuning.START_ATTEMPTS_ENV,
        # Serve warns about slow starts after 2 s instead of 30: the wait lasts past it
        "RAY_SERVE_SLOW_STARTUP_WARNING_S": "2",
        "RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S": "1",
    },
    "expand": {"TPU_WORKER_ID": "3"},
}
PROBE_TIMEOUT_S = 900


@dataclass
class Probes:
    """Every scenario's process, started; ``result`` waits for one's RESULT line."""

    procs: dict[str, Background]
    started: float

    def result(self, scenario: str) -> dict[str, Any]:
        left = PROBE_TIMEOUT_S - (time.monotonic() - self.started)
        out = self.procs[scenario].output(left)
        (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
        return dict(json.loads(line.removeprefix("RESULT ")))

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.stop()


def start_probes(config: pytest.Config) -> Probes:
    """Both scenarios' processes, started at once, each in a folder of its own."""
    workdir = config._tmp_path_factory.mktemp("serve-wait")  # type: ignore[attr-defined]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYLLM_"))}
    procs = {}
    for scenario, extra_env in SCENARIOS.items():
        folder = workdir / scenario
        folder.mkdir()
        env = {**base, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **extra_env}
        command = [sys.executable, "-m", "tests.workloads.serve_wait_probe", scenario]
        procs[scenario] = Background.start([*command, str(folder)], folder, env=env, cwd=ROOT)
    return Probes(procs, time.monotonic())


@pytest.fixture(scope="module")
def serve_wait_probes(request: pytest.FixtureRequest) -> Iterator[Probes]:
    """The scenarios the session started early (tests/conftest.py EARLY_FIXTURES), or now."""
    from tests.conftest import take_early

    probes = take_early("serve_wait_probes") or start_probes(request.config)
    yield probes
    probes.stop()


@pytest.mark.timeout(1000)
def test_a_waiting_replica_reaches_running_and_a_failing_one_is_deploy_failed(
    serve_wait_probes: Probes,
) -> None:
    out = serve_wait_probes.result("serve")
    assert out["callback"]["callback_class"] == "workloads.serve.wait:WaitForModel"
    # while its folder was absent: still deploying, a slow start, not a failure
    status, message = out["waits_while_waiting"]
    assert status == "DEPLOYING", out
    assert "to initialize" in message and "failed" not in message, out
    # the marker appeared: RUNNING, from the one start that waited, no redeploy
    assert out["waits"][0] == "RUNNING", out
    assert out["waits_attempts"] == 1, out
    # without the wait: DEPLOY_FAILED after exactly the plan's threshold for one replica
    threshold = ray_serve.SERVE_START_ATTEMPTS_PER_REPLICA
    assert out["retries"] == threshold
    assert out["fails"][0] == "DEPLOY_FAILED", out
    assert out["fails_attempts"] == threshold, out
    assert "config.json" in out["fails"][1], out


@pytest.mark.timeout(600)
def test_each_host_expands_its_own_compile_cache_path(serve_wait_probes: Probes) -> None:
    out = serve_wait_probes.result("expand")
    for name, rendered in out["rendered"].items():
        assert rendered.endswith("/host-${TPU_WORKER_ID}"), rendered
        expected = rendered.replace("${TPU_WORKER_ID}", "3")
        assert out["replica"][name] == expected
        assert out["child"][name] == expected
