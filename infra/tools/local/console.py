"""What `park local` prints: the sections in the order they print, training progress, and the
closing summary (last, with each workload's bucket calls in it)."""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from workloads.protocol import SMOKE_MARKER

if TYPE_CHECKING:
    from infra.tools.local.bucket import EmulatedBucket
    from infra.tools.local.outcome import Outcome
    from infra.tools.local.ray_head import LocalRay

_NUMBERED = re.compile(r"^\d+\.\s*")  # a title's own number ("1. training")
# Eight heights, lowest first: one character per value.
SPARKS = "▁▂▃▄▅▆▇█"


def fmt(value: Any, spec: str = ",.1f") -> str:
    return "n/a" if value is None else format(value, spec)


def sparkline(values: Sequence[float | None]) -> str:
    """One character per value, its height the value's place between the least and the most
    (missing values left out; all equal: a flat line), so a curve reads at a glance."""
    seen = [float(v) for v in values if v is not None]
    if not seen:
        return ""
    low, high = min(seen), max(seen)
    top = len(SPARKS) - 1
    if high == low:
        return SPARKS[top // 2] * len(seen)
    return "".join(SPARKS[round((v - low) / (high - low) * top)] for v in seen)


def curve(values: Sequence[float], spec: str) -> str:
    """``<first> <sparkline> <last>``: a series from its first value to its last."""
    return f"{format(values[0], spec)} {sparkline(values)} {format(values[-1], spec)}"


def section(console: Console, outcome: Outcome, title: str) -> None:
    """A numbered rule: sections are numbered in the order they print (a title's own leading
    number, from a caller that numbered it itself, is replaced)."""
    outcome.sections += 1
    console.rule(f"{outcome.sections}. {_NUMBERED.sub('', title)}")


def metrics_line(data: dict[str, Any], total_steps: int, *, warmup: bool = False) -> str:
    """A PARK_METRICS record as one line; what the record lacks (MFU on CPU) is left out.
    `warmup`: the first window, whose throughput includes the first step's warm-up."""
    parts = [f"step {data.get('step')}/{total_steps}", f"loss {fmt(data.get('loss'), '.4f')}"]
    if data.get("tokens_per_s") is not None:
        per_worker = data.get("tokens_per_s_per_worker")
        parts.append(
            f"tokens/s {fmt(data['tokens_per_s'])}"
            + ("" if per_worker is None else f" ({fmt(per_worker)}/worker)")
            + (" (warm-up)" if warmup else "")
        )
    if data.get("mfu") is not None:
        parts.append(f"mfu {data['mfu']:.1%}")
    return "  ".join(parts)


def short_path(path: Any, root: Path | None) -> str:
    """`path` relative to the run folder `root` when it is inside it (the summary names that
    folder once), else as it is."""
    text = str(path)
    if root is not None:
        prefix = f"{str(root).rstrip('/')}/"
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def waited_line(record: dict[str, Any], root: Path | None = None) -> str:
    """A PARK_WAITED record (workloads/ready.py) as one line (its folder shortened to the run
    folder `root`, when given)."""
    return (
        f"{record.get('who')} waited {fmt(record.get('seconds'), '.1f')}s for "
        f"{record.get('marker')} in {short_path(record.get('folder'), root)}"
    )


def changes(console: Console, title: str, lines: list[str]) -> None:
    console.print(title, highlight=False)
    for change in lines:
        console.print(f"  - {escape(change)}", highlight=False, soft_wrap=True)


def curl_command(endpoint: str, model: str, prompt: str) -> str:
    """The exact command that asks the endpoint `prompt` as an OpenAI chat completion."""
    import json

    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt}]})
    return (
        f"curl -s {endpoint}/chat/completions -H 'Content-Type: application/json' "
        f"-d {shlex.quote(body)}"
    )


def summary(
    console: Console,
    outcome: Outcome,
    ray: LocalRay,
    run_dir: Path,
    *,
    keep: bool,
    stopped: bool = False,
) -> None:
    """The closing summary (`stopped`: Ray and the bucket are already down). Paths inside the
    run folder are shown relative to it; the table wraps at the terminal's width."""
    outcome.summarized = True
    section(console, outcome, "summary")
    table = Table(show_header=False, box=None)
    table.add_column("what", style="bold", no_wrap=True)
    table.add_column("", overflow="fold")

    def path(value: Any) -> str:
        return short_path(value, run_dir)

    table.add_row("run folder", f"{run_dir} (logs; paths below are in it)")
    table.add_row(
        "Ray",
        f"local head {ray.gcs_address}, dashboard {ray.dashboard_url}"
        + (" (stopped)" if stopped else ""),
    )
    if outcome.stand_in:
        table.add_row("model", outcome.stand_in)
    if outcome.trained is not None:
        _training_rows(table, outcome, path)
    _serving_rows(table, outcome)
    staging = outcome.staging
    if staging is not None and staging.seconds is not None:
        table.add_row(
            "staged",
            f"{staging.repo} from the local hub into {path(staging.local)} in "
            f"{staging.seconds:.1f}s (started when the trainer waited for it)",
        )
    for record in outcome.waits:
        table.add_row("waited", waited_line(record, run_dir))
    if outcome.bucket is not None:
        _bucket_rows(table, outcome.bucket, path)
    table.add_row("changed for CPU", f"{len(outcome.changes)} change(s), listed above")
    table.add_row("elapsed", f"{time.monotonic() - outcome.started:.0f}s since park started")
    table.add_row("next", _next(outcome, keep=keep, stopped=stopped))
    console.print(table)


def _training_rows(table: Table, outcome: Outcome, path: Any) -> None:
    result = outcome.trained or {}
    metrics = outcome.last_metrics or {}
    grpo = result.get("objective") == "grpo"  # park local rl: reward, not loss
    speed = metrics.get("tokens_per_s")
    table.add_row(
        "RL (GRPO)" if grpo else "training",
        f"job {outcome.train_job} {result.get('status')} in {outcome.train_seconds:.0f}s: "
        f"{result.get('num_workers')} {result.get('accelerator')} workers, "
        f"{result.get('strategy')}, step {result.get('final_step')}"
        + (
            f", reward {fmt(result.get('reward_first'), '.2f')} → "
            f"{fmt(result.get('reward_last'), '.2f')}"
            if grpo
            else f", loss {fmt(result.get('final_loss'), '.4f')}"
        )
        + ("" if grpo or speed is None else f", {fmt(speed)} tokens/s"),
    )
    if outcome.losses:
        table.add_row("loss", curve(outcome.losses, ".4f"))
    if outcome.rewards:
        table.add_row("reward", curve(outcome.rewards, ".2f"))
    table.add_row("checkpoint", path(result.get("checkpoint_path")))
    if outcome.export:
        table.add_row("export", f"{path(outcome.export)} (a Hugging Face folder)")


def _serving_rows(table: Table, outcome: Outcome) -> None:
    if outcome.endpoint is None:
        return
    ready = "" if outcome.serve_seconds is None else f", ready in {outcome.serve_seconds:.0f}s"
    table.add_row("endpoint", f"{outcome.endpoint} (OpenAI API){ready}")
    # a caller that set only `reply` (one model, unnamed)
    replies = outcome.replies or ({"": outcome.reply} if outcome.reply is not None else {})
    prompt = outcome.question or outcome.prompt
    if prompt is not None and replies:
        learned = " (from the training data)" if outcome.question else ""
        table.add_row("prompt", f"{prompt!r}{learned}")
    elif not replies:
        reply = (outcome.smoke or "").removeprefix(f"{SMOKE_MARKER}chat completion ")
        table.add_row("chat completion", f"{reply} (tiny model, random weights)")
    for model, reply in replies.items():
        named = f"{model}: " if len(replies) > 1 or outcome.question is None else ""
        if model in outcome.trained_models or (not model and outcome.question):
            same = "= transformers' greedy reply" if reply.strip() == outcome.reference else ""
            what = f"(the trained export) {same}".rstrip()
        else:
            source = outcome.sources.get(model)
            what = "(tiny model, random weights" + (
                f", standing in for {source})" if source else ")"
            )
        table.add_row("completion", f"{named}{reply!r} {what}")


def _bucket_rows(table: Table, bucket: EmulatedBucket, path: Any) -> None:
    """The bucket, and each workload's calls as the IAM gate saw them (all granted)."""
    table.add_row(
        "bucket",
        f"gs://{bucket.bucket}: emulated in {path(bucket.folder)}, granting "
        f"{', '.join(bucket.roles) or 'no role'}",
    )
    for workload in sorted({r.workload for r in bucket.log.records}):
        used = sorted(bucket.log.permissions(workload))
        table.add_row("bucket calls", f"{workload}: {_permissions(used)}")


def _permissions(names: list[str]) -> str:
    """`storage.{objects.get, objects.list}`: IAM permissions with their shared service said
    once (all of them, nothing dropped)."""
    services = {n.split(".", 1)[0] for n in names}
    if len(services) != 1 or not all("." in n for n in names):
        return ", ".join(names)
    service = services.pop()
    return f"{service}.{{{', '.join(n.split('.', 1)[1] for n in names)}}}"


def _next(outcome: Outcome, *, keep: bool, stopped: bool) -> str:
    if keep:
        return "Ctrl-C stops serving and Ray (the command to try it follows)"
    done = "stopped everything" if stopped else "stopping everything"
    if outcome.keep_command:
        return f"{done}; `{outcome.keep_command}` keeps Ray and the endpoint up until Ctrl-C"
    return done


def try_it(console: Console, outcome: Outcome) -> None:
    """With --keep: the exact command that asks the endpoint a question of the training data
    (printed whole, unwrapped, to copy)."""
    if outcome.endpoint is None:
        return
    model = next(iter(outcome.trained_models or outcome.replies or [""]), "")
    prompt = outcome.question or outcome.prompt or "Say hello."
    console.print("serving until Ctrl-C; try it:", highlight=False)
    console.print(
        escape(curl_command(outcome.endpoint, model, prompt)), highlight=False, soft_wrap=True
    )
