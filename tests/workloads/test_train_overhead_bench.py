"""benchmarks/train_overhead.py runs Ray Train with the settings the RayJob's pods run it with."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.torch


def test_the_benchmarks_ray_train_settings_are_the_pods() -> None:
    pytest.importorskip("torch")
    from ray.train.v2._internal import constants

    from benchmarks import train_overhead

    env = train_overhead.pods_train_env()
    # the pods set no RAY_TRAIN_* variable: Ray's defaults, which the benchmark states
    for stack in ("dev", "prod"):
        text = ROOT / "tests" / "golden" / stack / "manifests" / "rayjob-park-train.yaml"
        names = {
            e.get("name", "") for doc in yaml.safe_load_all(text.read_text()) for e in _envs(doc)
        }
        assert not {n for n in names if n.startswith("RAY_TRAIN_")}, stack
    assert env == {
        constants.HEALTH_CHECK_INTERVAL_S_ENV_VAR: f"{constants.DEFAULT_HEALTH_CHECK_INTERVAL_S:g}"
    }


def _envs(node: object) -> list[dict[str, str]]:
    if isinstance(node, dict):
        found = list(node.get("env") or []) if isinstance(node.get("env"), list) else []
        return found + [e for v in node.values() for e in _envs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _envs(v)]
    return []


def test_worker_settings_say_what_decides_thread_sharing() -> None:
    pytest.importorskip("torch")
    from benchmarks import train_overhead

    got = train_overhead.worker_settings()
    assert got["nice"] == os.nice(0) and got["torch_threads"] >= 1
    assert got["loop_in_main_thread"] is True and got["os_threads"] >= 1


def test_the_start_up_tail_is_counted_beside_the_steady_step_time() -> None:
    pytest.importorskip("torch")
    from benchmarks import train_figures

    # Report windows of 10 steps: the first holds warm-up, the next two a tail 0.05 s per
    # step above the steady 0.1 s (Ray Train's helper actors starting), then steady.
    times = [0.5, 0.15, 0.15] + [0.1] * 6
    reports = [{"step": 10 * (i + 1), "step_time_s": t} for i, t in enumerate(times)]
    assert train_figures.steady_step_time(reports) == pytest.approx(0.1)
    assert train_figures.transient_s(reports) == pytest.approx(2 * 10 * 0.05)
    # a run no longer than its tail has the tail as its median: what the goal case's default
    # length (more windows than twice the tail's) avoids
    short = reports[:4]
    assert train_figures.steady_step_time(short) == pytest.approx(0.15)
