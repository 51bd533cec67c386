"""The stack program hands each component its piece of the resolved plan (`of_plan`); nothing
carries a plan between them behind their backs; a user's arguments become a plan piece at the
public edge only; and a stack value reaches the GKE NodePool and KubeRay's `numOfHosts` through
few files (issue 28: it passed 15 when the plan was turned back into arguments)."""

from __future__ import annotations

import ast
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest
import yaml

import infra.components._naming
import park_gke
from infra import program
from infra.components.node_pools import PoolCluster, TpuSlicePool
from infra.plan import node_pools
from infra.stack import from_values
from infra.tools.render import run_under_mocks
from park_gke import testing
from tests.conftest import ROOT

COMPONENTS = ROOT / "infra" / "components"
SAMPLE = ROOT / "tests" / "data" / "kuberay-samples" / "ray-job.tpu-v6e-16-multihost.yaml"
ZONE = "us-east5-b"
SA = "nodes@p.iam.gserviceaccount.com"


def _one_pool_stack(machine_type: str, topology: str) -> dict[str, Any]:
    """A stack of one TPU pool and a training job on it (every other key its default)."""
    return {
        "gcp:project": "p",
        "gcp:region": "us-east5",
        "park:zone": ZONE,
        "park:tpuPools": [{"name": "train", "machineType": machine_type, "topology": topology}],
        "park:training": {"enabled": True, "pool": "train"},
    }


def _sample() -> tuple[str, str, int]:
    """KubeRay's own v6e-16 RayJob sample: (machine type, topology, numOfHosts) of its TPU
    worker group; the machine type from the chips each worker asks for (GKE's ct6e-standard-Nt
    has N chips per host)."""
    job = yaml.safe_load(SAMPLE.read_text())
    (group,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    pod = group["template"]["spec"]
    chips = pod["containers"][0]["resources"]["limits"]["google.com/tpu"]
    topology = pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"]
    return f"ct6e-standard-{chips}t", topology, int(group["numOfHosts"])


# ---- no plan behind the components' backs ------------------------------------------------------


def _module_level_holders(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Module-level names that could carry a plan: annotated with or bound to a plan type, or
    bound to an empty container to be filled while a program runs ([], {}, a weak dictionary;
    a filled literal table is a constant)."""
    for node in tree.body:
        if not isinstance(node, ast.AnnAssign | ast.Assign) or node.value is None:
            continue
        targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
        annotation = ast.unparse(node.annotation) if isinstance(node, ast.AnnAssign) else ""
        value = node.value
        empty = (isinstance(value, ast.List | ast.Set) and not value.elts) or (
            isinstance(value, ast.Dict) and not value.keys
        )
        empty |= isinstance(value, ast.Call) and not value.args and not value.keywords
        empty &= not (isinstance(value, ast.Call) and ast.unparse(value.func)[:1].isupper())
        empty |= isinstance(value, ast.Call) and "Dictionary" in ast.unparse(value.func)
        planned = "Plan" in annotation or "Plan" in ast.unparse(value)
        if empty or planned:
            for target in targets:
                if isinstance(target, ast.Name):
                    yield node.lineno, f"{target.id}: {annotation or ast.unparse(value)}"


def test_no_module_global_of_the_components_carries_a_plan() -> None:
    """What a component plans from is what it is handed: no module of infra/components holds a
    plan, or a mutable holder one could be put in, beside the per-run claim registries (keyed
    by the program run: what each object is claimed by, the pools a run declares)."""
    claims = {"_CLAIMS", "_NO_ROOT", "_POOLS", "_CLUSTER_POOLS", "_NO_ROOT_POOLS"}
    claims |= {"_NO_ROOT_CLUSTERS"}
    found = [
        f"{path.name}:{line}: {what}"
        for path in sorted(COMPONENTS.glob("*.py"))
        for line, what in _module_level_holders(ast.parse(path.read_text()))
        if what.split(":")[0] not in claims
    ]
    assert found == []
    # and those registries hold claims and pool references, never a plan
    for name in claims:
        assert "Plan" not in repr(getattr(infra.components._naming, name))
    for gone in ("stack_program", "in_stack_program", "program_plan", "_PROGRAM"):
        assert not hasattr(infra.components._naming, gone)


def _placements(result: Any) -> dict[str, Any]:
    return {
        r.name: r.inputs.get("placementPolicy")
        for r in result
        if r.type == "gcp:container/nodePool:NodePool"
    }


def test_two_programs_in_one_process_each_plan_their_own_stack() -> None:
    """Two stack programs, then a lone pool built while a program's plan is in hand: each plans
    from what it was given (a plan held anywhere else would leak the first into the others)."""
    first = from_values(_one_pool_stack("ct6e-standard-4t", "4x4"), "dev")
    second = from_values(_one_pool_stack("ct6e-standard-8t", "2x4"), "dev")

    def both() -> None:
        program.build(first, program.Secrets())

    def then_lone() -> None:
        (pool,) = second.tpu_pools
        joins = PoolCluster("c", SA)
        TpuSlicePool.of_plan("planned", pool, node_pools.tpu_slice_pools(pool, ZONE), joins)
        park_gke.TpuSlicePool(
            "lone",
            {
                "cluster": "c",
                "location": ZONE,
                "node_service_account": SA,
                "machine_type": "ct6e-standard-4t",
                "topology": "4x8",
            },
        )

    one, _ = run_under_mocks(both, stack="dev", project="p")
    two = testing.run(then_lone, project="p").resources
    assert _placements(one)["train-s0"] == {"tpuTopology": "4x4", "type": "COMPACT"}
    assert _placements(two)["planned-s0"] is None  # 2x4 on ct6e-standard-8t: one host
    assert _placements(two)["lone-s0"] == {"tpuTopology": "4x8", "type": "COMPACT"}


# ---- aliases follow from how a component was built ---------------------------------------------


@pytest.fixture
def aliases(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(child, old name) of every alias a component gives, by whatever name a module holds
    infra.components._naming.renamed."""
    given: list[tuple[str, str]] = []
    original = infra.components._naming.renamed

    def spying(opts: Any, name: str, legacy: str | None) -> Any:
        out = original(opts, name, legacy)
        given.extend((name, str(getattr(a, "name", a))) for a in out.aliases or [])
        return out

    for module in list(sys.modules.values()):
        if getattr(module, "__dict__", {}).get("renamed") is original:
            monkeypatch.setattr(module, "renamed", spying)
    return given


def test_the_stack_programs_components_keep_their_old_names(
    aliases: list[tuple[str, str]],
) -> None:
    """Built from the plan, a component's renamed children keep the logical names deployed
    stacks have (Pulumi aliases); built from a user's arguments, none is given (two instances
    aliasing one old name is an engine error)."""
    plan = from_values(_one_pool_stack("ct6e-standard-4t", "4x4"), "dev")
    run_under_mocks(lambda: program.build(plan, program.Secrets()), stack="dev", project="p")
    assert ("workspace-namespace", "park") in aliases
    assert ("train-s0", "train") not in aliases  # the same name: nothing to alias
    aliases.clear()
    testing.run(lambda: park_gke.Workspace("workspace", {"project": "p"}), project="p")
    assert aliases == []


# ---- following topology ------------------------------------------------------------------------


def _names_the_field(code: CodeType) -> bool:
    """The code reads or writes the field by name: an attribute, a key or a keyword."""
    words = [*code.co_names, *(c for c in code.co_consts if isinstance(c, str))]
    words += [w for c in code.co_consts if isinstance(c, tuple) for w in c if isinstance(w, str)]
    return any("topology" in w.lower() or w == "numOfHosts" for w in words)


def _files_passing_topology(run: Callable[[], Any]) -> tuple[set[str], Any]:
    """The infra files whose functions, called during `run`, name `topology` or `numOfHosts`:
    the path the value takes. Not counted: infra/rules (judges: they read it, and hand nothing
    on) and module or class bodies (declarations, run at import)."""
    infra_dir = str(ROOT / "infra") + "/"
    called: set[CodeType] = set()

    def tracer(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(infra_dir):
            called.add(frame.f_code)

    sys.settrace(tracer)
    threading.settrace(tracer)
    try:
        result = run()
    finally:
        sys.settrace(None)
        threading.settrace(None)
    files = {
        code.co_filename[len(infra_dir) :]
        for code in called
        if _names_the_field(code)
        and code.co_name != "<module>"
        and code.co_firstlineno > 1
        and not code.co_filename.startswith(infra_dir + "rules/")
        and not _is_class_body(code)
    }
    return files, result


def _is_class_body(code: CodeType) -> bool:
    source = Path(code.co_filename).read_text().splitlines()
    return source[code.co_firstlineno - 1].lstrip().startswith("class ")


def test_topology_reaches_the_node_pool_and_num_of_hosts_through_at_most_8_files() -> None:
    """KubeRay's own v6e-16 sample's slice, as one pool of a stack file: its GKE NodePool is
    placed on the sample's topology, its RayJob's worker group has the sample's numOfHosts, and
    the value passes at most 8 infra files on the way."""
    machine_type, topology, hosts = _sample()
    values = _one_pool_stack(machine_type, topology)
    files, (resources, _) = _files_passing_topology(
        lambda: run_under_mocks(program.main, stack="dev", project="p", config=values)
    )
    assert _placements(resources)["train-s0"] == {"tpuTopology": topology, "type": "COMPACT"}
    (job,) = [r for r in resources if r.type == "kubernetes:ray.io/v1:RayJob"]
    groups = job.inputs["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert [g["numOfHosts"] for g in groups] == [hosts]
    assert "resolve/stack.py" in files and "plan/node_pools.py" in files  # the tracer sees the path
    assert len(files) <= 8, sorted(files)
