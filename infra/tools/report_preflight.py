"""`park preflight STACK`: the command (registered in infra/tools/cli.py), its table (80
columns) and its JSON report, written beside the render (`out/STACK/preflight.json` unless
--out says where; infra.tools.outdir writes it, inside that folder only)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.markup import escape
from rich.table import Table

from infra.schema.safe import one_line
from infra.tools.cli_args import ConfigFileOpt, EscConfigOpt, StackArg
from infra.tools.preflight import (
    FAIL,
    PROMISE,
    REPORT_KIND,
    Finding,
    gather,
    machine_findings,
    report,
    worst,
)

REPORT = "preflight.json"
WIDTH = 80
_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "unknown": "magenta"}
OutOpt = Annotated[
    Path | None,
    typer.Option(metavar="DIR", help="Write preflight.json here (default: out/STACK)."),
]


def table(findings: list[Finding]) -> Table:
    """One row per finding, at most 80 columns wide (the detail wraps)."""
    shown = Table(width=WIDTH, show_lines=False, pad_edge=False)
    shown.add_column("where", max_width=22, overflow="fold")
    shown.add_column("check", max_width=12, overflow="fold")
    shown.add_column("", width=7)
    shown.add_column("detail", overflow="fold", ratio=1)
    for f in findings:
        style = _STYLE.get(f.status, "")
        shown.add_row(
            escape(f.where),
            escape(f.check),
            f"[{style}]{f.status}[/]",
            escape(one_line(f.detail)),
        )
    return shown


def _ours(data: bytes) -> bool:
    try:
        return bool(json.loads(data).get("kind") == REPORT_KIND)
    except (ValueError, AttributeError):
        return False


def write_report(out: Path, data: dict) -> Path:
    from infra.tools.outdir import write_beside

    write_beside(out, REPORT, (json.dumps(data, indent=2) + "\n").encode(), ours=_ours)
    return out / REPORT


def _fail(error: Exception, code: int) -> NoReturn:
    """The command ends on `error`: said on one line on stderr, exit `code`."""
    from infra.tools.cli_stack import err_console

    err_console.print(f"[red]error:[/] {escape(one_line(str(error)))}", soft_wrap=True)
    raise typer.Exit(code) from None


def preflight(
    stack: StackArg,
    out: OutOpt = None,
    config_file: ConfigFileOpt = None,
    esc_config: EscConfigOpt = None,
) -> None:
    """Check, read-only and with your application-default credentials, what the stack's TPU
    capacity ladders can get: per reservation rung that the reservation (block, sub-block)
    exists in the pool's zone with its machine type, how many whole slices are free and the
    sub-block's health; per spot, on-demand, flex-start and queued rung the region's TPU quota;
    and what this machine needs to deploy (Pulumi, gcloud, the GKE auth plugin, Docker with
    BuildKit, credentials). Writes preflight.json beside the render. Exit 1 on a failed check
    or without credentials. No API promises N machines in a zone: quota is permission only."""
    from infra.tools import cli_stack as cli
    from infra.tools.outdir import OutputError
    from infra.tools.preflight_read import NoCredentials, Reader, credentials

    plan = cli.plan_of(cli.resolve_stack_file(stack, config_file), stack, esc_config)
    console = cli.console
    local = machine_findings(
        shutil.which, os.environ, Path.home(), Path.is_file, builds_images=bool(plan.images)
    )
    try:
        reader = Reader(credentials())
    except NoCredentials as missing:
        console.print(table(local))
        _fail(missing, 1)
    findings = gather(plan, reader.get, reader.list_all) + local
    console.print(table(findings))
    console.print(escape(PROMISE), width=WIDTH, highlight=False)
    target = Path("out") / plan.stack if out is None else out
    try:
        written = write_report(target, report(plan, findings))
    except OutputError as error:
        _fail(error, 2)
    console.print(f"wrote {escape(str(written))}", highlight=False)
    if worst(findings) == FAIL:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """`park preflight`, registered on the CLI (infra/tools/cli.py stays one line longer)."""
    app.command(short_help="What the TPU ladders can get: reservations, quota, this machine.")(
        preflight
    )
