"""Generated sections of the docs site (docs/) and README, so the docs cannot drift from the code.

`python -m infra.tools.docs` (`make docs`) rewrites the marked blocks of each page in `PAGES`; a
test fails when they are stale.
"""

from __future__ import annotations

import json
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from infra.schema.models import StackConfig

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Which page holds each generated block.
PAGES: dict[str, Path] = {
    "readme-stacks": README,
    "config-reference": DOCS / "config.md",
    "stacks-summary": DOCS / "stacks.md",
    "training-fit": DOCS / "stacks.md",
    "flowcharts": DOCS / "stacks.md",
    "cost": DOCS / "cost.md",
    "deploy-roles": DOCS / "security.md",
    "deploy-roles-script": DOCS / "security.md",
    "component-inputs": DOCS / "components.md",
    "package-example": DOCS / "components.md",
    "readme-package-example": README,
}
# The program docs/components.md prints: the example itself, so the two cannot drift.
PACKAGE_EXAMPLE = ROOT / "examples" / "existing-cluster" / "__main__.py"


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return " \\| ".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is list:
        (inner,) = typing.get_args(annotation)
        return f"list of {_type_name(inner)}"
    if origin is dict:
        return "map"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation)).replace("NoneType", "null")


def _default(field: Any) -> str:
    if field.is_required():
        return "**required**"
    value = field.default
    if isinstance(value, BaseModel):
        return ""
    if value in (None, [], {}):
        return "—"
    return f"`{json.dumps(value)}`" if not isinstance(value, str) else f"`{value}`"


def description(field: Any) -> str:
    """A spec field's description (its docstring in infra/schema), as one table line."""
    return " ".join((field.description or "").split())


def config_rows() -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) for every config key, nested ones included: the
    descriptions are the spec fields' docstrings, written once in infra/schema."""
    rows = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            if model is StackConfig and name == "stack":
                continue
            if model is StackConfig:
                key = {"project": "gcp:project", "region": "gcp:region"}.get(
                    name, f"park:{field.alias or name}"
                )
            else:
                key = f"{prefix}.{field.alias or name}"
            rows.append((key, _type_name(field.annotation), _default(field), description(field)))
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, key)
            elif typing.get_origin(annotation) is list:
                (inner,) = typing.get_args(annotation)
                if (
                    isinstance(inner, type)
                    and issubclass(inner, BaseModel)
                    and inner.__name__ != "AuthorizedNetwork"
                ):
                    walk(inner, f"{key}[]")

    walk(StackConfig, "")
    return rows


def config_reference() -> str:
    lines = ["| key | type | default | what it is for |", "|---|---|---|---|"]
    lines += [f"| `{k}` | {t} | {d} | {desc} |" for k, t, d, desc in config_rows()]
    return "\n".join(lines)


def replace_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- {name}:start -->\n).*?(<!-- {name}:end -->)", re.S)
    if not pattern.search(text):
        raise ValueError(f"no {name} block in the page (infra.tools.docs.PAGES)")
    return pattern.sub(lambda m: f"{m.group(1)}{body}\n{m.group(2)}", text)


def stacks_summary(render: Callable[[str], Any] | None = None) -> str:
    """What each shipped stack declares, from its offline render."""
    from collections import Counter

    from infra.schema.read import stack_name_of
    from infra.tools.render import render_stack_file

    out = []
    for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml")):
        rendered = render(stack_name_of(path)) if render else render_stack_file(path)
        plan, config = rendered.plan, rendered.config
        by_type = Counter(r.type for r in rendered.resources if r.custom)
        workloads = [
            f"{m['kind']} `{m['metadata']['name']}`"
            for m in rendered.manifests()
            if m["apiVersion"].startswith("ray.io")
        ]
        out.append(
            f"**{config.stack}** (`{path.relative_to(ROOT)}`): "
            f"{len(rendered.resources)} resources ({sum(by_type.values())} cloud/Kubernetes, "
            f"the rest components); KubeRay via {config.kuberay.install}; "
            f"{', '.join(workloads) or 'no Ray workloads'}.\n"
        )
        out.append("| TPU pool | machine type | topology | slices | hosts | chips | capacity |")
        out.append("|---|---|---|---|---|---|---|")
        for pool in plan.tpu_pools:
            out.append(
                f"| {pool.name} | {pool.slice.machine_type} | {pool.slice.topology} | "
                f"{pool.slices} | {pool.total_hosts} | {pool.total_chips} | {pool.capacity} |"
            )
        out.append("")
        out.append(
            "Resources: " + ", ".join(f"{n} x `{t}`" for t, n in sorted(by_type.items())) + "\n"
        )
    return "\n".join(out).rstrip()


def _rendered_stacks(render: Callable[[str], Any] | None) -> list[Any]:
    from infra.schema.read import stack_name_of
    from infra.tools.render import render_stack_file

    return [
        render(stack_name_of(path)) if render else render_stack_file(path)
        for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))
    ]


def deploy_roles_table(render: Callable[[str], Any] | None = None) -> str:
    """Per shipped stack, the roles `pulumi up` needs for what its render declares, and the
    APIs it enables first (infra/tools/roles.py, infra/plan/project.py)."""
    from infra.plan.project import apis
    from infra.tools.roles import PREVIEW_ROLES, deploy_roles

    lines = [
        "| stack | park-deploy (`pulumi up`) | park-preview | APIs `up` enables first |",
        "|---|---|---|---|",
    ]
    for rendered in _rendered_stacks(render):
        roles = deploy_roles(r.type for r in rendered.resources)
        enabled = ", ".join(a.service.split(".")[0] for a in apis(rendered.plan))
        lines.append(
            f"| {rendered.plan.stack} | {', '.join(f'`{r}`' for r in roles)} | "
            f"{', '.join(f'`{r}`' for r in PREVIEW_ROLES)} | {enabled} |"
        )
    return "\n".join(lines)


def deploy_roles_script(render: Callable[[str], Any] | None = None) -> str:
    """The setup commands for the two CI identities (docs/security.md), with every shipped
    stack's roles."""
    from infra.tools.roles import PREVIEW_ROLES, deploy_roles

    stacks = _rendered_stacks(render)
    roles = deploy_roles(r.type for s in stacks for r in s.resources)
    listed = " \\\n    ".join(" ".join(roles[i : i + 3]) for i in range(0, len(roles), 3))
    envs = " ".join(s.plan.stack for s in stacks)
    return (
        "```bash\n"
        f"for env in {envs}; do  # one GitHub environment per shipped stack\n"
        "  gcloud iam service-accounts add-iam-policy-binding "
        "park-deploy@$PROJECT.iam.gserviceaccount.com \\\n"
        "    --role=roles/iam.workloadIdentityUser \\\n"
        '    --member="principal://iam.googleapis.com/$POOL/subject/repo:$REPO:environment:$env"\n'
        "done\n"
        f"for role in {' '.join(PREVIEW_ROLES)}; do\n"
        "  gcloud projects add-iam-policy-binding $PROJECT --role=$role \\\n"
        "    --member=serviceAccount:park-preview@$PROJECT.iam.gserviceaccount.com\n"
        "done\n"
        f"for role in {listed}; do\n"
        "  gcloud projects add-iam-policy-binding $PROJECT --role=$role \\\n"
        "    --member=serviceAccount:park-deploy@$PROJECT.iam.gserviceaccount.com\n"
        "done\n"
        "```"
    )


def _shipped_plans() -> list[Any]:
    from infra.stack import from_file

    return [from_file(path) for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))]


def _money(value: float | None) -> str:
    return "n/a" if value is None else f"${value:,.2f}"


def flowcharts(render: Callable[[str], Any] | None = None) -> str:
    """Each shipped stack's resources.mmd (infra/tools/flowchart.py) and placement.mmd
    (infra/tools/placement.py), as the site shows them."""
    from infra.tools.flowchart import flowchart
    from infra.tools.placement import placement_chart

    parts = []
    for rendered in _rendered_stacks(render):
        records = [r.as_json() for r in rendered.resources]
        parts.append(
            f"### {rendered.plan.stack}\n\nWhat runs where:\n\n"
            f"```mermaid\n{placement_chart(rendered.plan)}```\n\n"
            f"What `up` creates, in order:\n\n```mermaid\n{flowchart(records)}```\n"
        )
    return "\n".join(parts).rstrip()


def readme_stacks() -> str:
    """README's line per shipped stack: the TPU chips it needs quota for, and what it costs left
    up (idle plus the serving slices that stay up: `park cost`'s first figure)."""
    from collections import Counter

    from infra.tools.cost import HOURS_PER_MONTH, estimate

    lines = [
        "| stack | TPU chips to have quota (or a reservation) for | zone | left up, $/h "
        "| left up, $/month |",
        "|---|---|---|---|---|",
    ]
    for plan in _shipped_plans():
        cost = estimate(plan)
        chips: Counter[tuple[str, str]] = Counter()
        for pool in cost.pools:
            if pool.kind == "tpu":
                chips[(pool.generation, pool.capacity)] += pool.chips
        needs = ", ".join(f"{n} {gen} {cap}" for (gen, cap), n in chips.items())
        left = cost.serving_floor_per_hour
        month = "n/a" if left is None else f"${left * HOURS_PER_MONTH:,.0f}"
        lines.append(f"| {plan.stack} | {needs} | {plan.spec.zone} | {_money(left)} | {month} |")
    return "\n".join(lines)


def cost_table() -> str:
    """`park cost` of every shipped stack, at the shipped list prices."""
    from infra.stack import from_file
    from infra.tools.cost import estimate
    from infra.tools.report_cost import rl_total

    lines = [
        "| stack | TPU pools (chips / hosts) | everything up | idle | serving floor "
        "| one training run |",
        "|---|---|---|---|---|---|",
    ]
    for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml")):
        cost = estimate(from_file(path))
        tpu = [p for p in cost.pools if p.kind == "tpu"]
        pools = "; ".join(
            f"{p.name}: {p.slices} x {p.topology} {p.capacity} ({p.chips} / {p.hosts})" for p in tpu
        )
        run = cost.training_run
        run_text = "—" if run is None else f"{_money(run.cost)} ({run.steps:,} steps)"
        if cost.rl_run is not None:
            steps = cost.rl_run[0].steps
            rl_text = f"RL {_money(rl_total(cost))} ({steps:,} steps, both pools)"
            run_text = rl_text if run is None else f"{run_text}; {rl_text}"
        lines.append(
            f"| {cost.stack} | {pools} | {_money(cost.full_per_hour)}/h | "
            f"{_money(cost.idle_per_hour)}/h | {_money(cost.serving_floor_per_hour)}/h | "
            f"{run_text} |"
        )
    return "\n".join(lines)


def training_fit_table() -> str:
    """Each shipped stack's training step, per chip at its peak (infra.resolve.training_fit, at the
    micro-batch the plan picks): what `park validate` prints, one row a stack."""

    gib = 1024**3
    lines = [
        "| stack | model | strategy on chips | micro-batch x steps | states | activations "
        "| logits | reserve | total of usable (GiB) | peak at |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for plan in _shipped_plans():
        training = plan.training
        if training is None:
            continue
        spec, fit = training.spec, training.fit
        model = f"`{spec.model}`" if spec.model else f"GPT preset `{spec.model_size}`"
        head = (
            f"| {plan.stack} | {model} | {spec.strategy} on {training.workers} | "
            f"{training.micro_batch} x {training.accumulation_steps} |"
        )
        if fit is None:
            lines.append(f"{head} not estimated: {training.facts.reason} ||||||")
            continue
        cells = (fit.states_bytes, fit.activations_bytes, fit.logits_bytes, fit.reserve_bytes)
        lines.append(
            f"{head} {' | '.join(f'{v / gib:.1f}' for v in cells)} | "
            f"{fit.total_bytes / gib:.1f} of {fit.usable_bytes / gib:.2f} | {fit.phase} |"
        )
    return "\n".join(lines)


def component_inputs_table() -> str:
    """Per public component, which arguments take an Output (copied into a resource or a
    manifest as they are) and which must be known at preview (the plan computes with them):
    read from the provider schema, whose `plain` marks the second kind for every language."""
    from park_gke.provider import schema

    generated = schema()
    kinds = generated["types"]

    def split(properties: dict[str, Any], prefix: str = "") -> tuple[list[str], list[str]]:
        outputs: list[str] = []
        known: list[str] = []
        for key, prop in sorted(properties.items()):
            (known if prop.get("plain") else outputs).append(prefix + key)
            ref = (prop.get("items") or prop).get("$ref", "")
            nested = kinds.get(ref.removeprefix("#/types/"), {}).get("properties")
            if nested:
                suffix = "[]." if "items" in prop else "."
                more_outputs, _ = split(nested, prefix + key + suffix)
                outputs.extend(more_outputs)
        return outputs, known

    lines = ["| component | takes an Output (copied as is) | known at preview (planned with) |"]
    lines.append("|---|---|---|")
    for token, resource in sorted(generated["resources"].items()):
        outputs, known = split(resource.get("inputProperties", {}))
        cells = [", ".join(f"`{k}`" for k in keys) or "—" for keys in (outputs, known)]
        lines.append(f"| `{token.rsplit(':', 1)[-1]}` | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def package_example() -> str:
    """The example program as a fenced block, without its module docstring (the page says
    the same in prose): what a reader copies is the file the tests run."""
    import ast

    text = PACKAGE_EXAMPLE.read_text()
    body = ast.parse(text).body
    first = body[0]
    docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    start = (first.end_lineno or 0) if docstring else 0
    code = "\n".join(text.splitlines()[start:]).strip("\n")
    return f"```python\n{code}\n```"


def generated_blocks(render: Callable[[str], Any] | None = None) -> dict[str, str]:
    return {
        "training-fit": training_fit_table(),
        "config-reference": config_reference(),
        "stacks-summary": stacks_summary(render),
        "cost": cost_table(),
        "deploy-roles": deploy_roles_table(render),
        "deploy-roles-script": deploy_roles_script(render),
        "component-inputs": component_inputs_table(),
        "package-example": package_example(),
        "readme-package-example": package_example(),
        "flowcharts": flowcharts(render),
        "readme-stacks": readme_stacks(),
    }


def render_pages(render: Callable[[str], Any] | None = None) -> dict[Path, tuple[str, str]]:
    """Each page of `PAGES`: (its text now, its text with every generated block rewritten);
    `render` is a cached stack renderer."""
    blocks = generated_blocks(render)
    pages: dict[Path, tuple[str, str]] = {}
    for name, page in PAGES.items():
        now = pages[page][0] if page in pages else page.read_text()
        rewritten = pages[page][1] if page in pages else now
        pages[page] = (now, replace_block(rewritten, name, blocks[name]))
    return pages


def main() -> int:
    for page, (now, rewritten) in render_pages().items():
        if rewritten != now:
            page.write_text(rewritten)
            print(f"updated {page.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
