"""The stack-file half of the `park` command line: which file a STACK names, the console its
output goes to, and a stack's problems printed instead of raised. Shared by infra/tools/cli.py
and the commands registered from their own modules (report_preflight, report_tpus), so that none
of those imports the CLI module that registers it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from infra.schema.errors import ConfigError
from infra.schema.read import StackFileError
from infra.schema.safe import one_line
from infra.schema.secrets import scrub
from infra.tools import report

if TYPE_CHECKING:
    from infra.resolve import StackPlan

# Not a terminal (CI, tests, pipes): wide enough that a config key never wraps mid-word.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


def shown(value: object) -> str:
    """Anything from the stack or the command line, as it may reach a terminal: control
    characters escaped (a stack or file name holding an escape sequence is printed as text),
    Rich markup escaped."""
    return escape(one_line(str(value)))


def stack_dirs() -> list[Path]:
    """Where `STACK` is looked up: ./stacks first, then the stacks/ beside the installed code.

    The second makes `park local dev` work from any directory with the editable install (the
    repo's own stacks/). A wheel does not ship stacks/; there, pass --config-file.
    """
    beside_package = Path(__file__).resolve().parents[2] / "stacks"
    dirs = [Path.cwd() / "stacks"]
    if beside_package.resolve() != dirs[0].resolve():
        dirs.append(beside_package)
    return dirs


def resolve_stack_file(stack: str, config_file: Path | None) -> Path:
    """The stack file to read, or exit 2 saying where we looked."""
    if config_file is not None:
        if not config_file.is_file():
            err_console.print(f"[red]error:[/] no stack file at {shown(config_file)}")
            raise typer.Exit(2)
        return config_file
    looked = []
    for directory in stack_dirs():
        path = directory / f"Pulumi.{stack}.yaml"
        if path.is_file():
            return path
        looked.append(str(path))
    files = [p.name for d in stack_dirs() for p in d.glob("Pulumi.*.yaml")]
    known = sorted({name[len("Pulumi.") : -len(".yaml")] for name in files})
    err_console.print(
        f"[red]error:[/] no stack {shown(repr(stack))}: looked at {shown(', '.join(looked))}. "
        f"Known stacks: {shown(', '.join(known) or 'none')}. Or pass --config-file PATH."
    )
    raise typer.Exit(2)


@contextmanager
def stack_errors(out: Console = err_console) -> Iterator[None]:
    """A stack that cannot be read or planned: its problems printed, exit 1."""
    try:
        yield
    except ConfigError as err:
        report.config_error(err, out)
        raise typer.Exit(1) from None
    except StackFileError as err:
        shown = one_line(scrub(str(err)))
        err_console.print(f"[red]error:[/] {escape(shown)}", soft_wrap=True)
        raise typer.Exit(1) from None


def plan_of(
    path: Path, stack: str, esc_config: Path | None, out: Console = err_console
) -> StackPlan:
    from infra.stack import from_file

    with stack_errors(out):
        return from_file(path, stack, esc_config)
