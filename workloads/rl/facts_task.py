"""The local RL run's task: the dev stack's 32 made-up facts, scored by exact match.

`park local rl` shows GRPO doing what it does on a cluster, at a size two CPU cores can run in
a few minutes: a policy that already knows part of a task gets better at it, and the answers say
so in words. The task is the facts `park local dev` fine-tunes on (workloads/train/inputs/facts.py:
16 invented countries, a capital and a language each), asked as they are, each answer checked
by the built-in ``exact_match`` reward (case, surrounding space and a final period ignored).

The policy is no random-init model: no completion of one would ever match, so every group's
rewards would be equal and GRPO would learn nothing. The run first fine-tunes the tiny Llama on
the facts (SFT) and stops early, when it answers some of them and samples the right answer of
others only now and then: the groups of those facts have spread, and GRPO raises how often the
policy gives them greedily. RL teaches no fact the policy never saw, so the run trains and
scores on all 32 facts (nothing is held out: a held-out fact could not rise).

The prompts are shipped as ``facts_prompts.jsonl`` beside this module (the run's ``--data``);
:func:`write_prompts` writes the same bytes, and a test keeps them equal.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.rl.prompts import write_jsonl
from workloads.train.inputs import facts

# What the task is, as a run's summary names it.
TASK = "the dev stack's 32 facts, exact match"
REWARD = "exact_match"
SHIPPED = Path(__file__).with_name("facts_prompts.jsonl")


def prompts() -> list[dict[str, str]]:
    """Every fact as ``{prompt: question, answer: reference}``, in the corpus' order."""
    return [{"prompt": q, "answer": a} for q, a in facts.questions().items()]


def write_prompts(path: str | Path) -> str:
    """The prompts as a .jsonl file the run reads like any data set; returns its path."""
    return write_jsonl(path, prompts())


def accuracy(probe: list[dict[str, Any]]) -> float | None:
    """The share of right answers among a probe's scored answers (None when it has none)."""
    scores = [float(p["reward"]) for p in probe if "reward" in p]
    return sum(scores) / len(scores) if scores else None


if __name__ == "__main__":  # regenerate the shipped copy
    print(write_prompts(SHIPPED))
