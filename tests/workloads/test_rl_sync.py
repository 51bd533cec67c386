"""The weight-sync contract: versions only go up, staleness is bounded where the learner takes
rollouts and where producers put them (a round in one call each way), and, with real Ray actors
on CPU: the learner's bf16 buckets go through Ray's object store to one receiver per host and
load as the learner's weights; engines are caught up to the newest version all at once, rollouts
carry it; a killed engine actor is restarted by Ray and caught up again while the run goes on;
an engine killed *during* a round costs only its share, sampled again on the newest weights.

The engines here are stand-ins with RolloutEngine's surface whose "weights" are the published
tensors (so loading a version is what changes what they sample); the real vLLM engine goes
through the same calls in test_rl_rollout.py.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workloads.train_fixtures import gloo_world1, ray_head, tiny_llama_folder  # noqa: F401
from workloads.rl.rollout import Rollout, RolloutPool, Sampling
from workloads.rl.sync import (
    HostReceiver,
    PolicyStore,
    PolicyVersion,
    Staged,
    WeightBucket,
    staleness,
    stream_safetensors,
    version_folder,
)

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


def test_a_round_goes_in_one_call_and_a_full_store_says_so() -> None:
    store = PolicyStore(max_staleness=1, capacity=4)
    store.publish(2, "v2")
    put = store.put_many([(2, "a"), (1, "b"), (0, "late"), (2, "c"), (2, "d"), (2, "e")])
    assert (put.accepted, put.stale, put.full) == (4, 1, 1)
    assert store.take(10, learner_version=2).items == ["a", "b", "c", "d"]


def test_stream_safetensors_reads_what_safetensors_wrote(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    tensors = {
        "a.weight": torch.randn(5, 3).to(torch.bfloat16),
        "b.bias": torch.arange(7, dtype=torch.float32),
        "c.idx": torch.tensor([[1, 2], [3, 4]], dtype=torch.int64),
    }
    save_file(dict(list(tensors.items())[:2]), tmp_path / "model-1.safetensors")
    save_file(dict(list(tensors.items())[2:]), tmp_path / "model-2.safetensors")
    got = dict(stream_safetensors(str(tmp_path)))
    want = {**load_file(tmp_path / "model-1.safetensors")} | load_file(
        tmp_path / "model-2.safetensors"
    )
    assert sorted(got) == sorted(tensors)
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, rtol=0, atol=0)
    # a tensor-parallel rank's slice is a view of the file: copying it copies only the slice
    rank1 = got["a.weight"].narrow(0, 3, 2)
    torch.testing.assert_close(rank1.clone(), tensors["a.weight"][3:5], rtol=0, atol=0)


# ---- with Ray actors ----------------------------------------------------------------------------


class FakeEngine:
    """RolloutEngine's surface; what it "samples" is the weights it last loaded: the "w" tensor of
    a published version (0 at its start, as RolloutEngine starts from the run's start folder)."""

    def __init__(self, model: str = "", engine_kwargs: Any = None, cpu: bool = True,
                 version: int = 0) -> None:  # fmt: skip
        self.version = version
        self.weights = "w0"
        self.calls = 0

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def get_version(self) -> int:
        return self.version

    def sample_calls(self) -> int:
        return self.calls

    def load(self, policy: PolicyVersion | Staged) -> float:
        assert policy.path is not None
        weights = dict(stream_safetensors(policy.path))
        self.weights = f"w{int(weights['w'].float()[0].item())}"
        self.version = policy.version
        return 0.001

    def sample(self, prompts: list[str], sampling: Sampling, offset: int = 0) -> list[Rollout]:
        self.calls += 1
        return [
            Rollout(offset + i, [1], [2], f"{p}:{self.weights}", [0.0], self.version)
            for i, p in enumerate(prompts)
            for _ in range(sampling.group_size)
        ]


class DiesDuringARound(FakeEngine):
    """Dies in the middle of its first sample call after it loaded version 2 (the marker file
    beside the run makes it the only death: the restarted process finds it)."""

    def sample(self, prompts: list[str], sampling: Sampling, offset: int = 0) -> list[Rollout]:
        marker = Path(os.environ["PARK_TEST_MARKER"])
        if self.version >= 2 and not marker.exists():
            marker.write_text(str(os.getpid()))
            os._exit(1)
        return super().sample(prompts, sampling, offset)


class DiesStaging(HostReceiver):
    """Dies in the middle of staging version 2, its first bucket pulled, once (a marker beside
    PARK_TEST_MARKER makes it the only death: the restarted process finds it)."""

    def pid(self) -> int:
        return os.getpid()

    def stage(self, policy: PolicyVersion) -> Staged:
        import ray

        marker = Path(os.environ["PARK_TEST_MARKER"]).with_name("receiver-died")
        if policy.version == 2 and policy.buckets and not marker.exists():
            ray.get(policy.buckets[0].ref)
            marker.write_text(str(os.getpid()))
            os._exit(1)
        return super().stage(policy)


def _publish(store: Any, root: Path, version: int) -> None:
    """A folder version whose "w" tensor is the version number."""
    import ray
    import torch
    from safetensors.torch import save_file

    path = Path(version_folder(str(root), version))
    path.mkdir(parents=True)
    save_file({"w": torch.tensor([float(version)])}, path / "model.safetensors")
    ray.get(store.publish.remote(version, str(path)))


def _publish_buckets(store: Any, version: int, parts: int = 3) -> list[int]:
    """A bucket version: "w" in the last of ``parts`` buckets; returns the buckets' sizes."""
    import numpy as np
    import ray
    import torch
    from safetensors.torch import save

    sizes = []
    for index in range(parts):
        name = "w" if index == parts - 1 else f"pad{index}"
        data = np.frombuffer(save({name: torch.full((64,), float(version))}), dtype=np.uint8)
        bucket = WeightBucket(index, ray.put(data), int(data.nbytes))
        assert ray.get(store.offer.remote(version, [bucket])) == index + 1
        sizes.append(bucket.nbytes)
    ray.get(store.publish_offered.remote(version, parts))
    return sizes


@pytest.fixture(scope="module")
def ray_cpu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # The fakes live in this test module: the workers import it from the repository root.
    marker = tmp_path_factory.mktemp("marker") / "died"
    env = {"PYTHONPATH": str(REPO), "PARK_TEST_MARKER": str(marker)}
    with ray_head(runtime_env={"env_vars": env}):
        yield marker


def _restarted_pid(actor: Any, before: int, *, deadline: float) -> int:
    """The actor's pid once it differs from `before` (its restart has come up)."""
    import ray

    while time.monotonic() < deadline:
        try:
            pid = int(ray.get(actor.pid.remote(), timeout=30))
        except ray.exceptions.RayActorError:
            continue  # the old process died under the call
        if pid != before:
            return pid
    raise AssertionError(f"actor still at pid {before} when the deadline passed")


def _engines(cls: type, count: int) -> list[Any]:
    """Engine actors with the options the run gives them (workloads/rl/parts.py)."""
    import ray

    from tests.workloads.train_fixtures import toy_rl
    from workloads.rl.parts import engine_options

    options = engine_options(toy_rl("/tmp/unused", data="/tmp/p.jsonl"), "cpu") | {"num_cpus": 0}
    return [ray.remote(cls).options(**options).remote() for _ in range(count)]


def _receivers(engines: list[Any], name: str) -> dict[str, Any]:
    import ray

    hosts = set(ray.get([engine.node_id.remote() for engine in engines]))
    actor = ray.remote(HostReceiver).options(num_cpus=0)
    return {host: actor.remote(name) for host in hosts}


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_engines_follow_versions_and_survive_a_kill(ray_cpu: Path, tmp_path: Path) -> None:
    import ray

    store = ray.remote(PolicyStore).options(num_cpus=0).remote(max_staleness=1, capacity=16)
    engines = _engines(FakeEngine, 2)
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
        put = ray.get(store.put_many.remote([(r.version, r) for r in rollouts]))
        assert put.accepted == 6
        taken = ray.get(store.take.remote(6, learner_version))
        assert len(taken.items) == 6 and taken.dropped == 0
        learner_version = step + 1
        _publish(store, tmp_path, learner_version)

    # Kill one engine: Ray restarts it (max_restarts) with its start weights (version 0); the
    # next round catches it up before sampling, so no rollout of the old weights gets out.
    before = ray.get(engines[0].pid.remote())
    ray.kill(engines[0], no_restart=False)
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


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_buckets_reach_every_engine_through_one_receiver_per_host(ray_cpu: Path) -> None:
    import ray

    store = ray.remote(PolicyStore).options(num_cpus=0).remote(max_staleness=1, capacity=16)
    engines = _engines(FakeEngine, 3)
    receivers = _receivers(engines, f"park-rl-test-{os.getpid()}")
    assert len(receivers) == 1  # one node here: one receiver for the three engines
    pool = RolloutPool(engines, store, receivers=receivers)
    sizes = _publish_buckets(store, 1)
    round_ = pool.launch(["p0", "p1", "p2"], Sampling(group_size=1))
    rollouts, stats = pool.finish(round_)
    assert {r.text.split(":")[1] for r in rollouts} == {"w1"} and {r.version for r in rollouts} == {
        1
    }
    # The host pulled each bucket once for its three engines; all three loaded.
    assert (stats.version, stats.engines, stats.nbytes) == (1, 3, sum(sizes))
    staged = ray.get(next(iter(receivers.values())).stage.remote(ray.get(store.latest.remote())))
    assert staged.path is not None and staged.path.startswith(("/dev/shm", "/tmp"))
    assert len(list(Path(staged.path).glob("*.safetensors"))) == 3

    # Pre-staged while the engines sample: the next round only loads it.
    _publish_buckets(store, 2)
    pool.prestage(ray.get(store.latest.remote()))
    rollouts, stats = pool.finish(pool.launch(["p0"], Sampling(group_size=2)))
    assert {r.text.split(":")[1] for r in rollouts} == {"w2"} and stats.nbytes == sum(sizes)
    # The host keeps the two newest versions; closing the receiver frees its memory.
    _publish_buckets(store, 3)
    pool.finish(pool.launch(["p0"], Sampling(group_size=1)))
    root = Path(staged.path).parent
    assert sorted(p.name for p in root.iterdir()) == ["v000002", "v000003"]
    for receiver in receivers.values():
        ray.get(receiver.close.remote())
    assert not root.exists()


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_an_engine_killed_during_a_round_costs_only_its_share(
    ray_cpu: Path, tmp_path: Path
) -> None:
    """The engine dies in the middle of sampling version 2: Ray restarts it (start weights),
    the pool loads version 2 into the new process and samples that share again; the other
    engine's share is kept as it came (it sampled once). Before, Ray replayed the call on the
    restarted engine (task retries) with the start weights and the round came back stale."""
    import ray

    store = ray.remote(PolicyStore).options(num_cpus=0).remote(max_staleness=0, capacity=64)
    dies, lives = _engines(DiesDuringARound, 1) + _engines(FakeEngine, 1)
    pool = RolloutPool([dies, lives], store)
    prompts = ["p0", "p1", "p2", "p3"]
    for version in range(3):
        _publish(store, tmp_path, version)
        rollouts = pool.sample(prompts, Sampling(group_size=2))
        assert [r.prompt_index for r in rollouts] == [0, 0, 1, 1, 2, 2, 3, 3]
        assert {r.version for r in rollouts} == {version}, version
        assert {r.text.split(":")[1] for r in rollouts} == {f"w{version}"}
    assert ray_cpu.exists()  # it did die, in the round of version 2
    assert int(ray_cpu.read_text()) != ray.get(dies.pid.remote())
    assert ray.get(lives.sample_calls.remote()) == 3  # the living engine's share: once a round


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_receiver_killed_mid_stage_is_staged_again_and_the_run_goes_on(ray_cpu: Path) -> None:
    """The host's receiver dies while it pulls version 2 (pre-staged behind the sampling): Ray
    restarts it, and the pool stages version 2 again on the new process instead of handing the
    engines the failed stage for ever; the engines reach version 2 within a round or two (a
    round whose load failed samples the old weights, which the staleness bound judges)."""
    import ray

    store = ray.remote(PolicyStore).options(num_cpus=0).remote(max_staleness=1, capacity=64)
    engines = _engines(FakeEngine, 2)
    receiver = ray.remote(DiesStaging).options(num_cpus=0, max_restarts=2)  # as parts.py
    host = ray.get(engines[0].node_id.remote())
    receivers = {host: receiver.remote(f"park-rl-test-dies-{os.getpid()}")}
    pool = RolloutPool(engines, store, receivers=receivers)
    _publish_buckets(store, 1)
    rollouts, _ = pool.finish(pool.launch(["p0", "p1"], Sampling(group_size=1)))
    assert {r.version for r in rollouts} == {1}
    before = ray.get(receivers[host].pid.remote())

    _publish_buckets(store, 2)
    pool.prestage(ray.get(store.latest.remote()))  # the receiver dies under this one
    versions = []
    for _ in range(4):
        rollouts, _ = pool.finish(pool.launch(["p0", "p1"], Sampling(group_size=1)))
        versions.append({r.version for r in rollouts})
        if versions[-1] == {2}:
            break
    assert versions[-1] == {2} and len(versions) <= 2, versions
    assert {r.text.split(":")[1] for r in rollouts} == {"w2"}
    died = ray_cpu.with_name("receiver-died")
    assert died.exists() and int(died.read_text()) == before  # it died, mid-stage
    assert ray.get(receivers[host].pid.remote()) != before  # the version came from its restart
    ray.get(receivers[host].close.remote())
