"""Prompts with reference answers, from the sources training reads, and scoring a round.

The records come through the trainer's reader (workloads/train/text.py: jsonl, json, parquet
files, local or ``gs://``, and ``hf:`` hub data sets), so a data set that fine-tunes a model is
a data set RL can use: ``prompt_field`` holds the question, ``answer_field`` the reference
(GSM8K: ``question`` / ``answer``, whose ``#### 72`` line the numeric reward reads). The order
is a seeded shuffle per epoch; the position is a small state (epoch, index) the run checkpoints
beside the learner, so a resumed run asks the next prompts, not the first ones again.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workloads.rl.rewards import Rewards
from workloads.rl.rollout import Rollout


@dataclass(frozen=True)
class Prompt:
    text: str  # what the model is asked (the chat template is applied later, if any)
    answer: str | None  # the reference the rewards check against


def read_prompts(
    spec: str, *, prompt_field: str, answer_field: str | None, split: str = "train"
) -> list[Prompt]:
    """Every record of ``spec`` as a prompt (prompt sets are small: read whole)."""
    from workloads.train.data import DataError
    from workloads.train.text_units import parse_item, plan_units, read_unit

    prompts = []
    for unit in plan_units(spec, split=split):
        for item in read_unit(unit):
            record = parse_item(unit, item)
            if not isinstance(record, dict) or prompt_field not in record:
                raise DataError(f"{unit.uri}: a record has no {prompt_field!r} field")
            answer = None if answer_field is None else record.get(answer_field)
            reference = None if answer is None else str(answer)
            prompts.append(Prompt(str(record[prompt_field]), reference))
    if not prompts:
        raise DataError(f"{spec}: no prompts")
    return prompts


class PromptOrder:
    """Batches of prompts in a seeded order, epoch after epoch, with a resumable position."""

    def __init__(self, prompts: Sequence[Prompt], seed: int = 0) -> None:
        self.prompts = list(prompts)
        self.seed = seed
        self.epoch = 0
        self.index = 0

    def _order(self) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return order

    def next(self, count: int) -> list[Prompt]:
        batch: list[Prompt] = []
        while len(batch) < count:
            order = self._order()
            take = order[self.index : self.index + count - len(batch)]
            batch += [self.prompts[i] for i in take]
            self.index += len(take)
            if self.index >= len(order):
                self.epoch, self.index = self.epoch + 1, 0
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index, "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self.seed = int(state["seed"])


def chat_prompt(tokenizer: Any, text: str) -> str:
    """``text`` as the model's chat turn when its tokenizer has a template, else as is."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        return str(rendered)
    return text


def score(rollouts: Sequence[Rollout], prompts: Sequence[Prompt], rewards: Rewards) -> list[float]:
    """Each rollout's reward against its prompt's reference answer."""
    return [
        rewards(
            prompt=prompts[r.prompt_index].text,
            completion=r.text,
            answer=prompts[r.prompt_index].answer,
        )
        for r in rollouts
    ]


def round_metrics(
    rollouts: Sequence[Rollout], scores: Sequence[float], group_size: int, learner_version: int
) -> dict[str, float]:
    """What a round reports: reward mean and spread, the share of groups that teach nothing
    (all rewards equal), response length, and the staleness of what was used."""
    count = max(len(scores), 1)
    mean = sum(scores) / count
    spread = (sum((s - mean) ** 2 for s in scores) / count) ** 0.5
    groups = [scores[i : i + group_size] for i in range(0, len(scores), group_size)]
    flat = sum(1 for g in groups if max(g) == min(g)) / max(len(groups), 1)
    return {
        "reward_mean": mean,
        "reward_std": spread,
        "flat_groups": flat,
        "response_length": sum(len(r.completion_ids) for r in rollouts) / count,
        "staleness_max": float(max((learner_version - r.version for r in rollouts), default=0)),
    }
