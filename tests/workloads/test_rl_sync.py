"""The weight-sync contract: versions only go up, staleness is bounded where the learner takes
rollouts and where producers put them, and (with real Ray actors on CPU) engines are caught up
to the newest version, rollouts carry it, and a killed engine actor is restarted by Ray and
caught up again while the run goes on.

The engines here are stand-ins with RolloutEngine's surface whose "weights" are the contents of
the published folder (so loading the folder is what changes what they sample); the real vLLM
engine goes through the same calls in test_rl_rollout.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workloads.train_fixtures import ray_head
from workloads.rl.rollout import Rollout, RolloutPool, Sampling
from workloads.rl.sync import PolicyStore, PolicyVersion, staleness, version_folder

REPO = Path(__file__).resolve().parents[2]


def test_versions_only_go_up() -> None:
    store = PolicyStore(max_staleness=1)
    assert store.latest() is None and store.learner_version() == -1
    store.publish(0, "/w/v0")
    store.publish(2, "/w/v2")
    with pytest.raises(ValueError, match="only go up"):
        store.publish(2, "/w/again")
    latest = store.latest()
    assert latest is not None and latest.version == 2 and latest.path == "/w/v2"
    assert version_folder("gs://b/run/", 7) == "gs://b/run/policy/v000007"
    assert staleness(5, 3) == 2


def test_take_drops_rollouts_staler_than_the_bound() -> None:
    store = PolicyStore(max_staleness=1, capacity=10)
    store.publish(0, "v0")
    for version, item in [(0, "a"), (0, "b")]:
        assert store.put(version, item)
    store.publish(1, "v1")
    assert store.put(1, "c")
    store.publish(2, "v2")
    assert not store.put(0, "late")  # refused at the door: 2 - 0 > 1
    taken = store.take(10, learner_version=2)
    assert taken.items == ["c"] and taken.versions == [1]
    assert taken.dropped == 2 and taken.max_staleness_seen == 1
    assert store.stats() == {"learner_version": 2, "queued": 0, "dropped": 2, "refused": 1}


def test_on_policy_bound_and_a_full_queue_makes_the_producer_wait() -> None:
    store = PolicyStore(max_staleness=0, capacity=2)
    store.publish(3, "v3")
    assert store.put(3, 1) and store.put(3, 2)
    assert not store.put(3, 3)  # full: wait, nothing is lost
    assert store.queued() == 2 and store.refused == 0
    assert store.take(1, learner_version=3).items == [1]
    assert store.take(5, learner_version=4).dropped == 1  # the learner moved on: stale


# ---- with Ray actors ----------------------------------------------------------------------------


class FakeEngine:
    """RolloutEngine's surface; what it "samples" is the weights file it last loaded. Like
    RolloutEngine it starts from the run's version-0 weights (the model folder it was given)."""

    def __init__(self) -> None:
        self.version = 0
        self.weights = "w0"

    def pid(self) -> int:
        return os.getpid()

    def get_version(self) -> int:
        return self.version

    def load(self, policy: PolicyVersion) -> float:
        self.weights = json.loads((Path(policy.path) / "weights.json").read_text())["w"]
        self.version = policy.version
        return 0.001

    def sample(self, prompts: list[str], sampling: Sampling, offset: int = 0) -> list[Rollout]:
        return [
            Rollout(offset + i, [1], [2], f"{p}:{self.weights}", [0.0], self.version)
            for i, p in enumerate(prompts)
            for _ in range(sampling.group_size)
        ]


def _publish(store: Any, root: Path, version: int) -> None:
    import ray

    path = Path(version_folder(str(root), version))
    path.mkdir(parents=True)
    (path / "weights.json").write_text(json.dumps({"w": f"w{version}"}))
    ray.get(store.publish.remote(version, str(path)))


@pytest.fixture(scope="module")
def ray_cpu() -> Iterator[None]:
    # FakeEngine lives in this test module: the workers import it from the repository root.
    with ray_head(runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}):
        yield


def _restarted_pid(actor: Any, before: int, *, deadline: float) -> int:
    """The actor's pid once it differs from `before` (its restart has come up)."""
    import ray

    while time.monotonic() < deadline:
        try:
            pid = int(ray.get(actor.pid.remote(), timeout=30))
        except ray.exceptions.RayActorError:
            continue  # the old process died under the call; Ray retries on the new one
        if pid != before:
            return pid
    raise AssertionError(f"actor still at pid {before} when the deadline passed")


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.usefixtures("ray_cpu")
def test_engines_follow_versions_and_survive_a_kill(tmp_path: Path) -> None:
    import ray

    store = ray.remote(PolicyStore).options(num_cpus=0).remote(max_staleness=1, capacity=16)
    engine_cls = ray.remote(FakeEngine).options(num_cpus=0, max_restarts=1, max_task_retries=1)
    engines = [engine_cls.remote(), engine_cls.remote()]
    pool = RolloutPool(engines, store)
    sampling = Sampling(group_size=2)
    prompts = ["p0", "p1", "p2"]

    assert pool.sync() == 0  # nothing published yet: engines keep their start weights
    _publish(store, tmp_path, 0)
    learner_version = 0
    for step in range(3):
        rollouts = pool.sample(prompts, sampling)
        # Grouped by prompt in order, each tagged with the version that sampled it.
        assert [r.prompt_index for r in rollouts] == [0, 0, 1, 1, 2, 2]
        assert {r.version for r in rollouts} == {learner_version}
        assert {r.text.split(":")[1] for r in rollouts} == {f"w{learner_version}"}
        for rollout in rollouts:
            assert ray.get(store.put.remote(rollout.version, rollout))
        taken = ray.get(store.take.remote(6, learner_version))
        assert len(taken.items) == 6 and taken.dropped == 0
        learner_version = step + 1
        _publish(store, tmp_path, learner_version)

    # Kill one engine: Ray restarts it (max_restarts) with its start weights (version 0); the
    # next round catches it up before sampling, so no rollout of the old weights gets out.
    before = ray.get(engines[0].pid.remote())
    ray.kill(engines[0], no_restart=False)
    # ray.kill is asynchronous: a call made at once may still reach the dying process. Wait
    # (bounded) for the restarted one, then it must be at the start weights.
    assert _restarted_pid(engines[0], before, deadline=time.monotonic() + 120) != before
    assert ray.get(engines[0].get_version.remote()) == 0  # a new process, at the start weights
    rollouts = pool.sample(prompts, sampling)
    assert {r.version for r in rollouts} == {learner_version}
    assert {r.text.split(":")[1] for r in rollouts} == {f"w{learner_version}"}
    # Loads: versions 1 and 2 by both engines in the loop, then 3 by both (one of them the
    # restarted engine, caught up from 0 in one load).
    assert len(pool.sync_s) == 2 * 3

    # A producer left behind: its rollouts of version 1 are refused at the door and, if
    # queued before the learner moved on, dropped when taken.
    assert not ray.get(store.put.remote(1, "stale"))
    assert ray.get(store.put.remote(learner_version, "fresh"))
    _publish(store, tmp_path, learner_version + 2)
    taken = ray.get(store.take.remote(10, learner_version + 2))
    assert taken.items == [] and taken.dropped == 1
    assert ray.get(store.stats.remote())["refused"] == 1
