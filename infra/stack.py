"""The front door of the pipeline: Pulumi config values or a stack file → a validated StackPlan.

`from_values` is what the program calls with the values Pulumi hands it; `from_file` is what
`park render | validate | cost | local` call offline. Both read the spec (infra.spec), run every
rule (infra.rules) and resolve (infra.resolve); a bad stack raises ConfigError with all its
problems before anything is planned.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from infra import rules
from infra.resolve import StackPlan
from infra.spec.read import parse_values, read_stack_file, stack_name_of


def from_values(
    values: Mapping[str, Any], stack: str, secret_keys: Collection[str] | None = None
) -> StackPlan:
    return rules.check(parse_values(values, stack, secret_keys))


def from_file(path: Path, stack: str | None = None) -> StackPlan:
    values, secrets = read_stack_file(path)
    return from_values(values, stack or stack_name_of(path), secret_keys=secrets)
