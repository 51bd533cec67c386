"""Shared by the policy tests: a shipped stack's recorded resources, copied for mutation."""

from __future__ import annotations

import copy
from typing import Any

from infra.schema.models import PolicyConfig
from policy.harness import Violation, evaluate
from policy.rules import Settings, settings_for_stack, settings_from
from tests.conftest import STACKS_DIR, render_stack


def resources(stack: str) -> list[dict[str, Any]]:
    """A deep copy of what the program registers for a shipped stack under mocks."""
    return copy.deepcopy([r.as_json() for r in render_stack(stack).resources])


def stack_settings(stack: str) -> Settings:
    return settings_for_stack(stack, STACKS_DIR)


def run(
    records: list[dict[str, Any]], stack: str, settings: Settings | None = None
) -> list[Violation]:
    return evaluate(records, stack, settings or settings_from(PolicyConfig(), stack))


def one(records: list[dict[str, Any]], type_token: str, name: str | None = None) -> dict[str, Any]:
    """The inputs of the single resource of that type (and name)."""
    found = [r for r in records if r["type"] == type_token and (name is None or r["name"] == name)]
    assert len(found) == 1, f"{len(found)} {type_token} {name or ''}"
    return found[0]["inputs"]


def first(records: list[dict[str, Any]], type_token: str) -> dict[str, Any]:
    return next(r["inputs"] for r in records if r["type"] == type_token)
