"""What `park validate`, `park render` and `park cost` print about park:rl: both sides of the
job as the plan resolved them (infra.resolve_rl), the learner's fit and the engines'."""

from __future__ import annotations

from rich.table import Table

from infra.resolve import StackPlan

GIB = 1024**3


def rl_table(plan: StackPlan) -> Table | None:
    rl = plan.rl
    if rl is None:
        return None
    spec, rollout = rl.spec, rl.rollout
    table = Table(
        title=f"rl: {spec.model}, {spec.prompts_per_step} prompts x {spec.group_size} "
        f"completions per step, {rl.seq_len}-token sequences"
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
