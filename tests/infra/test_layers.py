"""The deploy pipeline's layers, read from its imports: no cycle among infra's modules and no
import from a layer into one above it (issue 28); `workloads/` never imports `infra`, has no
import cycle either, and its contract, flags and training config go one way (issue 37).

Every import counts: at the top of a module, inside a function, under ``TYPE_CHECKING``. An
import names what the module takes: ``from infra.plan import ray`` takes the module
``infra.plan.ray``; ``from infra.plan.ray import rayjob`` takes a name of ``infra.plan.ray``.
(Python runs a package's ``__init__`` before any module inside it, whichever way the import is
spelt; that is how packages work, not a dependency, and is not counted.) Imports built from
strings at run time (``importlib.import_module``) are not seen.

LAYERS is the architecture as the code runs, lowest first: a stack file is read into the typed
schema, resolved once into a frozen StackPlan, planned into manifests, judged by the rules, and
handed to the Pulumi components, which the program runs and the tools read.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]

Graph = Mapping[str, frozenset[str]]  # module -> the modules of its package it imports


class Layer(NamedTuple):
    name: str
    modules: tuple[str, ...]  # each: that module and every module inside it
    holds: str  # what the layer is, for a reader


LAYERS: tuple[Layer, ...] = (
    Layer(
        "facts",
        (
            "infra.datafile",
            "infra.catalog",
            "infra.versions",
            "infra.engines",
            "infra.names",
            "infra.gke",
            "infra.kuberay",
            "infra.webhooks",
            "infra.images",
            "infra.model_facts",
            "infra.model_lookup",
            "infra.ray_serve",
            "infra.storage_iam",
        ),
        "what a stack is checked against: TPU catalog, pinned versions, engines, names, "
        "GKE / KubeRay / webhook data, model facts, images, Ray Serve settings, Cloud "
        "Storage's roles and the workloads' bucket ledger",
    ),
    Layer("schema", ("infra.schema",), "the stack's typed keys, and how a stack file is read"),
    Layer(
        "resolve",
        (
            "infra.resolve",
            "infra.engine",
            "infra.kv_cache",
        ),
        "the frozen StackPlan: every derived number and name, once; disk, host memory and the "
        "fits (the engine's, the KV cache's, training's) it sizes with",
    ),
    Layer("plan", ("infra.plan",), "pure Python manifests from the StackPlan"),
    Layer("rules", ("infra.rules",), "every problem of a spec and its plan, all at once"),
    Layer("stack", ("infra.stack",), "the front door: read, resolve, judge"),
    Layer("components", ("infra.components",), "the Pulumi components, one per concept"),
    Layer("program", ("infra.program",), "the stack program `pulumi up` runs"),
    Layer(
        "tools",
        ("infra.tools",),
        "park's commands: render, validate (and the manifest readers its checks and the "
        "policy pack share), cost, local, docs",
    ),
)

# ---- reading the imports ------------------------------------------------------------------------


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` under `root`, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(module: str, path: Path) -> Iterator[tuple[str, str | None]]:
    """Each import of a module's source, anywhere in it, as (absolute module, name taken from
    it): ``import a.b`` is ("a.b", None); ``from a import b`` is ("a", "b")."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1
                above = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*above, base] if base else above)
            yield from ((base, alias.name) for alias in node.names)


def import_graph(root: Path, package: str) -> dict[str, frozenset[str]]:
    """Which modules of `package` each of its modules imports (itself left out). A name taken
    from a package is its submodule when it is one, else the package's own."""
    modules = modules_of(root, package)

    def target(base: str, name: str | None) -> str | None:
        if name is not None and f"{base}.{name}" in modules:
            return f"{base}.{name}"
        while base and base not in modules:  # a name inside a module: that module
            base = base.rpartition(".")[0]
        return base or None

    return {
        module: frozenset(
            t
            for base, name in imported(module, path)
            if (t := target(base, name)) is not None and t != module
        )
        for module, path in modules.items()
    }


# ---- judging the graph --------------------------------------------------------------------------


def cycles(graph: Graph) -> list[frozenset[str]]:
    """The graph's import cycles: each strongly connected set of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for dep in sorted(graph.get(module, ())):
            if dep not in index:
                visit(dep)
                low[module] = min(low[module], low[dep])
            elif dep in stack:
                low[module] = min(low[module], index[dep])
        if low[module] == index[module]:
            members = {stack.pop()}
            while module not in members:
                members.add(stack.pop())
            if len(members) > 1:
                found.append(frozenset(members))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def layer_of(module: str, layers: Sequence[Layer]) -> int | None:
    """The index of the layer holding `module` (the entry nearest it), or None."""
    best: tuple[int, int] | None = None  # (entry length, layer index)
    for i, layer in enumerate(layers):
        for entry in layer.modules:
            if module == entry or module.startswith(entry + "."):
                best = max(best or (0, i), (len(entry), i))
    return None if best is None else best[1]


def upward_imports(graph: Graph, layers: Sequence[Layer]) -> list[str]:
    """Every import from a module into a layer above its own, as 'a (layer) -> b (layer)'."""
    found = []
    for module, deps in sorted(graph.items()):
        here = layer_of(module, layers)
        for dep in sorted(deps):
            there = layer_of(dep, layers)
            if here is not None and there is not None and there > here:
                found.append(f"{module} ({layers[here].name}) -> {dep} ({layers[there].name})")
    return found


# ---- the checks, on infra -----------------------------------------------------------------------

INFRA = import_graph(ROOT, "infra")


def test_no_import_cycle_in_infra() -> None:
    found = cycles(INFRA)
    assert [sorted(c) for c in found] == []


def test_every_infra_module_has_a_layer() -> None:
    """A new module is placed in LAYERS, so that the layering judges it (the root package
    holds no code)."""
    assert (ROOT / "infra" / "__init__.py").read_text().strip() == ""
    assert [m for m in INFRA if m != "infra" and layer_of(m, LAYERS) is None] == []


def test_no_import_into_a_higher_layer() -> None:
    assert upward_imports(INFRA, LAYERS) == []


# ---- the checks, on workloads --------------------------------------------------------------------

WORKLOADS = import_graph(ROOT, "workloads")

# The contract with infra, the flag plumbing both entrypoints share, and the training config,
# lowest first: each imports only those below it (the modules not named here are not judged).
WORKLOAD_LAYERS: tuple[Layer, ...] = (
    Layer("contract", ("workloads.protocol",), "entrypoint flags, progress lines, markers"),
    Layer("flags", ("workloads.flags",), "the config file's reader, the CLI plumbing"),
    Layer("values", ("workloads.train.config_rules",), "allowed values, parsers"),
    Layer("config", ("workloads.train.config",), "TrainConfig, its CLI and rendering"),
    Layer("checked", ("workloads.train.config_check",), "validate, parse_args, resolve"),
)


def test_no_import_cycle_in_workloads() -> None:
    found = cycles(WORKLOADS)
    assert [sorted(c) for c in found] == []


def test_workloads_contract_flags_and_config_go_one_way() -> None:
    assert upward_imports(WORKLOADS, WORKLOAD_LAYERS) == []


def test_workloads_never_import_infra() -> None:
    """workloads/ runs in the images, which ship without infra (workloads/Dockerfile); the
    contract between them is workloads/protocol.py."""
    found = [
        f"{module} imports {base}"
        for module, path in modules_of(ROOT, "workloads").items()
        for base, name in imported(module, path)
        if (base or name or "").split(".")[0] == "infra"
    ]
    assert found == []


TRAIN_TOP_LEVEL_MAX = 15  # workloads/train/'s own modules, __init__ and __main__ included


def test_workloads_train_is_grouped_by_concern() -> None:
    """workloads/train/ keeps at most 15 modules at its top (the entrypoints, the config and what
    every part shares); the rest sit in subpackages named for their concern, each saying in its
    __init__'s docstring what lives there (issue 37)."""
    train = ROOT / "workloads" / "train"
    top = sorted(path.name for path in train.glob("*.py"))
    assert len(top) <= TRAIN_TOP_LEVEL_MAX, top
    code_folders = [d for d in sorted(train.iterdir()) if d.is_dir() and any(d.rglob("*.py"))]
    assert code_folders, "workloads/train/ has no subpackage"
    for folder in code_folders:
        init = folder / "__init__.py"
        assert init.is_file(), f"{folder.relative_to(ROOT)} has no __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init.relative_to(ROOT)}"


# ---- the checker can fail -----------------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_checker_finds_cycles_and_upward_imports(tmp_path: Path) -> None:
    """On a small package: a cycle through a function-level import, one under TYPE_CHECKING
    through a relative import, one through a name taken from a package's __init__; an import
    of a sibling submodule through its package is no cycle; an upward import is named."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": "def f():\n    from pkg import high\n",
            "pkg/high.py": "from pkg.low import f\n",
            "pkg/a.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.b import B\n",
            "pkg/b.py": "from . import a\nclass B: ...\n",
            # a package that gathers: its modules take one another through it, which is fine...
            "pkg/ok/__init__.py": "from pkg.ok.one import x\n",
            "pkg/ok/one.py": "from pkg.ok import two\nx = two.y\n",
            "pkg/ok/two.py": "y = 1\n",
            # ...unless one takes a name the package's __init__ defines
            "pkg/bad/__init__.py": "from pkg.bad.one import x\n",
            "pkg/bad/one.py": "from pkg.bad import two\nx = two.y\n",
            "pkg/bad/two.py": "from pkg.bad import x\ny = 1\n",
        },
    )
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.ok.one"] == {"pkg.ok.two"}
    assert sorted(sorted(c) for c in cycles(graph)) == [
        ["pkg.a", "pkg.b"],
        ["pkg.bad", "pkg.bad.one", "pkg.bad.two"],
        ["pkg.high", "pkg.low"],
    ]
    layers = (Layer("low", ("pkg.low", "pkg.a"), ""), Layer("high", ("pkg",), ""))
    assert layer_of("pkg.low", layers) == 0  # the nearest entry wins over the package's
    assert layer_of("pkg.ok.two", layers) == 1
    assert upward_imports(graph, layers) == [
        "pkg.a (low) -> pkg.b (high)",
        "pkg.low (low) -> pkg.high (high)",
    ]
    assert layer_of("elsewhere", layers) is None
