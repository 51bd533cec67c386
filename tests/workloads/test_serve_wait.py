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
Each scenario runs in a process of its own (Serve in this process would outlive the test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra import ray_serve
from infra.plan import serve_tuning

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]


def _probe(scenario: str, workdir: Path, extra_env: dict[str, str]) -> dict[str, Any]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYLLM_"))}
    env = {**base, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", **extra_env}
    done = subprocess.run(
        [sys.executable, "-m", "tests.workloads.serve_wait_probe", scenario, str(workdir)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    return dict(json.loads(line.removeprefix("RESULT ")))


@pytest.mark.timeout(1000)
def test_a_waiting_replica_reaches_running_and_a_failing_one_is_deploy_failed(tmp_path):
    out = _probe(
        "serve",
        tmp_path,
        {
            # the controller's env as the pods carry it (serve_tuning.ray_env)
            **serve_tuning.START_ATTEMPTS_ENV,
            # Serve warns about slow starts after 2 s instead of 30: the wait lasts past it
            "RAY_SERVE_SLOW_STARTUP_WARNING_S": "2",
            "RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S": "1",
        },
    )
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
def test_each_host_expands_its_own_compile_cache_path(tmp_path):
    out = _probe("expand", tmp_path, {"TPU_WORKER_ID": "3"})
    for name, rendered in out["rendered"].items():
        assert rendered.endswith("/host-${TPU_WORKER_ID}"), rendered
        expected = rendered.replace("${TPU_WORKER_ID}", "3")
        assert out["replica"][name] == expected
        assert out["child"][name] == expected
