"""The RL loop tests' task: one a randomly initialised tiny model can learn in a minute on CPU.

A tiny Llama built from a config knows no language, so a math or QA task gives it reward 0 on
every completion for far longer than a local run lasts, and GRPO (no spread within a group,
no advantage) learns nothing. The task here has a dense reward that such a model already
varies on: the share of vowels among the letters of the completion. It is checkable, it has
spread within every group from the first step, and a model that learns it visibly changes
what it writes (more vowels). It proves the loop learns; it is not a benchmark. (`park local
rl` shows a task that reads in words instead: the dev stack's facts from a fine-tuned start,
workloads/rl/facts_task.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workloads.rl.prompts import write_jsonl

# What the task is, as a run's summary names it.
TASK = (
    "share of vowels: a completion's reward is the share of vowels among its letters (0 to 1). "
    "The policy is a random-init tiny Llama that knows no words: success reads as vowels, "
    "not as sense"
)
SUBJECTS = ("the river", "a country", "the moon", "your home", "the sea", "a friend")
TEMPLATES = ("tell me about {}", "say something about {}", "describe {}", "name {}")


def vowel_share(*, completion: str, **_: Any) -> float:
    """The share of vowels among the completion's letters (0 when it has none)."""
    letters = [c for c in completion.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / max(len(letters), 1)


def prompts() -> list[dict[str, str]]:
    """The prompts of the task (the reward needs no reference answer: ``answer`` is empty)."""
    return [{"prompt": t.format(s), "answer": ""} for t in TEMPLATES for s in SUBJECTS]


def write_prompts(path: str | Path) -> str:
    """The prompts as a .jsonl file the run reads like any data set; returns its path."""
    return write_jsonl(path, prompts())
