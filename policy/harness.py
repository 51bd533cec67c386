"""Run the pack's rules offline over recorded resources, as the Pulumi engine would.

`park render` records every resource's inputs under mocks; this feeds them to the same
validator functions `pulumi preview --policy-pack policy` calls, in the engine's shapes:
read-only, unknown-checking mappings with every number a float. Used by tests/policy and
usable by any command that wants policy results without the Pulumi CLI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, UnknownValueError, unknown_checking_proxy

from infra.schema.models import PolicyConfig
from policy.rules import RULES, Rule, Settings, bound, settings_from

PROJECT = "park-gke"
RENDERED_UNKNOWN = "[unknown]"  # what infra.tools.render writes for a value unknown under mocks


@dataclass(frozen=True)
class Violation:
    rule: str
    level: str
    resource: str  # resource name; "" for the stack
    message: str

    def __str__(self) -> str:
        return f"[{self.level}] {self.rule}: {self.message}"


def _wire(value: Any) -> Any:
    """Inputs as the engine sends them: numbers as floats, unknowns as the SDK's sentinel."""
    if isinstance(value, Mapping):
        return {k: _wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if value == RENDERED_UNKNOWN:
        return UNKNOWN_STRING_VALUE
    return value


def urn(stack: str, type_token: str, name: str) -> str:
    return f"urn:pulumi:{stack}::{PROJECT}::{type_token}::{name}"


def _record(resource: Any) -> Mapping[str, Any]:
    return resource.as_json() if hasattr(resource, "as_json") else resource


def _options(parent: str | None) -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [], parent)


def stack_args(resources: Iterable[Any], stack: str) -> StackValidationArgs:
    return StackValidationArgs(
        [PolicyResource(*_seen(r, stack), None, None, [], {}) for r in resources]
    )


def _seen(resource: Any, stack: str) -> tuple[str, Any, str, str, PolicyResourceOptions]:
    """What a policy sees of one recorded resource, first in both of the SDK's argument
    classes: type, inputs (unknowns raise when read), URN, name, options."""
    r = _record(resource)
    props = unknown_checking_proxy(_wire(r.get("inputs") or {}))
    return r["type"], props, urn(stack, r["type"], r["name"]), r["name"], _options(r.get("parent"))


def _reporter(
    violations: list[Violation], rule: str, level: str, resource: str
) -> Callable[..., None]:
    """A report_violation that records into `violations` (a URN, when given, names the
    resource; otherwise the resource under validation)."""

    def report(message: str, urn_: str | None = None) -> None:
        on = urn_.rsplit("::", 1)[-1] if urn_ else resource
        violations.append(Violation(rule, level, on, message))

    return report


def evaluate(
    resources: Iterable[Any],
    stack: str,
    settings: Settings | None = None,
    rules: Iterable[Rule] = RULES,
) -> list[Violation]:
    """Every violation of every enabled rule over a stack's recorded resources. A rule that
    touches an unknown value is skipped for that resource, as `pulumi preview` does."""
    settings = settings or settings_from(PolicyConfig(), stack)
    records = [_record(r) for r in resources]
    # What each rule sees of a resource, built once: the proxies only read (the engine, too,
    # sends a resource once for every policy of a pack).
    seen = [(record["name"], _seen(record, stack)) for record in records]
    violations: list[Violation] = []
    for rule in rules:
        level = settings.levels[rule.name]
        if level == "disabled":
            continue
        validate = bound(rule, settings)
        if rule.stack:
            with suppress(UnknownValueError):
                validate(stack_args(records, stack), _reporter(violations, rule.name, level, ""))
            continue
        for name, parts in seen:
            report = _reporter(violations, rule.name, level, name)
            with suppress(UnknownValueError):
                validate(ResourceValidationArgs(*parts, None, {}), report)
    return violations
