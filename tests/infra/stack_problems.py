"""What preview refuses a stack's values with: the problems' messages by stack key."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from infra.schema.errors import ConfigError
from infra.schema.read import read_stack_file
from infra.stack import from_values
from tests.conftest import STACKS_DIR


def problems_of(values: dict[str, Any], stack: str = "dev") -> dict[str, str]:
    """Resolve `values` as stack `stack`, which must fail; each problem's message by its key."""
    with pytest.raises(ConfigError) as info:
        from_values(values, stack)
    return {p.key: p.message for p in info.value.problems}


def shipped_values(stack: str) -> dict[str, Any]:
    """A shipped stack's values, a copy to edit, without its (secret) HF token."""
    values, _ = read_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml")
    values = copy.deepcopy(values)
    values.pop("park:hfToken", None)
    return values
