"""What `park validate`, `park render` and `park cost` print about park:rl: both sides of the
job as the plan resolved them (infra.resolve.rl), the learner's fit and the engines', and the
weight sync per step (as the job runs it, against the fp32-folder scheme it replaced)."""

from __future__ import annotations

from rich.table import Table

from infra.resolve import StackPlan
from infra.resolve.rl import SYNC_RATES
from infra.resolve.types import SyncEstimate

GIB = 1024**3
GB = 1e9


def sync_line(sync: SyncEstimate) -> str:
    """The weight sync of one step, in a sentence (the rl table's caption)."""
    seconds = "" if sync.seconds is None else f", ~{sync.seconds:.1f} s"
    return (
        f"weight sync per step: {sync.version_bytes / GB:.2f} GB bf16 to each of "
        f"{sync.rollout_hosts} rollout host(s) = {sync.bytes_per_step / GB:.2f} GB{seconds} "
        f"through Ray's object store; before: fp32 {sync.legacy_written / GB:.2f} GB written + "
        f"{sync.legacy_read / GB:.2f} GB read ({sync.engines} engine(s) x TP "
        f"{sync.tensor_parallel}, one after another): "
        f"{sync.legacy_bytes_per_step / sync.bytes_per_step:.1f}x the bytes. Rollout host "
        f"memory for it: {sync.host_memory_bytes / GB:.1f} GB. Rates: {SYNC_RATES}"
    )


def rl_table(plan: StackPlan) -> Table | None:
    rl = plan.rl
    if rl is None:
        return None
    spec, rollout = rl.spec, rl.rollout
    table = Table(
        title=f"rl: {spec.model}, {spec.prompts_per_step} prompts x {spec.group_size} "
        f"completions per step, {rl.seq_len}-token sequences",
        caption=None if rl.sync is None else sync_line(rl.sync),
    )
    for column in ("side", "pool", "layout", "per chip (GiB)", "fits"):
        table.add_column(column)
    learner, engine = rl.fit, rollout.fit
    sides = {
        ("learner", rl.learner.name): (
            f"{spec.strategy} on {rl.workers} chips, micro-batch {rl.micro_batch} x "
            f"{rl.accumulation_steps}",
            learner,
            learner and f"{learner.total_bytes / GIB:.1f} of {learner.usable_bytes / GIB:.2f}",
        ),
        ("rollout", rollout.pool_name): (
            f"{rollout.engines} vLLM engine(s) at TP {rollout.tensor_parallel} "
            f"(allowed {', '.join(map(str, rollout.options))}), context {rollout.max_model_len}",
            engine,
            engine and f"weights {engine.weights_gib:.2f}, KV for {engine.sequences} sequences",
        ),
    }
    for (side, pool), (layout, fit, estimate) in sides.items():
        fits = "?" if fit is None else "yes" if fit.fits else "NO"
        table.add_row(side, pool, layout, "not estimated" if fit is None else str(estimate), fits)
    return table
