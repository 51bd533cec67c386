"""The `park` command line: see a stack work, and what it costs, before `pulumi up`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from infra.config import ConfigError

app = typer.Typer(
    name="park",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    help=(
        "park-gke: PyTorch training and LLM serving on Cloud TPU v6e through Ray on GKE.\n\n"
        "  park render STACK    the stack's resources and Kubernetes manifests, offline\n\n"
        "  park validate STACK  config, plan and manifests against KubeRay's CRD schemas\n\n"
        "  park cost STACK      chips, hosts and $/hour per pool, idle, and per training run\n\n"
        "  park local STACK     run the stack's RayJob and RayService on a local Ray (CPU)\n\n"
        "STACK names stacks/Pulumi.STACK.yaml; --config-file reads any path."
    ),
)
console = Console()
err_console = Console(stderr=True)


@app.callback()
def _park() -> None:
    """Keeps `park` a group of commands even while it has only one."""


StackArg = Annotated[str, typer.Argument(help="Stack name: stacks/Pulumi.<STACK>.yaml")]
ConfigFileOpt = Annotated[
    Path | None, typer.Option("--config-file", help="Read this stack file instead.")
]


def resolve_stack_file(stack: str, config_file: Path | None) -> Path:
    path = config_file or Path.cwd() / "stacks" / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        err_console.print(f"[red]error:[/] no stack file at {path}")
        raise typer.Exit(2)
    return path


def report_config_error(err: ConfigError) -> None:
    err_console.print(f"[red]invalid stack config[/] ({len(err.problems)} problem(s)):")
    for problem in err.problems:
        err_console.print(f"  - [bold]{problem.key}[/] = {problem.value!r}: {problem.message}")


@app.command()
def render(
    stack: StackArg,
    out: Annotated[
        Path | None, typer.Option(help="Write resources.json and manifests/ here.")
    ] = None,
    config_file: ConfigFileOpt = None,
) -> None:
    """Run the Pulumi program offline (mocks, no credentials) and show what it declares."""
    from infra.render import render_stack_file, write_outputs

    path = resolve_stack_file(stack, config_file)
    try:
        rendered = render_stack_file(path, stack)
    except ConfigError as err:
        report_config_error(err)
        raise typer.Exit(1) from None
    if out is not None:
        write_outputs(rendered, out)
        console.print(f"wrote {out / 'resources.json'} and {out / 'manifests'}/")
    print_summary(rendered)


def print_summary(rendered) -> None:  # type: ignore[no-untyped-def]
    config = rendered.config
    by_type = Counter(r.type for r in rendered.resources)
    table = Table(title=f"stack {config.stack}: {len(rendered.resources)} resources")
    table.add_column("type")
    table.add_column("count", justify="right")
    for type_token, count in sorted(by_type.items()):
        table.add_row(type_token, str(count))
    console.print(table)

    pools = Table(title="TPU pools")
    for column in ("pool", "machine type", "topology", "slices", "hosts", "chips", "capacity"):
        pools.add_column(
            column, justify="right" if column in ("slices", "hosts", "chips") else "left"
        )
    total_chips = total_hosts = 0
    for pool in config.tpu_pools:
        tpu = pool.slice
        hosts, chips = tpu.hosts * pool.slices, tpu.chips * pool.slices
        total_hosts += hosts
        total_chips += chips
        pools.add_row(
            pool.name,
            pool.machine_type,
            pool.topology,
            str(pool.slices),
            str(hosts),
            str(chips),
            pool.capacity,
        )
    pools.add_row(
        "total",
        "",
        "",
        str(sum(p.slices for p in config.tpu_pools)),
        str(total_hosts),
        str(total_chips),
        "",
        style="bold",
    )
    console.print(pools)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
