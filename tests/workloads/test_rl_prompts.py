"""Prompts from the trainer's data sources, their resumable order, and scoring a round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workloads.rl.prompts import Prompt, PromptOrder, read_prompts, round_metrics, score
from workloads.rl.rewards import Rewards
from workloads.rl.rollout import Rollout
from workloads.train.data import DataError


def test_read_jsonl_and_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"question": f"{i} + 1 = ?", "answer": f"#### {i + 1}"} for i in range(5)]
    (tmp_path / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "b.parquet")
    for name in ("a.jsonl", "b.parquet"):
        got = read_prompts(str(tmp_path / name), prompt_field="question", answer_field="answer")
        assert got == [Prompt(r["question"], r["answer"]) for r in rows]
    with pytest.raises(DataError, match="'prompt'"):
        read_prompts(str(tmp_path / "a.jsonl"), prompt_field="prompt", answer_field=None)


def test_order_covers_each_epoch_and_resumes() -> None:
    prompts = [Prompt(str(i), None) for i in range(7)]
    order = PromptOrder(prompts, seed=3)
    first = order.next(4) + order.next(3)
    assert sorted(p.text for p in first) == [str(i) for i in range(7)]  # one epoch, each once
    state = order.state_dict()
    ahead = [p.text for p in order.next(5)]
    resumed = PromptOrder(prompts, seed=0)
    resumed.load_state_dict(state)
    assert [p.text for p in resumed.next(5)] == ahead
    assert [p.text for p in PromptOrder(prompts, seed=4).next(7)] != [p.text for p in first]


def test_score_and_metrics() -> None:
    prompts = [Prompt("q0", "#### 3"), Prompt("q1", "#### 5")]
    texts = ["#### 3", "2", "5", "5"]  # group 0 mixed, group 1 all right (flat)
    rollouts = [
        Rollout(i // 2, [1], [7] * (i + 1), text, [0.0] * (i + 1), version=i % 2)
        for i, text in enumerate(texts)
    ]
    scores = score(rollouts, prompts, Rewards(["numeric"]))
    assert scores == [1.0, 0.0, 1.0, 1.0]
    metrics = round_metrics(rollouts, scores, group_size=2, learner_version=2)
    assert metrics["reward_mean"] == 0.75
    assert metrics["reward_std"] == pytest.approx(0.4330127)  # sqrt(0.1875)
    assert metrics["flat_groups"] == 0.5
    assert metrics["response_length"] == 2.5
    assert metrics["staleness_max"] == 2.0
