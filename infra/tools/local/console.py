"""What `park local` prints: the CPU changes, training progress, and the closing summary."""

from __future__ import annotations

import time
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


def fmt(value: Any, spec: str = ",.1f") -> str:
    return "n/a" if value is None else format(value, spec)


def metrics_line(data: dict[str, Any], total_steps: int) -> str:
    mfu = data.get("mfu")
    return (
        f"step {data.get('step')}/{total_steps}  loss {fmt(data.get('loss'), '.4f')}  "
        f"tokens/s {fmt(data.get('tokens_per_s'))} "
        f"({fmt(data.get('tokens_per_s_per_worker'))}/worker)  "
        f"mfu {'n/a' if mfu is None else f'{mfu:.1%}'}"
    )


def waited_line(record: dict[str, Any]) -> str:
    """A PARK_WAITED record (workloads/ready.py) as one line."""
    return (
        f"{record.get('who')} waited {fmt(record.get('seconds'), '.1f')}s for "
        f"{record.get('marker')} in {record.get('folder')}"
    )


def changes(console: Console, title: str, lines: list[str]) -> None:
    console.print(title, highlight=False)
    for change in lines:
        console.print(f"  - {escape(change)}", highlight=False, soft_wrap=True)


def summary(
    console: Console, outcome: Outcome, ray: LocalRay, run_dir: Path, *, keep: bool
) -> None:
    console.rule("3. summary")
    table = Table(show_header=False, box=None)
    table.add_column("what", style="bold")
    table.add_column("")
    table.add_row("Ray", f"local head {ray.gcs_address}, dashboard {ray.dashboard_url}")
    if outcome.trained is not None:
        result = outcome.trained
        metrics = outcome.last_metrics or {}
        grpo = result.get("objective") == "grpo"  # park local rl: reward, not loss
        table.add_row(
            "RL (GRPO)" if grpo else "training",
            f"job {outcome.train_job} {result.get('status')} in {outcome.train_seconds:.0f}s: "
            f"{result.get('num_workers')} {result.get('accelerator')} workers, "
            f"{result.get('strategy')}, step {result.get('final_step')}, "
            + (
                f"reward {fmt(result.get('reward_first'), '.2f')} → "
                f"{fmt(result.get('reward_last'), '.2f')}"
                if grpo
                else f"loss {fmt(result.get('final_loss'), '.4f')}, "
                f"{fmt(metrics.get('tokens_per_s'))} tokens/s"
            ),
        )
        table.add_row("checkpoint", str(result.get("checkpoint_path")))
        if outcome.export:
            table.add_row("export", f"{outcome.export} (a Hugging Face folder)")
    if outcome.endpoint is not None:
        table.add_row("endpoint", f"{outcome.endpoint} (OpenAI API)")
        if outcome.reply is not None and outcome.question is not None:
            table.add_row("prompt", f"{outcome.question!r} (from the training data)")
            same = (
                "= transformers' greedy reply" if outcome.reply.strip() == outcome.reference else ""
            )
            table.add_row("completion", f"{outcome.reply!r} (the trained export) {same}".rstrip())
        else:
            reply = (outcome.smoke or "").removeprefix(f"{SMOKE_MARKER}chat completion ")
            table.add_row("chat completion", f"{reply} (tiny model, random weights)")
        if outcome.serve_seconds is not None:
            table.add_row("serving ready", f"in {outcome.serve_seconds:.0f}s")
    staging = outcome.staging
    if staging is not None and staging.seconds is not None:
        table.add_row(
            "staged",
            f"{staging.repo} from the local hub into {staging.local} in {staging.seconds:.1f}s "
            "(started when the trainer waited for it)",
        )
    for record in outcome.waits:
        table.add_row("waited", waited_line(record))
    table.add_row("changed for CPU", f"{len(outcome.changes)} change(s), listed above")
    table.add_row("elapsed", f"{time.monotonic() - outcome.started:.0f}s since park started")
    table.add_row("logs", str(run_dir))
    table.add_row("next", "Ctrl-C stops serving and Ray" if keep else "stopping everything")
    console.print(table)


def bucket_calls(console: Console, bucket: EmulatedBucket) -> None:
    """Each workload's bucket permissions, as the IAM gate saw its calls (all granted)."""
    for workload in sorted({r.workload for r in bucket.log.records}):
        used = sorted(bucket.log.permissions(workload))
        console.print(
            f"bucket calls of {workload}: {', '.join(used)} (granted by {', '.join(bucket.roles)})",
            highlight=False,
            soft_wrap=True,
        )
