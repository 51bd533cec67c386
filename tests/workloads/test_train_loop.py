"""The training loop in this process (one gloo rank, no Ray): learning, checkpoints, resume."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.workloads.train_fixtures import gloo_world1  # noqa: F401  (fixture)
from workloads.train.config import TrainConfig
from workloads.train.distributed.runenv import LocalEnv
from workloads.train.run.loop import train
from workloads.train.testing import cpu_run

pytestmark = pytest.mark.usefixtures("gloo_world1")


def _config(**overrides: Any) -> TrainConfig:
    """The GPT tiny preset: 16 steps of 16 sequences of 64 tokens, a checkpoint every 8."""
    run = dict(seq_len=64, global_batch_size=16, steps=16, checkpoint_every=8, report_every=4)
    return cpu_run(**(run | {"model_size": "tiny", "lr": 1e-2, "warmup_steps": 2} | overrides))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_loss_falls_and_reports_every_n_steps(
    tmp_path: Path, strategy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    env = LocalEnv(tmp_path)
    state = train(_config(strategy=strategy), env)

    assert state.step == 16
    assert [r["step"] for r in env.reports] == [4, 8, 12, 16]
    losses = [r["loss"] for r in env.reports]
    assert losses[0] < math.log(256) + 0.1
    assert losses[-1] < 0.8 * losses[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint_00000008",
        "checkpoint_00000016",
    ]
    printed = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("PARK_METRICS ")
    ]
    assert len(printed) == 4
    assert {"tokens_per_s", "tokens_per_s_per_worker", "mfu"} <= set(env.reports[0])
    assert env.reports[0]["tokens_per_s"] > 0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_resume_continues_exactly_where_it_stopped(tmp_path: Path, strategy: str) -> None:
    """Weights, optimizer moments and data order all come back: same losses as without a stop."""
    straight = LocalEnv(tmp_path / "straight")
    train(_config(strategy=strategy), straight)

    resumed = LocalEnv(tmp_path / "resumed")
    resumed.root.mkdir()
    shutil.copytree(straight.root / "checkpoint_00000008", resumed.root / "checkpoint_00000008")
    state = train(_config(strategy=strategy), resumed)

    assert state.step == 16 and state.resumes == 1
    assert [r["step"] for r in resumed.reports] == [12, 16]
    assert resumed.reports[-1]["resumed_from_step"] == 8
    for a, b in zip(straight.reports[2:], resumed.reports, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5)


def test_a_finished_run_reports_where_it_stands(tmp_path: Path) -> None:
    env = LocalEnv(tmp_path)
    train(_config(), env)
    again = LocalEnv(tmp_path)
    state = train(_config(), again)
    assert state.step == 16
    assert [(r["step"], r["loss"]) for r in again.reports] == [(16, env.reports[-1]["loss"])]


def test_checkpoint_every_zero_still_keeps_the_final_model(tmp_path: Path) -> None:
    train(_config(steps=4, checkpoint_every=0, report_every=2), LocalEnv(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint_00000004"]
