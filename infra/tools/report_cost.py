"""What `park cost` prints. First what the stack costs left up, per month, then everything up,
idle, a run's cost and each pool's price in lines of at most 80 columns (`summary`); with
`--details`, per pool and capacity type, the totals and the prices' sources (`cost`: a table
where the terminal is wide, one block per pool where it is not). infra/tools/cost.py computes
every figure; infra/tools/report.py prints the rest of the CLI's output.
"""

from __future__ import annotations

import textwrap
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from infra.resolve import StackPlan
    from infra.tools.cost import StackCost


def _money(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"${value:,.2f}" if value >= 0.995 or value == 0 else f"${value:,.3f}"


WIDE = 120  # below this many columns the per-pool table is printed as one block per pool
NARROW = 80  # the summary's lines fit this, whatever the terminal


def _lines(out: Console, text: str, indent: str = "") -> None:
    """`text` wrapped at words to the summary's width: nothing cut, no ellipsis."""
    width = max(40, min(out.width, NARROW))
    for line in textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  "):
        out.print(escape(line), highlight=False, soft_wrap=True)


def rl_total(result: StackCost) -> float | None:
    """One RL run's cost, learner and rollout pools together (None: a pool has no price)."""
    if result.rl_run is None:
        return None
    costs = [run.cost for run in result.rl_run]
    return None if None in costs else sum(c for c in costs if c is not None)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _run_line(result: StackCost) -> list[str]:
    lines = []
    run = result.training_run
    if run is not None:
        lines.append(
            f"one training run: {_money(run.cost)} ({run.steps:,} steps x {run.step_seconds:g} s "
            f"on {run.chips} chips at {run.capacity}, {run.hours:.2f} h)"
        )
    if result.rl_run is not None:
        parts = [f"{run.chips} chips at {run.capacity} {_money(run.cost)}" for run in result.rl_run]
        lines.append(
            f"one RL run: {_money(rl_total(result))} ({result.rl_run[0].steps:,} steps, "
            f"{result.rl_run[0].hours:.2f} h; learner {parts[0]}, rollout {parts[1]})"
        )
    return lines


def show(result: StackCost, plan: StackPlan, out: Console, *, details: bool) -> None:
    """`park cost`: the summary, or with --details every figure, the sources and the fits."""
    if not details:
        summary(result, out)
        return
    from infra.tools import report

    cost(result, out)
    report.fit_tables(plan, out)


def summary(result: StackCost, out: Console) -> None:
    """Cost first: what the stack costs left up (idle plus the serving slices that stay up),
    per month then per hour; then everything up, idle, a run, each pool. Fits 80 columns."""
    from infra.tools.cost import HOURS_PER_MONTH

    def month(per_hour: float | None) -> str:
        return "n/a" if per_hour is None else f"${per_hour * HOURS_PER_MONTH:,.0f}"

    left = result.serving_floor_per_hour
    out.print(
        f"[bold]{escape(result.stack)} left up: {month(left)}/month[/] ({_money(left)}/h)",
        highlight=False,
        soft_wrap=True,
    )
    _lines(out, f"idle + {result.serving_floor_why}", "  ")
    rows = [
        ("everything up", result.full_per_hour, "while every slice of every pool runs"),
        ("idle", result.idle_per_hour, "every autoscaled TPU pool at 0 nodes"),
    ]
    for label, per_hour, why in rows:
        _lines(out, f"{label}: {month(per_hour)}/month ({_money(per_hour)}/h), {why}")
    for line in _run_line(result):
        _lines(out, line)
    out.print(f"pools at full size, at their capacity type, {escape(result.region)}:")
    for pool in result.pools:
        shape = (
            f"{pool.slices} x {pool.topology} ({_count(pool.hosts, 'host')}, {pool.chips} chips)"
            if pool.kind == "tpu"
            else f"up to {pool.hosts} nodes"
        )
        _lines(
            out,
            f"{pool.name}: {_money(pool.full_per_hour)}/h, {pool.machine_type} {shape}, "
            f"{pool.capacity}",
            "  ",
        )
        if pool.band is not None:
            rungs = " -> ".join(f"{c} {_money(v)}/h" for c, v in pool.rungs)
            _lines(
                out,
                f"ladder {rungs}; running: {_money(pool.band[0])}/h (first rung) to "
                f"{_money(pool.band[1])}/h (last), reservations billed even idle",
                "    ",
            )
    for line in result.missing:
        _lines(out, f"no price: {line}")
    _lines(
        out,
        "List prices, not a quote (infra/data/prices.yaml, or park:prices). "
        f"park cost {result.stack} --details: every capacity type, the sources, the fits.",
    )


def _pool_blocks(result: StackCost, out: Console) -> None:
    """The per-pool table as one block per pool, for a narrow terminal: nothing cut."""
    from infra.tools.cost import SHOWN_CAPACITY_TYPES

    out.print(
        f"stack {escape(result.stack)} ({escape(result.region)}): per pool at full size, USD/h"
    )
    for pool in result.pools:
        shape = (
            f"{pool.slices} x {pool.topology}, {pool.hosts} hosts, {pool.chips} chips, "
            f"{pool.chip_hours_per_hour} chip-h/h"
            if pool.kind == "tpu"
            else f"up to {pool.hosts} nodes"
        )
        _lines(out, f"{pool.name}: {pool.machine_type} {shape}")
        prices = []
        for capacity in SHOWN_CAPACITY_TYPES:
            mark = capacity == ("flex-start" if pool.capacity == "queued" else pool.capacity)
            prices.append(
                f"{capacity} {_money(pool.by_capacity.get(capacity))}{'*' if mark else ''}"
            )
        _lines(out, ", ".join([*prices, f"idle {_money(pool.idle_per_hour)}"]), "  ")
    out.print("* = the pool's configured capacity type")


def cost(result: StackCost, out: Console) -> None:
    """`park cost --details`: every figure and the prices' sources."""
    if out.width < WIDE:
        _pool_blocks(result, out)
    else:
        _pool_table(result, out)
    _totals_and_sources(result, out)


def _pool_table(result: StackCost, out: Console) -> None:
    from infra.tools.cost import SHOWN_CAPACITY_TYPES

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


def _totals_and_sources(result: StackCost, out: Console) -> None:
    from infra.tools.cost import HOURS_PER_MONTH, SHOWN_CAPACITY_TYPES, used_sources

    tpu = [p for p in result.pools if p.kind == "tpu"]
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
        total = rl_total(result)
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
