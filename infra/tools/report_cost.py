"""What `park cost` prints: per pool at full size, the stack's totals, a training run's and an
RL run's cost (infra/tools/cost.py computes every figure; infra/tools/report.py prints the
rest of the CLI's output).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from infra.tools.cost import StackCost


def _money(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"${value:,.2f}" if value >= 0.995 or value == 0 else f"${value:,.3f}"


def cost(result: StackCost, out: Console) -> None:
    from infra.tools.cost import HOURS_PER_MONTH, SHOWN_CAPACITY_TYPES, used_sources

    table = Table(
        title=f"stack {result.stack} ({result.region}): per pool at full size, USD per hour",
        caption="* = the pool's configured capacity type",
    )
    for column in ("pool", "machine type", "topology", "slices", "hosts", "chips", "chip-h/h"):
        table.add_column(column, justify="left" if column in ("pool", "machine type") else "right")
    for capacity in SHOWN_CAPACITY_TYPES:
        table.add_column(capacity, justify="right")
    table.add_column("idle", justify="right")
    for pool in result.pools:
        cells = []
        for capacity in SHOWN_CAPACITY_TYPES:
            mark = capacity == ("flex-start" if pool.capacity == "queued" else pool.capacity)
            value = _money(pool.by_capacity.get(capacity))
            cells.append(f"[bold]{value}*[/]" if mark else value)
        table.add_row(
            pool.name,
            pool.machine_type,
            pool.topology or "-",
            str(pool.slices) if pool.kind == "tpu" else "-",
            str(pool.hosts) if pool.kind == "tpu" else f"≤{pool.hosts}",
            str(pool.chips) if pool.chips else "-",
            str(pool.chip_hours_per_hour) if pool.kind == "tpu" else "-",
            *cells,
            _money(pool.idle_per_hour),
        )
    tpu = [p for p in result.pools if p.kind == "tpu"]
    table.add_row(
        "total TPU",
        "",
        "",
        str(sum(p.slices for p in tpu)),
        str(sum(p.hosts for p in tpu)),
        str(sum(p.chips for p in tpu)),
        str(sum(p.chips for p in tpu)),
        *[""] * len(SHOWN_CAPACITY_TYPES),
        "",
        style="bold",
    )
    out.print(table)

    totals = Table(title="totals at the configured capacity types", show_header=True)
    totals.add_column("state")
    totals.add_column("USD / hour", justify="right")
    totals.add_column(f"USD / {HOURS_PER_MONTH} h", justify="right")
    totals.add_column("what runs")
    idle_parts = ", ".join(
        f"{p.name} {_money(p.idle_per_hour)} ({p.idle_why})"
        for p in result.pools
        if p.idle_per_hour
    )
    rows = [
        ("everything up", result.full_per_hour, "every slice of every pool, CPU pool at max"),
        (
            "idle",
            result.idle_per_hour,
            f"cluster fee {_money(result.cluster_per_hour)}; {idle_parts or 'nothing else'}; "
            "autoscaled TPU pools at 0 nodes",
        ),
        ("serving floor", result.serving_floor_per_hour, f"idle + {result.serving_floor_why}"),
    ]
    for label, per_hour, why in rows:
        month = None if per_hour is None else per_hour * HOURS_PER_MONTH
        totals.add_row(label, _money(per_hour), _money(month), why)
    out.print(totals)

    run = result.training_run
    if run is not None:
        out.print(
            f"one training run: {run.steps} steps x {run.step_seconds:g} s/step "
            f"(park:training.estimatedStepSeconds) = {run.hours:.2f} h on {run.chips} chips "
            f"= {run.chip_hours:,.1f} chip-hours at {run.capacity}: [bold]{_money(run.cost)}[/]"
            + (f" ({run.note})" if run.note else ""),
            highlight=False,
        )
    if result.rl_run is not None:
        learner, rollout = result.rl_run
        costs = (learner.cost, rollout.cost)
        total = None if costs[0] is None or costs[1] is None else costs[0] + costs[1]
        out.print(
            f"one RL run: {learner.steps} steps x {learner.step_seconds:g} s/step "
            f"(park:rl.estimatedStepSeconds) = {learner.hours:.2f} h; learner {learner.note} "
            f"{learner.chips} chips at {learner.capacity} {_money(learner.cost)} + rollout "
            f"{rollout.note} {rollout.chips} chips at {rollout.capacity} {_money(rollout.cost)}"
            f" = [bold]{_money(total)}[/]",
            highlight=False,
        )
    for line in result.missing:
        out.print(f"[yellow]no price:[/] {escape(line)}", soft_wrap=True)

    sheet = result.prices
    used = used_sources(result)
    out.print("prices used:", highlight=False)
    for generation in sorted({p.generation for p in tpu}):
        caps = sheet.tpu.get(generation, {})
        figures = ", ".join(
            f"{cap} ${caps[cap].value:g}" for cap in SHOWN_CAPACITY_TYPES if cap in caps
        )
        out.print(f"  {generation} per chip-hour in {sheet.region}: {figures}", highlight=False)
        for cap in SHOWN_CAPACITY_TYPES:
            price = caps.get(cap)
            if price is not None:
                basis = price.basis or f"from {price.source}"
                out.print(f"    {cap}: {escape(basis)}", highlight=False, soft_wrap=True)
    if sheet.override_source:
        out.print(
            f"  park:prices ({escape(sheet.override_source)}): the figures the stack sets",
            highlight=False,
            soft_wrap=True,
        )
    for key in sorted(used - {"park:prices"}):
        source = sheet.sources.get(key, {})
        out.print(
            f"  infra/data/prices.yaml \\[{escape(key)}]: {source.get('url', '?')} "
            f"({source.get('date', '?')})",
            highlight=False,
            soft_wrap=True,
        )
    generations = {p.generation for p in tpu}
    unmatched = [g for g, ok in sheet.region_matched.items() if not ok and g in generations]
    if unmatched:
        out.print(
            f"  [yellow]no {', '.join(unmatched)} row for {sheet.region}:[/] used the "
            "'starting at' list price, which may be the cheapest region",
            soft_wrap=True,
        )
    out.print(
        "List prices, not a quote: they vary by region and over time, exclude taxes, disks, "
        "network and storage, and your discounts. Set park:prices for your own.",
        highlight=False,
    )
