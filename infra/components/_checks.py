"""Strict arguments: a component's args against its own TypedDict before anything is planned.

A misspelt optional key is refused with the nearest known one (it would otherwise be dropped:
`capacty: spot` would bill on-demand); a value of the wrong shape (the pool component where its
reference is meant, a string for a list) is refused naming the argument, never as a TypeError
from inside; an Output where the value must be known while the program runs (a zone, a machine
type: they decide what is planned) is refused as such. A component handed where an argument
takes its value (a TpuSlicePool for `pool`) stands for what it hands on (`as_argument`).
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin, get_type_hints

import pulumi

from infra.schema.errors import nearest
from infra.schema.secrets import redact


def _is_typed_dict(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, dict) and hasattr(hint, "__required_keys__")


def _kind(hint: Any) -> str:
    """What an argument takes, as a message says it."""
    if _is_typed_dict(hint):
        return f"a mapping of {hint.__name__}"
    origin = get_origin(hint)
    if origin is list:
        return f"a list of {_kind(get_args(hint)[0])}"
    if origin is dict or hint is dict:
        return "a mapping"
    if origin in (Union, types.UnionType):
        plain = [a for a in get_args(hint) if not _is_output_type(a)]
        return " or ".join(_kind(a) for a in plain) + " (or an Output)"
    return {str: "a string", int: "an integer", bool: "true or false", float: "a number"}.get(
        hint, str(hint)
    )


def _is_output_type(hint: Any) -> bool:
    origin = get_origin(hint) or hint
    return origin in (pulumi.Output, typing.Awaitable) or getattr(origin, "__name__", "") in (
        "Output",
        "Awaitable",
    )


def _is_unknown(value: Any) -> bool:
    return isinstance(value, pulumi.Output | pulumi.Resource) or hasattr(value, "__await__")


def _shape(value: Any, hint: Any, path: str) -> list[str]:
    """Problems of `value` against `hint` (str, int, bool, list[...], dict, a TypedDict,
    pulumi.Input[...])."""
    if hint is Any or value is None:
        return []
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        choices = get_args(hint)
        if any(_is_output_type(c) for c in choices) and _is_unknown(value):
            return []  # an Input: may be unknown at preview
        plain = [c for c in choices if not _is_output_type(c) and c is not type(None)]
        for choice in plain:
            if not _shape(value, choice, path):
                return []
        return [_wrong(value, hint, path)]
    if _is_unknown(value):
        return [
            f"args.{path}: must be known when the program runs ({_kind(hint)}), got "
            f"{'an Output' if isinstance(value, pulumi.Output) else type(value).__name__}: "
            "pass the plain value (an Output's value is unknown during preview)"
        ]
    if _is_typed_dict(hint):
        if not isinstance(value, Mapping):
            return [_wrong(value, hint, path)]
        return mapping_problems(value, hint, f"{path}.")
    if origin is list:
        if not isinstance(value, list | tuple):
            return [_wrong(value, hint, path)]
        (item,) = get_args(hint)
        return [p for i, v in enumerate(value) for p in _shape(v, item, f"{path}[{i}]")]
    if origin is dict or hint is dict:
        if not isinstance(value, Mapping):
            return [_wrong(value, hint, path)]
        return _unknown_inside(value, path)
    if hint is bool:
        return [] if isinstance(value, bool) else [_wrong(value, hint, path)]
    if hint is int:
        integral = isinstance(value, float) and value.is_integer()  # numbers from the wire
        ok = (isinstance(value, int) and not isinstance(value, bool)) or integral
        return [] if ok else [_wrong(value, hint, path)]
    if hint is str or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        # an enum argument (infra/components/_types.py) takes its plain string too; the rules
        # say which values are allowed
        return [] if isinstance(value, str) else [_wrong(value, str, path)]
    return []


def _unknown_inside(value: Any, path: str) -> list[str]:
    """Outputs inside a plain mapping (training settings, engine kwargs): they are planned
    from, so they must be known; an Output would be planned as its placeholder text."""
    if _is_unknown(value):
        return [
            f"args.{path}: must be known when the program runs, got an Output: pass the plain "
            "value (an Output's value is unknown during preview)"
        ]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in _unknown_inside(v, f"{path}.{k}")]
    if isinstance(value, list | tuple):
        return [p for i, v in enumerate(value) for p in _unknown_inside(v, f"{path}[{i}]")]
    return []


def _wrong(value: Any, hint: Any, path: str) -> str:
    if isinstance(value, pulumi.Resource):
        got = f"a {type(value).__name__} component"
    else:
        got = f"{redact(value)!r}" if isinstance(value, str | int | float) else type(value).__name__
    return f"args.{path} = {got}: expected {_kind(hint)}"


def mapping_problems(args: Mapping[str, Any], typed: Any, prefix: str = "") -> list[str]:
    """Unknown keys (with the nearest known one), missing required keys and wrong shapes."""
    import pulumi.output

    hints = get_type_hints(typed, localns=vars(pulumi.output))  # pulumi.Input's "Output[T]"
    known = list(hints)
    problems = [
        f"args.{prefix}{key}: unknown argument; {nearest(str(key), known)}"
        for key in args
        if key not in hints
    ]
    problems += [
        f"args.{prefix}{key}: required, missing"
        for key in sorted(typed.__required_keys__)
        if args.get(key) is None
    ]
    for key, value in args.items():
        if key in hints:
            problems += _shape(value, hints[key], f"{prefix}{key}")
    return problems


def handed_on(args: Mapping[str, Any]) -> dict[str, Any]:
    """`args` with each component given in an argument's place, or as an item of a list
    argument, replaced by what it hands on there (its `as_argument(field)`), e.g. a
    TpuSlicePool for `pool`, LlmServices among `services`."""
    out = dict(args)
    for key, value in args.items():
        if isinstance(value, list | tuple):
            out[key] = [_handed(key, item) for item in value]
        else:
            out[key] = _handed(key, value)
    return out


def _handed(field: str, value: Any) -> Any:
    # (an Output answers every getattr with an Output: look at components only)
    component = isinstance(value, pulumi.Resource)
    as_argument = getattr(value, "as_argument", None) if component else None
    handed = as_argument(field) if callable(as_argument) else None
    return value if handed is None else handed
