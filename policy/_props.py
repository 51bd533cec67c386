"""Reading resource inputs the way the Pulumi engine hands them to a policy.

Inputs arrive camelCase, as read-only mappings (not dicts), with every number a float and
Kubernetes quantities as strings. These helpers accept all of those shapes, so a rule never
depends on whether it runs under `pulumi preview` or the offline harness.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")


def get(value: Any, path: str, default: Any = None) -> Any:
    """``get(props, "nodeConfig.workloadMetadataConfig.mode")``: None-safe nested lookup.
    Keys with dots in them (``google.com/tpu``, annotations) need ``mapping(...).get(key)``."""
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return default
        value = value[part]
    return value


def as_int(value: Any) -> int | None:
    """2, 2.0 and "2" are 2; anything else (bools, "500m", None) is None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def is_true(value: Any) -> bool:
    """True for True and "true" (Kubernetes annotations and provider flags are strings)."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def items(value: Any) -> list[Any]:
    """A list-valued input as a list; absent or scalar becomes []."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    return []


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def strings(value: Any) -> Iterator[tuple[str, str]]:
    """Every string leaf of a nested input with its dotted path."""

    def walk(node: Any, path: str) -> Iterator[tuple[str, str]]:
        if isinstance(node, str):
            yield path, node
        elif isinstance(node, Mapping):
            for key in node:
                yield from walk(node[key], f"{path}.{key}" if path else str(key))
        elif isinstance(node, Sequence) and not isinstance(node, bytes):
            for i, item in enumerate(node):
                yield from walk(item, f"{path}[{i}]")

    yield from walk(value, "")


def stack_of(urn: str) -> str:
    """``urn:pulumi:prod::park-gke::type::name`` → ``prod``."""
    if urn.startswith("urn:pulumi:"):
        return urn[len("urn:pulumi:") :].split("::", 1)[0]
    return ""


def is_zone(location: Any) -> bool:
    return isinstance(location, str) and bool(_ZONE_RE.match(location))


def fmt(value: Any) -> str:
    """Numbers as the stack author wrote them (4, not 4.0)."""
    number = as_int(value)
    return str(number) if number is not None and not isinstance(value, str) else repr(value)
