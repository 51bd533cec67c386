"""One-step-off without idle engines: with ``--overlap`` rank 0 launches step n+1's round as
soon as step n's rollouts are in, before it scores them (the engines sample while the rewards
are computed and the learner steps), and still no rollout staler than ``--max-staleness`` is
trained on. The loop is the job's own (``rl_train`` on a one-rank gloo group, the test_rl_resume
stand-in engines on a local Ray); the order of launches and scorings is read where the loop
calls them, the staleness from the rollouts scored and the learner's version at each step.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workloads.test_rl_resume import REPO, SMALL, FakeEngine
from tests.workloads.train_fixtures import ray_head, toy_rl
from workloads.rl import loop, parts
from workloads.rl.learner import GRPOLearner
from workloads.train.distributed.runenv import LocalEnv
from workloads.train.testing import process_group

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]
STEPS = 4


@pytest.fixture(scope="module")
def ray_and_gloo() -> Iterator[None]:
    # FakeEngine is imported from tests.workloads.test_rl_resume by the engine's worker
    with ray_head(runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}), process_group():
        yield


@pytest.mark.usefixtures("ray_and_gloo")
@pytest.mark.parametrize("overlap", [True, False], ids=["one-step-off", "synchronous"])
def test_the_next_round_starts_before_this_one_is_scored(
    overlap: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(parts, "RolloutEngine", FakeEngine)
    events: list[str] = []
    scored_versions: list[set[int]] = []
    stepped_from: list[int] = []  # the learner's version each update starts from
    launch, score, step = parts.Driver.launch, loop.score, GRPOLearner.step

    def launched(self: parts.Driver, cfg: Any) -> Any:
        events.append("launch")
        return launch(self, cfg)

    def scoring(rollouts: Any, *args: Any, **kwargs: Any) -> Any:
        events.append("score")
        scored_versions.append({r.version for r in rollouts})
        return score(rollouts, *args, **kwargs)

    def stepping(self: GRPOLearner, *args: Any, **kwargs: Any) -> Any:
        stepped_from.append(self.version)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(parts.Driver, "launch", launched)
    monkeypatch.setattr(loop, "score", scoring)
    monkeypatch.setattr(GRPOLearner, "step", stepping)
    cfg = toy_rl(tmp_path, steps=STEPS, prompts_per_step=2, export=False, overlap=overlap,
                 **SMALL)  # fmt: skip
    history = loop.rl_train(cfg, LocalEnv(tmp_path / "ckpt"))

    assert [m["step"] for m in history] == list(range(1, STEPS + 1))
    if overlap:  # step n+1's round out before step n's is scored; none after the last step
        assert events == ["launch"] + ["launch", "score"] * (STEPS - 1) + ["score"]
    else:  # each round after the publish: launch, score, learn
        assert events == ["launch", "score"] * STEPS
    # what each update trained on, against the version it started from
    assert len(scored_versions) == len(stepped_from) == STEPS
    staleness = [start - min(v) for start, v in zip(stepped_from, scored_versions, strict=True)]
    assert max(staleness) <= cfg.max_staleness == 1
    assert staleness == ([0] + [1] * (STEPS - 1) if overlap else [0] * STEPS)
    assert [m["staleness_max"] for m in history] == [float(s) for s in staleness]
