"""Prompts with reference answers, from the sources training reads, and scoring a round.

The records come through the trainer's reader (workloads/train/inputs/text.py: jsonl, json, parquet
files, local or ``gs://``, and ``hf:`` hub data sets), so a data set that fine-tunes a model is
a data set RL can use: ``prompt_field`` holds the question, ``answer_field`` the reference
(GSM8K: ``question`` / ``answer``, whose ``#### 72`` line the numeric reward reads). A prompt is
asked through the run's template (``--prompt-template``: verl's GSM8K recipe appends "Let's think
step by step and output the final answer after \"####\"."), then the model's chat template;
prompts whose tokens, so rendered, pass ``--max-prompt-tokens`` are left out at the start, as
verl's ``filter_overlong_prompts`` and TRL's ``max_prompt_length`` keep them out of a batch.

The order is a seeded shuffle per epoch; the position is a small state (epoch, index) the run
checkpoints beside the learner, so a resumed run asks the next prompts, not the first ones again.

Scoring runs the rewards concurrently (a reward may call a sandbox or a service) on daemon
threads, each call bounded by ``--reward-timeout-s``: a call past it scores 0 and is counted; its
thread is left to finish on its own, and a round with more such calls than threads stops the run
rather than wait on rewards that hang.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads.rl.rewards import Rewards
from workloads.rl.rollout import TRUNCATED, Rollout


@dataclass(frozen=True)
class Prompt:
    text: str  # what the model is asked (the chat template is applied later, if any)
    answer: str | None  # the reference the rewards check against


def read_prompts(
    spec: str, *, prompt_field: str, answer_field: str | None, split: str = "train"
) -> list[Prompt]:
    """Every record of ``spec`` as a prompt (prompt sets are small: read whole)."""
    from workloads.train.inputs.batches import DataError
    from workloads.train.inputs.text_units import parse_item, plan_units, read_unit

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


def write_jsonl(path: str | Path, records: Sequence[dict[str, Any]]) -> str:
    """``records`` as a JSON Lines file (a shipped task's prompts, which a run reads like any
    data set), its folder made if need be; returns its path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(target)


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


def chat_prompt(tokenizer: Any, text: str, template_args: dict[str, Any] | None = None) -> str:
    """``text`` as the model's chat turn when its tokenizer has a template, else as is;
    ``template_args`` go to the template (Qwen3's ``enable_thinking``)."""
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            tokenize=False,
            add_generation_prompt=True,
            **(template_args or {}),
        )
        return str(rendered)
    return text


def prompt_token_ids(
    tokenizer: Any, text: str, template_args: dict[str, Any] | None = None
) -> list[int]:
    """The token ids the engine is handed for ``text``, with one BOS at most. A chat template
    renders its own BOS (Llama 3's and Gemma's write ``{{ bos_token }}``): its text is tokenized
    without special tokens, as ``apply_chat_template(tokenize=True)`` does, since vLLM given that
    text would add a second BOS; a plain prompt gets the tokenizer's own. A doubled BOS left at
    the start (a template and a tokenizer that both add one) is cut to one."""
    if getattr(tokenizer, "chat_template", None):
        rendered = chat_prompt(tokenizer, text, template_args)
        ids = list(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    else:
        ids = list(tokenizer(text)["input_ids"])
    bos = getattr(tokenizer, "bos_token_id", None)
    while bos is not None and len(ids) > 1 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]
    return ids


def fit_prompts(
    prompts: Sequence[Prompt], count_tokens: Callable[[Prompt], int], max_tokens: int
) -> tuple[list[Prompt], int]:
    """The prompts whose rendered token count is at most ``max_tokens``, and how many were
    left out; DataError when none is left."""
    from workloads.train.inputs.batches import DataError

    kept = [p for p in prompts if count_tokens(p) <= max_tokens]
    if not kept:
        raise DataError(
            f"every one of {len(prompts)} prompts is longer than --max-prompt-tokens {max_tokens}"
        )
    return kept, len(prompts) - len(kept)


SCORE_THREADS = 16


@dataclass
class Scores:
    values: list[float]
    timeouts: int  # calls that passed the timeout (scored 0)
    seconds: float
    nonfinite: int = 0  # reward values that were ±inf or NaN (each contributed 0: Rewards)


def score(
    rollouts: Sequence[Rollout],
    prompts: Sequence[Prompt],
    rewards: Rewards,
    *,
    timeout_s: float = 60.0,
    threads: int = SCORE_THREADS,
) -> Scores:
    """Each rollout's reward against its prompt's reference answer, ``threads`` at a time, each
    call at most ``timeout_s`` seconds (then 0). A reward's exception is raised here; a
    non-finite reward value is left out of the sum and counted (:meth:`Rewards.evaluate`)."""
    started = time.monotonic()
    values: list[float] = [0.0] * len(rollouts)
    nonfinite: list[int] = [0] * len(rollouts)
    state = _ScoreState(remaining=len(rollouts), pending=list(range(len(rollouts)))[::-1])

    def work() -> None:
        while True:
            with state.lock:
                if not state.pending or state.errors:
                    return
                index = state.pending.pop()
                state.running[index] = time.monotonic()
            rollout = rollouts[index]
            prompt = prompts[rollout.prompt_index]
            try:
                value, bad = rewards.evaluate(
                    prompt=prompt.text, completion=rollout.text, answer=prompt.answer
                )
            except BaseException as err:  # raised in the caller's thread below
                with state.lock:
                    state.errors.append(err)
                    state.lock.notify_all()
                return
            with state.lock:
                if state.running.pop(index, None) is not None:  # not given up on meanwhile
                    values[index], nonfinite[index] = value, bad
                    state.remaining -= 1
                    state.lock.notify_all()

    def start() -> None:
        threading.Thread(target=work, daemon=True, name="park-reward").start()

    for _ in range(min(threads, len(rollouts))):
        start()
    timeouts = 0
    with state.lock:
        while state.remaining and not state.errors:
            now = time.monotonic()
            for index in [i for i, began in state.running.items() if now - began > timeout_s]:
                del state.running[index]  # given up on: 0, and a new thread takes its place
                state.remaining -= 1
                timeouts += 1
                start()
            if timeouts > threads:
                raise RewardTimeout(
                    f"{timeouts} reward calls passed --reward-timeout-s {timeout_s:g} in one "
                    "round: the rewards hang"
                )
            oldest = min(state.running.values(), default=now)
            state.lock.wait(timeout=max(timeout_s - (now - oldest), 0.01))
    if state.errors:
        raise state.errors[0]
    return Scores(values, timeouts, time.monotonic() - started, sum(nonfinite))


@dataclass
class _ScoreState:
    remaining: int
    pending: list[int]
    running: dict[int, float] = field(default_factory=dict)  # index -> when its call began
    errors: list[BaseException] = field(default_factory=list)
    lock: threading.Condition = field(default_factory=threading.Condition)


class RewardTimeout(RuntimeError):
    """More reward calls passed the timeout in one round than there are scoring threads."""


def round_metrics(
    rollouts: Sequence[Rollout], scores: Sequence[float], group_size: int, learner_version: int
) -> dict[str, float]:
    """What a round reports: reward mean and spread, the share of groups that teach nothing
    (all rewards equal), the share of completions cut at the token limit (``truncated``), response
    length, and the staleness of what was used."""
    count = max(len(scores), 1)
    mean = sum(scores) / count
    spread = (sum((s - mean) ** 2 for s in scores) / count) ** 0.5
    groups = [scores[i : i + group_size] for i in range(0, len(scores), group_size)]
    flat = sum(flat_groups(scores, group_size)) / max(len(groups), 1)
    cut = sum(1 for r in rollouts if r.finish_reason == TRUNCATED)
    return {
        "reward_mean": mean,
        "reward_std": spread,
        "flat_groups": flat,
        "truncated": cut / max(len(rollouts), 1),
        "response_length": sum(len(r.completion_ids) for r in rollouts) / count,
        "staleness_max": float(max((learner_version - r.version for r in rollouts), default=0)),
    }


def flat_groups(scores: Sequence[float], group_size: int) -> list[bool]:
    """Per group of ``group_size`` consecutive scores: whether its rewards are all equal (its
    advantages are all zero: it teaches nothing)."""
    groups = [scores[i : i + group_size] for i in range(0, len(scores), group_size)]
    return [max(g) == min(g) for g in groups]
