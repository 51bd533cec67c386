"""Checkpoint and resume of an RL run: the learner (DCP), the prompt order and the policy
version come back, the run continues to ``--steps``, and the final policy is exported where
training's goes; after a resume an engine restarted by Ray still finds the folder it starts
from; a step of more completions than the old store's fixed 1,024 runs. The engines are
stand-ins (a Ray actor returning fixed-shape rollouts): what is under test is the loop's state,
not vLLM (tests/workloads/test_rl_loop.py runs vLLM)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.workloads.train_fixtures import ray_head, rendezvous, run_ranks, toy_rl
from workloads.protocol import training_export_path
from workloads.rl import loop, parts
from workloads.rl.rollout import Rollout, RolloutEngine, Sampling
from workloads.rl.sync import PolicyVersion, Staged, version_folder
from workloads.rl.toy import write_prompts
from workloads.train.distributed.runenv import LocalEnv
from workloads.train.outputs.checkpointing import DATA_STATE_DIR
from workloads.train.testing import process_group

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


class FakeEngine(RolloutEngine):
    """RolloutEngine with its engine replaced; completions of random tokens, each at log-prob
    -4. Like vLLM, it cannot start (or restart) without the model folder it is given."""

    def __init__(
        self, model: str, engine_kwargs: Any = None, cpu: bool = True, version: int = 0
    ) -> None:
        if not Path(model, "config.json").is_file():
            raise FileNotFoundError(f"no model at {model}: the engine cannot start")
        self.version = version
        self.last_sync_s = 0.0
        self.rng = random.Random(0)

    def load(self, policy: PolicyVersion | Staged) -> float:
        assert policy.path is not None and any(Path(policy.path).glob("*.safetensors"))
        self.version = policy.version
        return 0.0

    def sample(self, prompts: list[str], sampling: Sampling, offset: int = 0) -> list[Rollout]:
        out = []
        for index in range(len(prompts)):
            for _ in range(sampling.group_size):
                ids = [self.rng.randrange(3, 60) for _ in range(sampling.max_tokens)]
                text = "".join(self.rng.choice("aeioxyz") for _ in ids)
                out.append(Rollout(offset + index, [1, 5, 7], ids, text, [-4.0] * len(ids),
                                   self.version))  # fmt: skip
        return out


REPO = Path(__file__).resolve().parents[2]
# The fake engine's runs: groups of two short completions of short prompts, a fast lr.
SMALL: dict[str, Any] = dict(group_size=2, max_response_tokens=4, max_prompt_tokens=64, lr=1e-2)


@pytest.fixture(scope="module")
def ray_and_gloo() -> Iterator[None]:
    # not an in-process Ray (see ray_head); FakeEngine is imported from this module by workers
    with ray_head(runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}), process_group():
        yield


def _data_state(folder: Path) -> dict[str, Any]:
    return json.loads((folder / DATA_STATE_DIR / "rank-00000.json").read_text())


@pytest.mark.usefixtures("ray_and_gloo")
def test_a_resumed_run_continues_learner_prompts_and_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parts, "RolloutEngine", FakeEngine)
    cfg = toy_rl(tmp_path, steps=2, prompts_per_step=5, **SMALL)
    env = LocalEnv(tmp_path / "ckpt")
    first = loop.rl_train(cfg, env)
    assert [m["step"] for m in first] == [1, 2]
    saved = _data_state(tmp_path / "ckpt" / "checkpoint_00000002")
    # 24 prompts, 5 a step: the order stands at 10 of epoch 0, version 2
    assert saved["order"]["index"] == 10 and saved["policy_version"] == 2

    resumed = loop.rl_train(replace(cfg, steps=5), LocalEnv(tmp_path / "ckpt"))
    assert [m["step"] for m in resumed] == [3, 4, 5]
    assert all(m["resumes"] == 1 for m in resumed)
    assert resumed[-1]["version"] == 5
    # the first reward of the run is the first run's, kept through the checkpoint
    assert resumed[-1]["reward_first"] == first[0]["reward_mean"]
    final = _data_state(tmp_path / "ckpt" / "checkpoint_00000005")
    assert final["order"] == {"epoch": 1, "index": 1, "seed": 0}  # 25 prompts asked of 24
    # the start folders of both runs; the versions between went through Ray's object store
    for version in (0, 2):
        assert Path(version_folder(str(tmp_path / "rl"), version), "config.json").is_file()
    assert not Path(version_folder(str(tmp_path / "rl"), 5)).exists()
    export = Path(training_export_path(str(tmp_path), "rl"))
    assert export.name == "final" and (export / "config.json").is_file()
    assert json.loads((export / "park_export.json").read_text())["policy_version"] == 5


@pytest.mark.usefixtures("ray_and_gloo")
@pytest.mark.parametrize("weight_sync", ["ray", "folder"])
def test_after_a_resume_a_restarted_engine_finds_its_start_folder(
    weight_sync: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resumed run's engines start from its start folder (version 2 here). Three publishes
    later Ray restarts a killed engine from that folder again: it must still be there (it was
    deleted two publishes after a resume), and the engine is caught up from it."""
    import ray

    monkeypatch.setattr(parts, "RolloutEngine", FakeEngine)
    cfg = toy_rl(tmp_path, steps=2, prompts_per_step=2, weight_sync=weight_sync, **SMALL)
    loop.rl_train(cfg, LocalEnv(tmp_path / "ckpt"))
    seen: dict[str, int] = {}

    def kill(step: int, pool: Any) -> None:
        if step == 5:  # versions 3, 4, 5 published since the resume
            seen["before"] = ray.get(pool.engines[0].pid.remote())
            ray.kill(pool.engines[0], no_restart=False)
        if step == 6:
            seen["after"] = ray.get(pool.engines[0].pid.remote())

    resumed = loop.rl_train(replace(cfg, steps=7), LocalEnv(tmp_path / "ckpt"), kill)
    assert [m["step"] for m in resumed] == [3, 4, 5, 6, 7]
    assert seen["after"] != seen["before"]  # restarted, from the start folder
    assert Path(version_folder(str(tmp_path / "rl"), 2), "config.json").is_file()
    assert all(m["staleness_max"] <= 1 for m in resumed)


@pytest.mark.usefixtures("ray_and_gloo")
@pytest.mark.timeout(240)
def test_a_step_larger_than_a_thousand_completions_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """130 prompts x 8 = 1,040 completions: the store is sized from the batch (it refused the
    rest at its fixed 1,024 and the loop sampled again forever)."""
    monkeypatch.setattr(parts, "RolloutEngine", FakeEngine)
    run = SMALL | {"group_size": 8, "max_response_tokens": 2}
    cfg = toy_rl(tmp_path, steps=1, prompts_per_step=130, export=False, **run)
    assert cfg.batch == 1040 > 1024
    history = loop.rl_train(cfg, LocalEnv(tmp_path / "ckpt"))
    assert [m["step"] for m in history] == [1]


def _rank(rank: int, meet: str, root: str, queue: Any) -> None:
    """One of two learner ranks (a spawned process): rank 0 starts Ray and drives."""
    import ray
    import torch.distributed as dist

    parts.RolloutEngine = FakeEngine  # type: ignore[assignment,misc]
    dist.init_process_group(
        "gloo", init_method=meet, rank=rank, world_size=2, timeout=timedelta(seconds=300)
    )
    if rank == 0:
        ray.init(address="local", num_cpus=1, include_dashboard=False)
    try:
        data = f"{root}/p.jsonl"
        cfg = toy_rl(root, data=data, num_workers=2, steps=3, prompts_per_step=2, **SMALL)
        history = loop.rl_train(cfg, LocalEnv(f"{root}/ckpt", rank=rank, world_size=2))
        exported = Path(training_export_path(root, "rl"), "config.json").is_file()
        queue.put((rank, [m["step"] for m in history], exported))
        dist.barrier()  # both ranks done; the process ends now, taking the group with it
    finally:
        if rank == 0:
            ray.shutdown()


def test_two_learner_ranks_share_a_step(tmp_path: Path) -> None:
    """Two gloo ranks (what a TorchTrainer with two CPU workers runs): rank 0 samples and
    scatters, both step, both publish and export; the run ends at --steps on both."""
    import multiprocessing

    write_prompts(tmp_path / "p.jsonl")
    queue = multiprocessing.get_context("spawn").Queue()
    run_ranks(_rank, (rendezvous(tmp_path), str(tmp_path), queue), timeout_s=400)
    results = sorted(queue.get(timeout=5) for _ in range(2))
    assert results == [(0, [1, 2, 3], True), (1, [], True)]
    # the start folder; versions 1-3 went through Ray's object store (rank 1, no Ray worker
    # here, left the buckets to rank 0)
    assert Path(version_folder(str(tmp_path / "rl"), 0), "config.json").is_file()
