"""One resolve per program: the stack program reads, checks and resolves its config once and
hands each component its resolved piece; a component used on its own resolves its own
arguments once. Counted by wrapping infra.resolve.resolve and infra.rules.check wherever a
module holds them, so a call by any route is seen."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

import infra.resolve
import infra.rules
from infra import program
from infra.stack import read_offline
from infra.tools.render import run_under_mocks
from park_gke import testing
from tests.conftest import SHIPPED_STACKS, STACKS_DIR
from tests.infra.test_package import MINIMAL

ZONE = "us-east5-b"
SA = "nodes@p.iam.gserviceaccount.com"
# The packages that may hold resolve or check under a name of their own (a library cannot).
OURS = ("infra", "park_gke", "policy", "tests", "workloads")
SERVE_POOL: Any = {"name": "serve", "machine_type": "ct6e-standard-8t", "topology": "2x4"}


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts of resolve and check calls from here on, by whatever name a module imported them."""
    counted: Counter[str] = Counter()

    def counting(label: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            counted[label] += 1
            return original(*args, **kwargs)

        return wrapper

    for label, original in (("resolve", infra.resolve.resolve), ("check", infra.rules.check)):
        wrapped = counting(label, original)
        for module in [m for n, m in list(sys.modules.items()) if n.split(".")[0] in OURS]:
            held = getattr(module, "__dict__", {})
            for attr, value in list(held.items()):
                if value is original:
                    monkeypatch.setattr(module, attr, wrapped)
    return counted


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_stack_program_resolves_and_checks_once(stack: str, calls: Counter[str]) -> None:
    offline = read_offline(STACKS_DIR / f"Pulumi.{stack}.yaml", stack)
    resources, _ = run_under_mocks(
        program.main,
        stack=offline.stack,
        project=str(offline.values.get("gcp:project", "project")),
        config=offline.values,
        secret_keys=offline.secret_keys,
    )
    assert resources  # the program ran through
    assert dict(calls) == {"resolve": 1, "check": 1}, f"stack {stack}: {dict(calls)}"


def _lone_pool() -> None:
    from park_gke import TpuSlicePool

    TpuSlicePool(
        "train",
        {
            "cluster": "c",
            "location": ZONE,
            "node_service_account": SA,
            "machine_type": "ct6e-standard-4t",
            "topology": "4x4",
        },
    )


def _lone_service() -> None:
    from park_gke import LlmService

    LlmService(
        "chat",
        {
            "project": "p",
            "location": ZONE,
            "pool": SERVE_POOL,
            "models": [{"name": "qwen", "source": "Qwen/Qwen3-1.7B"}],
        },
    )


def _pool_and_service() -> None:
    from park_gke import LlmService, TpuSlicePool

    pool: Any = TpuSlicePool(  # given as `pool`: it stands for its reference
        "serve",
        {
            "cluster": "c",
            "location": ZONE,
            "node_service_account": SA,
            "machine_type": "ct6e-standard-8t",
            "topology": "2x4",
        },
    )
    LlmService(
        "chat",
        {
            "project": "p",
            "location": ZONE,
            "pool": pool,
            "models": [{"name": "qwen", "source": "Qwen/Qwen3-1.7B"}],
        },
    )


@pytest.mark.parametrize(
    ("build", "components"),
    [(_lone_pool, 1), (_lone_service, 1), (_pool_and_service, 2)],
    ids=["TpuSlicePool", "LlmService", "TpuSlicePool+LlmService"],
)
def test_a_component_on_its_own_resolves_its_arguments_once(
    build: Callable[[], None], components: int, calls: Counter[str]
) -> None:
    result = testing.run(build, project="p")
    assert result.resources
    assert calls["resolve"] == components, dict(calls)
    assert calls["check"] <= components, dict(calls)


# Components that plan nothing a stack resolves: KubeRay's charts, the namespace, the APIs, an
# image build and staging Jobs (their pieces come from names and the model's facts).
UNRESOLVED = {"KubeRayOperator", "Workspace", "ProjectApis", "WorkloadImage", "ModelStaging"}


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_every_component_on_its_own_resolves_at_most_once(name: str, calls: Counter[str]) -> None:
    import park_gke

    args, _ = MINIMAL[name]
    component = getattr(park_gke, name)
    result = testing.run(lambda: component("it", dict(args)), project="p")
    assert any(r.type == f"park-gke:index:{name}" for r in result.resources)
    assert calls["resolve"] == (0 if name in UNRESOLVED else 1), dict(calls)
    assert calls["check"] <= 1, dict(calls)


@pytest.mark.parametrize("stack", ["dev", "rl"])
def test_an_offline_render_resolves_and_checks_once(stack: str, calls: Counter[str]) -> None:
    """`park render | validate | cost` read the stack file, then run the program: one resolve
    for both (the plan from_file returns is the one the program builds from)."""
    from infra.tools.render import render_stack_file

    rendered = render_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml", stack)
    assert rendered.resources
    assert dict(calls) == {"resolve": 1, "check": 1}, f"stack {stack}: {dict(calls)}"
