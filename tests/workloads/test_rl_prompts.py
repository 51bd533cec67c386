"""Prompts from the trainer's data sources, their resumable order, and scoring a round."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from workloads.rl.config import render_prompt
from workloads.rl.prompts import (
    Prompt,
    PromptOrder,
    RewardTimeout,
    fit_prompts,
    read_prompts,
    round_metrics,
    score,
)
from workloads.rl.rewards import Rewards
from workloads.rl.rollout import Rollout
from workloads.train.inputs.batches import DataError


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
    scored = score(rollouts, prompts, Rewards(["numeric"]))
    scores = scored.values
    assert scores == [1.0, 0.0, 1.0, 1.0] and scored.timeouts == 0
    metrics = round_metrics(rollouts, scores, group_size=2, learner_version=2)
    assert metrics["reward_mean"] == 0.75
    assert metrics["reward_std"] == pytest.approx(0.4330127)  # sqrt(0.1875)
    assert metrics["flat_groups"] == 0.5
    assert metrics["response_length"] == 2.5
    assert metrics["staleness_max"] == 2.0


# ---- the template, the length filter, concurrent scoring with a timeout --------------------

VERL_GSM8K = '{prompt} Let\'s think step by step and output the final answer after "####".'


def test_the_template_asks_for_the_format_and_keeps_braces_in_the_data() -> None:
    # verl examples/data_preprocess/gsm8k.py: question + " " + instruction_following
    question = "Natalia sold clips to {48} friends. How many?"
    asked = render_prompt(VERL_GSM8K, question)
    assert (
        asked
        == question + " " + 'Let\'s think step by step and output the final answer after "####".'
    )
    assert render_prompt("{prompt}", question) == question


def test_prompts_longer_than_the_limit_are_left_out() -> None:
    prompts = [Prompt("a " * n, None) for n in (3, 10, 5, 40)]
    kept, dropped = fit_prompts(prompts, lambda p: len(p.text.split()), max_tokens=8)
    assert [len(p.text.split()) for p in kept] == [3, 5] and dropped == 2
    with pytest.raises(DataError, match="--max-prompt-tokens 2"):
        fit_prompts(prompts, lambda p: len(p.text.split()), max_tokens=2)


CONCURRENT = threading.Barrier(4, timeout=60)
NEVER = threading.Event()


def meet_three_others(*, completion: str, **_: object) -> float:
    """Returns only once four calls run at once: scoring one at a time would break the barrier."""
    CONCURRENT.wait()
    return float(len(completion))


def hang_on_h(*, completion: str, **_: object) -> float:
    """Never returns for a completion starting with "h" (a sandbox that hangs)."""
    if completion.startswith("h"):
        NEVER.wait()
    return 1.0


def _rollouts(texts: list[str]) -> list[Rollout]:
    return [Rollout(0, [1], [2], text, [0.0], version=0) for text in texts]


def test_rewards_run_concurrently() -> None:
    rewards = Rewards(["tests.workloads.test_rl_prompts:meet_three_others"])
    scored = score(_rollouts(["a", "bb", "ccc", "dddd"]), [Prompt("q", None)], rewards, threads=4)
    assert scored.values == [1.0, 2.0, 3.0, 4.0] and scored.timeouts == 0


def test_a_reward_past_the_timeout_scores_zero_and_the_round_goes_on() -> None:
    rewards = Rewards(["tests.workloads.test_rl_prompts:hang_on_h"])
    texts = ["ok", "hang", "fine", "good", "hung", "yes"]
    scored = score(_rollouts(texts), [Prompt("q", None)], rewards, timeout_s=0.2, threads=2)
    assert scored.values == [1.0, 0.0, 1.0, 1.0, 0.0, 1.0] and scored.timeouts == 2
    with pytest.raises(RewardTimeout, match="hang"):  # more hung calls than threads: stop
        score(_rollouts(["h1", "h2", "h3"]), [Prompt("q", None)], rewards, timeout_s=0.1, threads=1)
