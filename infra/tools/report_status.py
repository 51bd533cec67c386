"""What `park status` prints: per workload its state and why in a table that fits 80 columns,
the evidence under it, or the same as JSON (infra/tools/status.py decides every state; the
reader, infra/tools/status_read.py, is the only part that talks to the cluster).

Exit status: 0 when every workload runs, waits or starts; 1 when one failed, is unhealthy or
absent, or when the cluster could not be read (one line, no traceback).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from infra.schema.safe import one_line
from infra.tools import status
from infra.tools.status_read import DEFAULT_TIMEOUT_S, ClusterError, Reading, read

if TYPE_CHECKING:
    from infra.tools.render import Rendered

WIDTH = 80
_GOOD = (status.RUNNING, status.SUCCEEDED, status.HEALTHY)
_BUSY = (status.STARTING, status.WAITING, status.PENDING, status.EVICTED)


def _style(state: str) -> str:
    return "green" if state in _GOOD else ("yellow" if state in _BUSY else "red")


def as_json(stack: str, reading: Reading, statuses: tuple[status.Status, ...]) -> dict[str, Any]:
    return {
        "stack": stack,
        "context": reading.context,
        "workloads": [s.as_json() for s in statuses],
    }


def table(stack: str, reading: Reading, statuses: tuple[status.Status, ...], out: Console) -> None:
    """The table, then each workload's evidence, at most 80 columns wide."""
    width = min(out.width, WIDTH)
    title = f"stack {escape(stack)}: context {escape(one_line(reading.context, 60))}"
    grid = Table(title=title, width=width, expand=False)
    grid.add_column("workload", overflow="fold", max_width=28)
    grid.add_column("state", no_wrap=True)
    grid.add_column("why", overflow="fold", ratio=1)
    for found in statuses:
        style = _style(found.state)
        grid.add_row(
            escape(f"{found.kind}/{found.name}"),
            f"[{style}]{found.state}[/]",
            escape(found.why),
        )
    out.print(grid, width=width)
    for found in statuses:
        head = Text(f"{found.kind}/{found.name} (namespace {found.namespace}):", style="bold")
        out.print(head, width=width)
        for line in found.evidence:
            out.print(Padding(Text(line, overflow="fold"), (0, 0, 0, 2)), width=width)


def show(
    rendered: Rendered,
    context: str | None,
    as_json_out: bool,
    out: Console,
    err: Console,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> int:
    """Read the render's workloads from the cluster and print why each runs or waits; the
    exit status."""
    stack = rendered.plan.stack
    found = status.targets(rendered.manifests())
    if not found:
        err.print(f"{escape(stack)}: no RayJob or RayService to report on", highlight=False)
        return 0
    try:
        reading = read(found, context, timeout_s)
    except ClusterError as error:
        message = escape(one_line(str(error), 400))
        err.print(f"[red]park status {escape(stack)}:[/] {message}", soft_wrap=True)
        return 1
    statuses = status.report(reading.observed)
    if as_json_out:
        print(json.dumps(as_json(stack, reading, statuses), indent=2))
    else:
        table(stack, reading, statuses, out)
    return 1 if any(s.state in status.BAD_STATES for s in statuses) else 0
