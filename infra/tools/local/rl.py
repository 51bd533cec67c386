"""`park local rl`: the RL stack's own RayJob entrypoint on a local Ray, on this machine's CPU.

The stack post-trains a pretrained instruct model with GRPO. Here the policy is the tiny Llama,
and a random-init one knows nothing a reward could find, so the run makes its own starting
policy first and then runs the stack's job from it, the way the stack runs it from its model:

1. warm start: `python -m workloads.train` fine-tunes the tiny Llama on the dev stack's 32
   made-up facts (what `park local dev` trains, TRAIN_CPU_PROFILE) and is stopped early
   (rl_profile.py WARM_START_PROFILE): it answers some facts and now and then samples the
   right answer of others. A Ray job through the same Jobs API path, exporting a Hugging Face
   folder into the stack's (emulated) bucket. The rl stack declares no training job: this one
   is the local run's, said so where it prints.
2. RL: the rendered RayJob's ``python -m workloads.rl ...`` with the changes CPU needs
   (RL_CPU_PROFILE, each with its reason, all printed): one gloo learner worker and one
   vLLM-CPU engine instead of the two TPU slices, the warm start's export instead of the hub
   model, the facts as prompts scored by the built-in ``exact_match`` reward instead of GSM8K
   (workloads/rl/facts_task.py says why this task). The job scores the starting policy's greedy
   answer to every fact before its first step (``--probe-prompts``) and the policy's again every
   few steps (``--eval-every``): accuracy before → after, on all 32 facts.
3. serving: the final policy's export served with ``workloads.serve.local`` (the replica waits
   for the export inside its start) and asked one fact: of those the starting policy answers
   wrong, the one whose right answer it finds likeliest (transformers' greedy answers and
   answer log-probabilities from the warm start's export, read while the RL job starts,
   before any RL step). The summary scores the served answer beside the starting
   policy's: ``answer  0 → 1``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from infra.plan.ray.service import wait_callback
from infra.resolve.types import ModelWait
from infra.tools.local import console as console_out
from infra.tools.local.answers import stand_in
from infra.tools.local.outcome import LocalRun
from infra.tools.local.ray_head import LocalRunError
from infra.tools.local.rl_profile import (
    EVAL_EVERY,
    FACTS,
    RL_MODULE,
    RL_TIMEOUT_S,
    WARM_START_PROFILE,
    WARM_START_STEPS,
    cpu_rl_entrypoint,
    runs_rl,
    warm_start_entrypoint,
)
from infra.tools.local.submit import LocalJob, export_of, run_job
from infra.tools.outdir import write_new
from workloads import protocol
from workloads.rl.config import RLRunConfig
from workloads.rl.rewards import exact_match

SERVED_ID = "rl-policy"
# What run.py and the tests import from here.
__all__ = ["RL_MODULE", "cpu_rl_entrypoint", "run_rl", "runs_rl", "serve_config"]


def _job(profile: Any, kind: str, title: str, table: str, log: str, label: str) -> LocalJob:
    """One of the run's two Ray jobs: its profile (the table in rl_profile.py) and names."""
    return LocalJob(
        profile=profile,
        kind=kind,
        title=f"{title} through the Ray Jobs API",
        table=f"infra/tools/local/rl_profile.py {table}",
        log_name=log,
        timeout_s=RL_TIMEOUT_S,
        label=f"the {label}",
        failed_as=f"{label} job",
    )


WARM_START_JOB = _job(
    warm_start_entrypoint,
    "training",
    "warm start: SFT of the tiny Llama on the facts,",
    "WARM_START_PROFILE",
    "warm-start.log",
    "warm start (SFT)",
)


@dataclass
class RLRecords:
    """What the RL job reported: each step's mean reward, and the accuracy of its starting
    policy (the probe) and of each evaluation."""

    rewards: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)  # the probe's, then each evaluation's
    steps: set[Any] = field(default_factory=set)


def run_rl(rayjob: dict[str, Any], run: LocalRun, *, start_serving: Any) -> None:
    """The warm start, then the RL job from its export with serving started beside it (asked
    the wrong fact the starting policy is nearest to), then the summary lines.
    ``start_serving``: serving.py's. Raises LocalRunError on failure."""
    outcome = run.outcome
    warm = warm_start(rayjob, run)
    outcome.export = export_of(rayjob, outcome.bucket, RLRunConfig.run_name)
    policy = rayjob["spec"]["entrypoint"]
    outcome.stand_in = stand_in(warm, protocol.split_entrypoint(policy)[1].get("model"))
    # The served question, picked from the starting policy's answers while the job starts.
    serving = Background(lambda: _pick_and_serve(run, warm, start_serving))
    records = RLRecords()
    try:
        _rl_job(rayjob, run, warm, records)
        picked, started = serving.result()
        started.finish(
            run,
            keep=False,
            on_ready=lambda *_: _report(run, records, picked),
            summary=False,
        )
    finally:
        serving.stop()


def warm_start(rayjob: dict[str, Any], run: LocalRun) -> str:
    """Run the warm start's job; returns its export, as the pods' mount shows it."""
    console, outcome = run.console, run.outcome
    total = int(WARM_START_PROFILE["steps"][0] or 0)

    def on_record(kind: str, record: dict[str, Any]) -> None:
        if kind == protocol.METRICS and record.get("step") != (outcome.last_metrics or {}).get(
            "step"
        ):  # Ray may forward a line twice
            outcome.last_metrics = record
            console.print(f"  {console_out.metrics_line(record, total)}", highlight=False)
        elif kind == protocol.RESULT:
            outcome.trained = record

    run_job(WARM_START_JOB, rayjob, run, on_record=on_record, succeeded=bool)
    result, outcome.trained, outcome.last_metrics = outcome.trained or {}, None, None
    export = str(result.get("export_path") or "")
    console.print(
        f"warm start {result.get('status')} in {outcome.train_seconds:.0f}s: step "
        f"{result.get('final_step')}, loss {console_out.fmt(result.get('final_loss'), '.4f')}, "
        f"export {export}",
        highlight=False,
        soft_wrap=True,
    )
    if not export:
        raise LocalRunError("the warm start wrote no Hugging Face export")
    return export


def _rl_job(rayjob: dict[str, Any], run: LocalRun, warm: str, records: RLRecords) -> None:
    console, outcome = run.console, run.outcome

    def on_record(kind: str, record: dict[str, Any]) -> None:
        if kind == protocol.METRICS and isinstance(record.get("probe"), list):
            records.accuracy[:1] = [_share_right(record["probe"])]
        elif kind == protocol.METRICS and "reward_mean" in record:
            if record.get("step") not in records.steps:  # Ray may forward a line twice
                records.steps.add(record.get("step"))
                outcome.last_metrics = record
                records.rewards.append(float(record["reward_mean"]))
                if "eval_reward" in record:
                    records.accuracy.append(float(record["eval_reward"]))
                console.print(f"  {step_line(record)}", highlight=False)
        elif kind == protocol.RESULT:
            outcome.trained = record

    job = _job(
        partial(cpu_rl_entrypoint, model=warm),
        "rl",
        "RL: the RayJob's entrypoint (GRPO)",
        "RL_CPU_PROFILE",
        "rl.log",
        "RL",
    )
    run_job(
        job,
        rayjob,
        run,
        on_record=on_record,
        succeeded=lambda result: (result or {}).get("status") == "succeeded",
    )
    outcome.rewards = records.rewards
    result = outcome.trained or {}
    console.print(
        f"RL {result.get('status')} in {outcome.train_seconds:.0f}s: step "
        f"{result.get('final_step')}, policy version "
        f"{console_out.fmt(result.get('policy_version'), '.0f')}, export "
        f"{result.get('export_path')}",
        highlight=False,
        soft_wrap=True,
    )
    export = result.get("export_path")
    if export != outcome.export or not Path(str(export), "config.json").is_file():
        raise LocalRunError(
            f"the RL job wrote no Hugging Face export at {outcome.export} "
            f"(its export_path: {export})"
        )


@dataclass
class Picked:
    """The served question, its reference answer and the starting policy's greedy answer."""

    question: str
    answer: str
    start: str


QUESTION_FILE = "served-question.txt"


def _pick_and_serve(run: LocalRun, warm: str, start_serving: Any) -> tuple[Picked, Any]:
    """Serving started (its replica waits for the RL job's export), then the served question
    picked (:func:`pick_question`, from transformers' greedy answers of the warm start and
    the probability it gives each right answer) and handed to it in a file, which it reads
    once ready: the replica's start does not wait for the pick."""
    from workloads.rl.facts_task import prompts

    question_file = run.run_dir / QUESTION_FILE
    config = {"spec": {"serveConfigV2": yaml.safe_dump(serve_config(str(run.outcome.export)))}}
    serving = start_serving(run, config, keep=False, trained=[SERVED_ID], wait_for_model=True,
                            config_from=warm, prompt_file=question_file)  # fmt: skip
    try:
        facts = prompts()
        picked = pick_question(facts, starting_answers(warm, facts))
        run.outcome.question, run.outcome.learned = picked.question, picked.answer
        partial_file = question_file.with_suffix(".part")
        write_new(partial_file, picked.question + "\n")
        partial_file.rename(question_file)  # whole: the reader never sees half a question
    except BaseException:
        serving.stop()  # nothing else holds it yet
        raise
    return picked, serving


@dataclass(frozen=True)
class StartingAnswer:
    """The starting policy on one fact: its greedy reply, and the log-probability it gives
    the right answer (how often sampling gives it, which is what GRPO can raise)."""

    reply: str
    answer_logprob: float


def pick_question(facts: list[dict[str, str]], start: dict[str, StartingAnswer]) -> Picked:
    """Of the facts the starting policy answers wrong (exact match of its greedy reply), the
    one whose right answer it finds likeliest: the fact it samples right most often, whose
    group GRPO raises first. Chosen before any RL step, not by how the run ends; the first
    fact when every one is right."""
    wrong = [
        f
        for f in facts
        if f["prompt"] in start
        and not exact_match(completion=start[f["prompt"]].reply, answer=f["answer"])
    ]
    if not wrong:
        first = facts[0]
        known = start.get(first["prompt"])
        return Picked(first["prompt"], first["answer"], known.reply if known else "")
    nearest = max(wrong, key=lambda f: start[f["prompt"]].answer_logprob)  # first of ties
    return Picked(nearest["prompt"], nearest["answer"], start[nearest["prompt"]].reply)


def starting_answers(export: str, facts: list[dict[str, str]]) -> dict[str, StartingAnswer]:
    """``{question: StartingAnswer}`` from an export, by transformers (in a subprocess: torch
    stays out of this process; workloads/train/generate.py)."""
    answers = [arg for f in facts for arg in ("--answer", f["answer"])]
    done = subprocess.run(
        [sys.executable, "-m", "workloads.train.generate", export,
         *[f["prompt"] for f in facts], *answers, "--max-new-tokens", "8"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0:
        raise LocalRunError(f"transformers could not answer from {export}: {done.stderr[-800:]}")
    rows = (line.split("\t") for line in done.stdout.splitlines())
    return {r[0]: StartingAnswer(r[1], float(r[2])) for r in rows if len(r) == 3}


class Background:
    """``work`` in a thread; :meth:`result` waits for it and returns what it returned, or
    raises what it raised. :meth:`stop` stops what it started (a ServingRun), when it did."""

    def __init__(self, work: Callable[[], tuple[Picked, Any]]) -> None:
        self._value: tuple[Picked, Any] | None = None
        self._error: BaseException | None = None

        def run() -> None:
            try:
                self._value = work()
            except BaseException as err:  # raised in the caller's thread by result()
                self._error = err

        self._thread = threading.Thread(target=run, name="park-local-rl-serve", daemon=True)
        self._thread.start()

    def result(self) -> tuple[Picked, Any]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._value is not None
        return self._value

    def stop(self) -> None:
        self._thread.join()
        if self._value is not None:
            self._value[1].stop()


def _share_right(probe: list[dict[str, Any]]) -> float:
    """The share of a probe's answers the rewards scored right (> 0)."""
    return sum(float(p.get("reward") or 0) > 0 for p in probe) / max(len(probe), 1)


def _report(run: LocalRun, records: RLRecords, picked: Picked) -> None:
    """The demo's lines: the task, accuracy before → after, the served answer against the
    starting policy's, the reward."""
    from workloads.rl.facts_task import TASK

    console, outcome = run.console, run.outcome
    reply = (outcome.reply or "").strip()
    for line in (
        f"task: {TASK} (workloads/rl/facts_task.py; the policy: the tiny Llama fine-tuned "
        f"{WARM_START_STEPS} steps on them, stopped early)",
        accuracy_line(records.accuracy),
        answers_line(picked, reply),
        reward_line(records.rewards),
    ):
        console.print(line, highlight=False, soft_wrap=True)


def accuracy_line(accuracy: list[float]) -> str:
    """``accuracy  <before> → <after>``: the share of the facts answered right (greedy), by
    the starting policy (the probe) and the last evaluation, with the evaluations between."""
    if len(accuracy) < 2:
        return "accuracy  n/a (the job reported no probe or no evaluation)"
    every = " ".join(f"{a:.2f}" for a in accuracy)
    return (
        f"accuracy  {accuracy[0]:.2f} → {accuracy[-1]:.2f}  {console_out.sparkline(accuracy)}  "
        f"(all {FACTS} facts, greedy, exact match: the starting policy, then every "
        f"{EVAL_EVERY} steps: {every})"
    )


def answers_line(picked: Picked, reply: str) -> str:
    """``answer  <start> → <served>``: exact match of the starting policy's greedy answer to
    the served question and of the served final policy's (greedy too), 0 or 1."""
    before = exact_match(completion=picked.start, answer=picked.answer)
    after = exact_match(completion=reply, answer=picked.answer)
    return (
        f"answer  {before:.0f} → {after:.0f}  (asked {picked.question!r}, the answer "
        f"{picked.answer!r}: the starting policy said {picked.start!r}, the served final "
        f"policy {reply!r})"
    )


def reward_line(rewards: list[float]) -> str:
    """``reward  <first> → <last>``: the mean reward of the first and the last step (0..1)."""
    if not rewards:
        return "reward  n/a"
    return (
        f"reward  {rewards[0]:.2f} → {rewards[-1]:.2f}  {console_out.sparkline(rewards)}  "
        "(mean of a step's sampled answers)"
    )


def step_line(m: dict[str, Any]) -> str:
    """One RL step's metrics as a line (what the step did not report, left out: the KL
    without a reference model, the accuracy between evaluations)."""

    def f(key: str, spec: str = ".2f") -> str:
        return console_out.fmt(m.get(key), spec)

    def some(label: str, key: str, spec: str) -> str:
        return f"  {label} {f(key, spec)}" if m.get(key) is not None else ""

    return (
        f"step {m.get('step')}  reward {f('reward_mean', '.3f')}±{f('reward_std', '.3f')}"
        f"{some('accuracy', 'eval_reward', '.2f')}{some('kl', 'kl', '.4f')}  "
        f"len {f('response_length', '.1f')}  rollout {f('rollout_tokens_per_s', '.0f')} tok/s  "
        f"learner {f('step_s')}s  publish {f('publish_s')}s  sync {f('sync_s')}s "
        f"{megabytes(m.get('sync_bytes'))}  staleness {f('staleness_max', '.0f')}  "
        f"|Δlogp| {f('mismatch_abs_logp', '.4f')}  IS {f('is_weight', '.3f')}"
    )


def megabytes(value: Any) -> str:
    """Bytes as MB for the step line ("n/a" when absent)."""
    return "n/a" if value is None else f"{float(value) / 1e6:.1f}MB"


def serve_config(export: str) -> dict[str, Any]:
    """A serveConfigV2 serving the exported policy: the rl stack declares no serving, so this
    is the one Ray Serve LLM application a `park:serving` model with this source renders to,
    waiting for the export (workloads/serve/cpu_profile.py then makes its CPU changes, printed;
    Ray's engine start allows 3,600 s, above the wait's bound here)."""
    llm = {
        "model_loading_config": {"model_id": SERVED_ID, "model_source": export},
        "engine_kwargs": {"max_model_len": 256},
        "deployment_config": {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}},
        # the job writes the export while the replica starts: it waits for the marker the
        # export writes last (workloads/serve/wait.py), as a served training run's does
        "callback_config": wait_callback(
            ModelWait(int(RL_TIMEOUT_S), protocol.EXPORT_MARKER, "the RL job (its final policy)")
        ),
    }
    app = {
        "name": "llm",
        "route_prefix": "/",
        "import_path": "ray.serve.llm:build_openai_app",
        "args": {"llm_configs": [llm]},
    }
    return {"applications": [app]}
