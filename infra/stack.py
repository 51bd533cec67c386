"""The front door of the pipeline: Pulumi config values or a stack file → a validated StackPlan.

`from_values` is what the program calls with the values Pulumi hands it; `from_file` is what
`park render | validate | cost | local` call offline. Both read the spec (infra.schema), run every
rule (infra.rules) and resolve (infra.resolve); a bad stack raises ConfigError with all its
problems before anything is planned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from infra import rules
from infra.resolve import StackPlan
from infra.schema.errors import ConfigError, ConfigProblem
from infra.schema.read import (
    parse_values,
    read_esc_config,
    read_stack_document,
    stack_name_of,
)
from infra.schema.value_checks import provider_credential_warnings


def from_values(
    values: Mapping[str, Any],
    stack: str,
    secret_keys: Collection[str] | None = None,
    *,
    posture: bool = True,
) -> StackPlan:
    plan = rules.check(parse_values(values, stack, secret_keys), posture=posture)
    if secret_keys is None:
        return plan
    said = provider_credential_warnings(values, secret_keys)
    return dataclasses.replace(plan, warnings=(*plan.warnings, *said)) if said else plan


@dataclasses.dataclass(frozen=True)
class OfflineStack:
    """A stack file as `pulumi up` would see it, as far as it can be seen offline."""

    stack: str
    values: dict[str, Any]
    secret_keys: list[str]
    unopened: ConfigProblem | None  # ESC environments imported but not given (--esc-config)


def read_offline(
    path: Path, stack: str | None = None, esc_config: Path | None = None
) -> OfflineStack:
    """The stack file's config over the opened ESC environment's `pulumiConfig` (`esc_config`),
    as Pulumi merges them: the stack file's own keys win. ESC keys keep the secret flags
    Pulumi gives them (infra.schema.read.read_esc_config)."""
    values, secrets, environments = read_stack_document(path)
    name = stack or stack_name_of(path)
    if esc_config is not None:
        from_esc, esc_secrets = read_esc_config(esc_config)
        secrets = [*secrets, *(k for k in esc_secrets if k not in values)]
        values = {**from_esc, **values}
    unopened = None
    if environments and esc_config is None:
        names = ", ".join(environments)
        unopened = ConfigProblem(
            "environment",
            list(environments),
            f"the stack imports Pulumi ESC environment(s) {names}, which park cannot open "
            "offline: the keys their pulumiConfig sets are not seen here. To check the stack "
            f"with them: pulumi config --json --show-secrets --open -s {name} > config.json "
            f"(or: esc env open ENV --format json > config.json), then park <verb> {name} "
            "--esc-config config.json",
        )
    return OfflineStack(name, values, secrets, unopened)


def from_file(path: Path, stack: str | None = None, esc_config: Path | None = None) -> StackPlan:
    """The plan of a stack file. With ESC environments imported and not given, a stack that
    is valid without them carries a warning saying so; one that is not names them too."""
    offline = read_offline(path, stack, esc_config)
    try:
        plan = from_values(offline.values, offline.stack, secret_keys=offline.secret_keys)
    except ConfigError as err:
        if offline.unopened is None:
            raise
        raise ConfigError([*err.problems, offline.unopened]) from None
    if offline.unopened is not None:
        plan = dataclasses.replace(plan, warnings=(*plan.warnings, offline.unopened))
    return plan
