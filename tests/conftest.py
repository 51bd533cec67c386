"""Shared fixtures: every shipped stack, rendered once per session under Pulumi mocks."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STACKS_DIR = ROOT / "stacks"
SHIPPED_STACKS = sorted(
    p.name[len("Pulumi.") : -len(".yaml")] for p in STACKS_DIR.glob("Pulumi.*.yaml")
)

_rendered: dict[str, object] = {}


def render_stack(stack: str):
    """The stack rendered under mocks (cached: the Pulumi runtime is process-global)."""
    from infra.tools.render import render_stack_file

    if stack not in _rendered:
        _rendered[stack] = render_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml", stack)
    return _rendered[stack]


@pytest.fixture(params=SHIPPED_STACKS)
def rendered(request):
    return render_stack(request.param)


def pytest_collection_modifyitems(config, items):
    if not SHIPPED_STACKS:
        raise pytest.UsageError("no stacks/Pulumi.*.yaml found: nothing to test")


@pytest.fixture(autouse=True, scope="session")
def _offline_model_facts():
    """Model facts come from local folders and the committed catalogue in tests: the hub is
    never asked (the machine may be offline; answers would drift)."""
    import os

    previous = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield
    if previous is None:
        os.environ.pop("HF_HUB_OFFLINE", None)
    else:
        os.environ["HF_HUB_OFFLINE"] = previous
