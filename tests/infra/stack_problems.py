"""What preview refuses a stack's values with: the problems' messages by stack key."""

from __future__ import annotations

from typing import Any

import pytest

from infra.schema.errors import ConfigError
from infra.stack import from_values


def problems_of(values: dict[str, Any], stack: str = "dev") -> dict[str, str]:
    """Resolve `values` as stack `stack`, which must fail; each problem's message by its key."""
    with pytest.raises(ConfigError) as info:
        from_values(values, stack)
    return {p.key: p.message for p in info.value.problems}
