"""The arguments and options several `park` commands share (infra/tools/cli.py), one each."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

StackArg = Annotated[
    str, typer.Argument(metavar="STACK", help="Stack name: stacks/Pulumi.STACK.yaml.")
]
ConfigFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--config-file", metavar="PATH", help="Read this stack file instead of the named stack's."
    ),
]
EscConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--esc-config",
        metavar="PATH",
        help="The stack imports a Pulumi ESC environment: read its pulumiConfig from PATH "
        "(what `esc env open ENV --format json` prints); the stack file's own keys win.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
ContextOpt = Annotated[
    str | None,
    typer.Option(
        "--context",
        metavar="NAME",
        help="The kubeconfig context of the stack's cluster (default: the current one).",
    ),
]


class Only(StrEnum):
    """What `park local --only` runs."""

    train = "train"
    serve = "serve"
