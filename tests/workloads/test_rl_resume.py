"""Checkpoint and resume of an RL run: the learner (DCP), the prompt order and the policy
version come back, the run continues to ``--steps``, and the final policy is exported where
training's goes. The engines are stand-ins (a Ray actor returning fixed-shape rollouts): what
is under test is the loop's state, not vLLM (tests/workloads/test_rl_loop.py runs vLLM)."""

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
from workloads.rl import loop
from workloads.rl.rollout import Rollout, Sampling
from workloads.rl.sync import PolicyVersion, version_folder
from workloads.rl.toy import write_prompts
from workloads.train.checkpointing import DATA_STATE_DIR
from workloads.train.runenv import LocalEnv
from workloads.train.testing import process_group

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


class FakeEngine:
    """RolloutEngine's interface; completions of random tokens, each at log-prob -4."""

    def __init__(self, model: str, engine_kwargs: Any = None, cpu: bool = True) -> None:
        self.version = 0
        self.rng = random.Random(0)

    def get_version(self) -> int:
        return self.version

    def load(self, policy: PolicyVersion) -> float:
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
SMALL: dict[str, Any] = dict(group_size=2, max_response_tokens=4, max_prompt_tokens=16, lr=1e-2)


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
    monkeypatch.setattr(loop, "RolloutEngine", FakeEngine)
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
    assert Path(version_folder(str(tmp_path / "rl"), 5), "config.json").is_file()
    export = Path(training_export_path(str(tmp_path), "rl"))
    assert export.name == "final" and (export / "config.json").is_file()
    assert json.loads((export / "park_export.json").read_text())["policy_version"] == 5


def _rank(rank: int, meet: str, root: str, queue: Any) -> None:
    """One of two learner ranks (a spawned process): rank 0 starts Ray and drives."""
    import ray
    import torch.distributed as dist

    loop.RolloutEngine = FakeEngine  # type: ignore[assignment,misc]
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
    finally:
        if rank == 0:
            ray.shutdown()
        dist.destroy_process_group()


def test_two_learner_ranks_share_a_step(tmp_path: Path) -> None:
    """Two gloo ranks (what a TorchTrainer with two CPU workers runs): rank 0 samples and
    scatters, both step, both publish and export; the run ends at --steps on both."""
    import multiprocessing

    write_prompts(tmp_path / "p.jsonl")
    queue = multiprocessing.get_context("spawn").Queue()
    run_ranks(_rank, (rendezvous(tmp_path), str(tmp_path), queue), timeout_s=400)
    results = sorted(queue.get(timeout=5) for _ in range(2))
    assert results == [(0, [1, 2, 3], True), (1, [], True)]
    assert Path(version_folder(str(tmp_path / "rl"), 3), "config.json").is_file()
