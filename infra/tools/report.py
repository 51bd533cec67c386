"""What the park CLI prints: summaries, validation sections, fit and disk tables, config
problems (`park cost`'s tables: infra/tools/report_cost.py).

Only output lives here; every figure comes from the StackPlan, the render or the cost estimate.
Values that may be credentials never reach the console: config problems carry them masked.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.schema.safe import one_line
from infra.schema.secrets import scrub
from infra.tools import report_rl

if TYPE_CHECKING:
    from infra.resolve import StackPlan
    from infra.schema.errors import ConfigError, ConfigProblem
    from infra.tools.render import Rendered
    from infra.tools.validate import Section


def config_error(err: ConfigError, out: Console) -> None:
    out.print(f"[red]invalid stack config[/] ({len(err.problems)} problem(s)):")
    for problem in err.problems:
        _keyed_line(out, "  - ", problem)


def warnings(plan: StackPlan, out: Console) -> None:
    """What is valid but worth saying (infra.rules.warnings)."""
    for warning in plan.warnings:
        _keyed_line(out, "  [yellow]warning[/] ", warning)


def _keyed_line(out: Console, lead: str, said: ConfigProblem) -> None:
    """A problem or a warning as one line: the stack key, its value, what is said of it."""
    out.print(
        f"{lead}[bold]{escape(said.key)}[/] = {escape(said.shown_value)}: {escape(said.message)}",
        soft_wrap=True,
    )


def render_summary(rendered: Rendered, out: Console) -> None:
    by_type = Counter(r.type for r in rendered.resources)
    table = Table(title=f"stack {rendered.plan.stack}: {len(rendered.resources)} resources")
    table.add_column("type")
    table.add_column("count", justify="right")
    for type_token, count in sorted(by_type.items()):
        table.add_row(type_token, str(count))
    out.print(table)
    out.print(pools_table(rendered.plan))
    fit_tables(rendered.plan, out)
    warnings(rendered.plan, out)


def fit_tables(plan: StackPlan, out: Console) -> None:
    """Whether the stack fits: serving engines, training memory, rl, disks (render, validate
    and cost print the same tables)."""
    for table in (fit_table(plan), training_fit_table(plan), report_rl.rl_table(plan)):
        if table is not None:
            out.print(table)
    for table in disk_tables(plan):
        out.print(table)
    out.print(first_deploy_table(plan))


def pools_table(plan: StackPlan) -> Table:
    pools = Table(title="TPU pools")
    for column in ("pool", "machine type", "topology", "slices", "hosts", "chips", "capacity"):
        pools.add_column(
            column, justify="right" if column in ("slices", "hosts", "chips") else "left"
        )
    for pool in plan.tpu_pools:
        pools.add_row(
            pool.name,
            pool.slice.machine_type,
            pool.slice.topology,
            str(pool.slices),
            str(pool.total_hosts),
            str(pool.total_chips),
            pool.capacity,
        )
    pools.add_row(
        "total",
        "",
        "",
        str(plan.total_slices),
        str(plan.total_hosts),
        str(plan.total_chips),
        "",
        style="bold",
    )
    return pools


def fit_table(plan: StackPlan) -> Table | None:
    """Per served model: what each chip of its slice holds (infra.engine.fit): the weights, the
    engine's reserve and the KV cache, against HBM as the runtime reports it."""
    if plan.serving is None or not plan.serving.models:
        return None
    tpu = plan.serving.pool.slice
    unit = tpu.device_word
    table = Table(
        title=f"serving fit on {tpu.machine_type} {tpu.topology} ({tpu.devices} {unit}s, "
        f"{tpu.runtime_hbm_gib:.2f} GiB HBM each as the runtime reports it)",
        caption=f"per {unit}; usable = HBM x gpu_memory_utilization; reserve = the engine's "
        "profile batch (max_num_batched_tokens) + sampler logits + runtime margin; KV cache = "
        "usable - weights - reserve; KV/sequence = what vLLM reserves for one maxModelLen request "
        "(sliding layers: window - 1 + in-flight tokens + a block); sequences = such requests "
        "at once",
    )
    columns = ("model", "TP", f"weights/{unit}", "reserve", "usable", "KV cache", "KV bytes/token")
    for column in (*columns, "KV/sequence", "sequences", f"idle {unit}s"):
        table.add_column(column, justify="left" if column == "model" else "right")
    table.add_column("facts from")
    for model in plan.serving.models:
        fit, lookup = model.fit, model.facts
        source = "unknown"
        if lookup.facts is not None:
            source = lookup.facts.source
            source = "catalogue" if source.startswith("catalogue:") else source
        if fit is None:
            table.add_row(
                model.spec.name,
                str(model.tensor_parallel),
                *["?"] * 7,
                str(model.idle_devices_per_replica),
                source,
            )
            continue
        parallel = str(fit.tensor_parallel)
        if fit.expert_parallel:
            parallel += f", EP {fit.expert_parallel}"
        weights = f"{fit.weights_gib:.2f} GiB"
        if fit.experts_per_chip:
            weights += f" ({fit.experts_per_chip} experts)"
        layers = f", {fit.cache_layers} layers" if fit.cache_layers < model_layers(model) else ""
        table.add_row(
            model.spec.name,
            parallel,
            weights,
            f"{fit.reserve_gib:.2f} GiB @ {fit.max_num_batched_tokens}",
            f"{fit.usable_gib:.2f} GiB",
            f"{fit.kv_cache_gib:.1f} GiB",
            f"{fit.kv_bytes_per_token:,}{layers}",
            f"{fit.kv_gib_per_sequence * 1024:.0f} MiB @ {model.spec.max_model_len}",
            str(fit.sequences),
            str(fit.idle_devices),
            source,
        )
    return table


def model_layers(model: object) -> int:
    """The model's layer count (to say when fewer hold KV: Gemma 4's shared layers)."""
    facts = getattr(getattr(model, "facts", None), "facts", None)
    return facts.layers if facts is not None else 0


def training_fit_table(plan: StackPlan) -> Table | None:
    """What each chip holds during a training step at the plan's micro-batch (infra.
    training_fit, chosen by infra.resolve): the states, one micro-batch's activations and
    logits, the runtime's reserve, against the HBM the runtime reports."""
    training = plan.training
    if training is None:
        return None
    spec, tpu, fit = training.spec, training.pool.slice, training.fit
    model = spec.model or f"GPT preset {spec.model_size}"
    unit = tpu.device_word
    table = Table(
        title=f"training fit: {model}, {spec.strategy} on {training.workers} {unit}s "
        f"({training.slices} x {tpu.machine_type} {tpu.topology})",
        caption=f"per {unit}; global batch {spec.global_batch_size} = {training.workers} {unit}s x "
        f"micro-batch {training.micro_batch} x {training.accumulation_steps} accumulation "
        f"step(s), {spec.seq_len} tokens each",
    )
    table.add_column(f"per {unit}")
    table.add_column("GiB", justify="right")
    table.add_column("what")
    if fit is None:
        lookup = training.facts
        why = lookup.reason or lookup.error or "the batch does not split over the chips"
        if lookup.facts is not None:
            why = "neither the parameter count nor the MLP width is known"
        table.add_row("estimate", "?", f"not made: {why}")
        return table
    shard = f"sharded over {fit.shard_size}" if fit.shard_size > 1 else "whole on each chip"
    rows = [
        ("parameters", fit.params_bytes, f"fp32 master ({shard}), bf16 copies held at the peak"),
        ("gradients", fit.grads_bytes, "fp32 gradients and reduce buffers held at the peak"),
        ("optimizer", fit.optimizer_bytes, f"AdamW's two fp32 moments ({shard})"),
        ("states", fit.states_bytes, "parameters + gradients + optimizer"),
        (
            "activations",
            fit.activations_bytes,
            f"one micro-batch of {fit.micro_batch} x {fit.seq_len} tokens, activation "
            f"checkpointing {'on' if fit.activation_checkpointing else 'off'}",
        ),
        ("logits", fit.logits_bytes, "the loss's fp32 logits of one chunk, and their gradient"),
        ("reserve", fit.reserve_bytes, "the runtime's own (compiled programs, collectives)"),
    ]
    for label, value, what in rows:
        table.add_row(
            label, f"{value / 1024**3:.2f}", what, style="bold" if label == "states" else ""
        )
    verdict = "[green]fits[/]" if fit.fits else "[red]does not fit[/]"
    table.add_row(
        "total",
        f"{fit.total_bytes / 1024**3:.2f}",
        f"{verdict} in {fit.usable_bytes / 1024**3:.2f} GiB usable "
        f"({tpu.generation.name} HBM as the runtime reports it); peak at {fit.phase or '?'}",
        style="bold",
    )
    return table


def section(result: Section, out: Console) -> None:
    """One `park validate` section: ok, skipped, or its problems."""
    if result.problems:
        out.print(
            f"  [red]{len(result.problems)} problem(s)[/] {result.label}: {escape(result.checked)}"
        )
        for problem in result.problems:
            shown = one_line(scrub(problem))  # manifests may be hand-edited: never echo a token
            out.print(f"    - {escape(shown)}", soft_wrap=True, highlight=False)
    elif result.skipped:
        out.print(f"  [yellow]-[/] {escape(result.checked)}")
    else:
        out.print(f"  [green]ok[/] {result.label}: {escape(result.checked)}")


def disk_tables(plan: StackPlan) -> list[Table]:
    """Per pod: scratch, gcsfuse file cache and the ephemeral-storage limit they make; per
    node pool: the boot disk against what its pods need; per TPU host: host memory; and the
    hub models to stage into the bucket first (infra.resolve.disk)."""
    from infra.resolve.disk import GIB

    budget = plan.disk
    if budget is None or not budget.pods:
        return []
    pods = Table(
        title="disk per pod (scratch emptyDir + gcsfuse file cache; checkpoints and exports "
        "go to the bucket)",
        caption="limit = the pod's ephemeral-storage request and limit, from this plan",
    )
    for column in ("pod", "pool", "scratch", "file cache", "limit", "to the bucket"):
        pods.add_column(column, justify="left" if column in ("pod", "pool") else "right")
    for pod in budget.pods:
        to_bucket = sum(i.bytes for i in pod.bucket)
        pods.add_row(
            pod.role,
            pod.pool,
            f"{pod.scratch_bytes / GIB:.1f} GiB",
            f"{pod.file_cache_bytes / GIB:.1f} GiB" if pod.file_cache_bytes else "off",
            pod.limit,
            f"{to_bucket / GIB:.1f} GiB" if to_bucket else "",
        )
    nodes = Table(title="boot disk per node pool", caption="GKE keeps part of it for itself")
    for column in ("pool", "machine", "pods", "needed", "boot disk", "local SSD"):
        nodes.add_column(column, justify="left" if column in ("pool", "machine") else "right")
    for node in budget.nodes:
        size = f"{node.boot_disk_gb} GB" + (" (set)" if node.pinned else "")
        nodes.add_row(
            node.pool,
            node.machine_type,
            f"{node.pods_bytes / GIB:.0f} GiB",
            f"{node.needed_gb} GB",
            size if node.fits else f"[red]{size}[/]",
            "unknown" if node.local_ssd_gib is None else f"{node.local_ssd_gib} GiB",
        )
    memory = Table(
        title="host memory per TPU pod", caption="allowances named in infra/resolve/host_memory.py"
    )
    for column in ("pod", "pool", "holds", "request"):
        memory.add_column(column, justify="left" if column in ("pod", "pool") else "right")
    for host in budget.memory:
        memory.add_row(
            host.role,
            host.pool,
            f"{host.total_bytes / GIB:.1f} GiB",
            f"{host.request_bytes / GIB:.0f} GiB",
        )
    tables = [pods, nodes, memory]
    if budget.staged:
        staged = Table(
            title="models `pulumi up` stages into the bucket before anything reads them "
            "(awaited Jobs; `park stage-model STACK` prints them)"
        )
        for column in ("model", "to", "weights", "for", "awaited up to"):
            staged.add_column(column)
        for model in budget.staged:
            size = "?" if model.weights_bytes is None else f"{model.weights_bytes / GIB:.1f} GiB"
            wait = f"{model.stage_timeout_s / 60:.0f} min"
            staged.add_row(model.repo, model.uri, size, ", ".join(model.used_by), wait)
        tables.append(staged)
    return tables


def first_deploy_table(plan: StackPlan) -> Table:
    """What `pulumi up` switches on and builds before anything needs it: the project's APIs
    (infra.plan.project) and the workload images (infra.images)."""
    from infra.plan.gates import gate_rows
    from infra.plan.project import apis

    table = Table(
        title="first, `pulumi up` enables these APIs, builds these images, and waits at these gates"
    )
    table.add_column("what")
    table.add_column("for")
    for api in apis(plan):
        table.add_row(f"API {api.service}", api.why)
    for build in plan.images:
        table.add_row(f"image {build.name}:{build.tag}", ", ".join(build.used_by))
    for row in gate_rows(plan):  # infra.plan.gates: what `up` waits for, bounded
        table.add_row(*row)
    return table
