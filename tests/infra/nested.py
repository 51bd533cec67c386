"""Reading nested inputs (a resource's, a manifest): every mapping inside them, at any depth."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def mappings(node: Any) -> Iterator[dict[str, Any]]:
    """Each dict in `node` (itself too), through dicts and lists, outermost first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from mappings(value)
    elif isinstance(node, list):
        for value in node:
            yield from mappings(value)
