"""The whole local GRPO loop, for real: the trainer's tiny Llama as the learner (gloo), a vLLM
engine on CPU as a Ray actor, weights published and reloaded after every update. The reward
rises with a learning rate and stays flat at zero, so the rise comes from the updates.

The task is deliberately one a randomly initialised model can learn in a minute: the share of
vowels among the completion's letters (dense, within-group spread from the first step). The
reward is named like a stack's, ``module:function``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from workloads.rl.loop import RLConfig, run, summary
from workloads.rl.prompts import Prompt

pytestmark = [pytest.mark.serve, pytest.mark.ray, pytest.mark.timeout(1200)]

PROMPTS = [Prompt(q, None) for q in ["tell me about the river", "name one country", "hello"]]


def vowels(*, completion: str, **_: object) -> float:
    letters = [c for c in completion.lower() if not c.isspace()]
    return sum(c in "aeiou" for c in letters) / max(len(letters), 1)


@pytest.fixture(scope="module")
def ray_and_gloo() -> Iterator[None]:
    import ray
    import torch.distributed as dist

    from workloads.protocol import free_port

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()
        ray.shutdown()


def _run(lr: float, root: Path) -> list[dict[str, float]]:
    cfg = RLConfig(
        rewards=["tests.workloads.test_rl_loop:vowels"],
        steps=12,
        prompts_per_step=2,
        group_size=8,
        lr=lr,
        storage=str(root),
    )
    history = run(cfg, PROMPTS)
    print(summary(history))
    return history


def _gain(history: list[dict[str, float]]) -> float:
    first = sum(m["reward_mean"] for m in history[:3]) / 3
    last = sum(m["reward_mean"] for m in history[-3:]) / 3
    return last - first


@pytest.mark.usefixtures("ray_and_gloo")
def test_reward_rises_with_updates_and_stays_flat_without(tmp_path: Path) -> None:
    learning = _run(1e-2, tmp_path / "lr")
    assert len(learning) == 12 and learning[-1]["version"] == 12
    assert all(m["staleness_max"] == 0 for m in learning)  # synchronous: always on-policy
    assert _gain(learning) > 0.1, summary(learning)  # measured: 0.33 -> 0.57 in 12 steps

    frozen = _run(0.0, tmp_path / "zero")
    assert abs(_gain(frozen)) < 0.06, summary(frozen)  # sampling noise only (measured 0.03)
    assert _gain(learning) > _gain(frozen) + 0.1
    assert all(m["clip_fraction"] == 0 for m in frozen)  # the engine is the learner exactly
