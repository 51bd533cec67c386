"""Run configs whose fields are their own CLI flags: one definition per field, for the training
and the RL entrypoints alike (workloads/train/config.py, workloads/rl/config.py).

A field made with :func:`opt` carries its help text, type and choices, and, when a key of the
stack's job section sets it, that key (:class:`StackKey`): the one declaration infra builds the
stack schema, the component arguments and the entrypoint's flags from. :func:`from_mapping`
reads a config file's or a plan's values into the dataclass (names with dashes or
underscores, values coerced to the field's type), :func:`build_parser` turns the fields into
flags, and :func:`merge_args` applies the precedence defaults < ``--config FILE`` < flags;
:func:`parse_config`, :func:`changed_values` and :func:`run_main` are the steps both entrypoints
take. Torch-free: the infra side reads these configs to check a run before it exists.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Self, TypeVar, cast

from workloads.protocol import field_of, flag, word

T = TypeVar("T")


class ConfigError(ValueError):
    """A flag combination that cannot run; the message says which flag to change."""


# The runs a stack key's flag is rendered on (see StackKey.runs).
EVERY_RUN, MODEL_RUNS, PRESET_RUNS = "every", "model", "preset"
_SAME = object()  # a stack default that is the flag's own


@dataclass(frozen=True)
class StackKey:
    """A flag as a key of the stack's job section (park:training, park:rl): what infra derives
    the stack schema, the component argument and the rendered flag from. Its type is the
    flag's (a Literal of its choices; optional when the stack default is None)."""

    doc: str
    """The key's description: README's config reference, the component argument's."""
    default: Any = _SAME
    """The stack's default (a cloud run's), when it is not the flag's (a laptop run's)."""
    key: str = ""
    """The key's snake_case name, when it is not the field's (`lr` is `learning_rate`)."""
    enum: str = ""
    """The name of the key's choices as a type (the stack's Literal, the provider's enum)."""
    type: Any = None
    """The stack value's type, when not the flag's: a list for a comma-separated flag."""
    runs: str = EVERY_RUN
    """`model`: a Hugging Face model run's flag, given to a preset run only when set (so the
    trainer judges it); `preset`: a GPT preset run's only."""
    bounds: Mapping[str, Any] = field(default_factory=dict)
    """Constraints of the stack value (pydantic's: ge, gt, le, max_length, pattern)."""


def stack(
    doc: str,
    *,
    default: Any = _SAME,
    key: str = "",
    enum: str = "",
    type: Any = None,
    runs: str = EVERY_RUN,
    **bounds: Any,
) -> StackKey:
    """A flag's stack key (see StackKey); `bounds` are pydantic Field constraints."""
    return StackKey(doc, default, key, enum, type, runs, bounds)


def opt(
    default: Any,
    help: str,
    *,
    type: Any = str,
    choices: Sequence[str] | None = None,
    stack: StackKey | None = None,
) -> Any:
    """A dataclass field that also describes its CLI flag (and its stack key, if any)."""
    meta = {"help": help, "type": type, "choices": choices, "stack": stack}
    return field(default=default, metadata=meta)


def stack_keys(cls: type) -> list[tuple[Field[Any], StackKey]]:
    """The fields of a config dataclass a stack key sets, in the dataclass's order."""
    return [(f, f.metadata["stack"]) for f in fields(cls) if f.metadata.get("stack")]


def stack_default(f: Field[Any], key: StackKey) -> Any:
    """A stack key's default: its own, or the flag's."""
    return f.default if key.default is _SAME else key.default


def stack_name(f: Field[Any], key: StackKey) -> str:
    """A stack key's snake_case name: its own, or the flag's."""
    return key.key or f.name


def stack_flags(
    cls: type, section: Any, planned: Mapping[str, Any], *, with_model: bool
) -> dict[str, Any]:
    """The flags an entrypoint of `cls` gets from a stack: in the dataclass's order, each
    `planned` value (the plan's: pool facts, counts) or else the stack key's value read from
    `section` (a list joined with commas); None values left out. `with_model`: a Hugging Face
    model run (see StackKey.runs)."""
    unknown = sorted(set(planned) - {f.name for f in fields(cls)})
    if unknown:
        raise ValueError(f"not flags of {cls.__name__}: {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for f in fields(cls):
        key = f.metadata.get("stack")
        if f.name in planned:
            value = planned[f.name]
        elif key is None or (key.runs == PRESET_RUNS and with_model):
            continue
        else:
            value = getattr(section, stack_name(f, key))
            if key.runs == MODEL_RUNS and not with_model and value == stack_default(f, key):
                continue
        if isinstance(value, list | tuple):
            value = ",".join(word(v) for v in value)
        if value is not None:
            out[f.name] = value
    return out


class FlagConfig:
    """The base of a config dataclass whose fields are flags: it reads and writes mappings."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(cast(Any, self))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Self:
        """From a mapping of field names (dashes or underscores); values coerced to the fields'
        types, unknown names refused."""
        return from_mapping(cls, values, ConfigError)


def _coerce(spec: Field[Any], value: Any, error: type[Exception]) -> Any:
    """A config-file value as the field's type (YAML may give '1e-3', 4 for 4.0, or a list for a
    comma-separated flag)."""
    if value is None:
        return None
    kind = spec.metadata["type"]
    if kind is str and isinstance(value, list | tuple):
        return ",".join(str(v) for v in value)
    try:
        if kind is bool:
            if isinstance(value, str):
                return value.strip().lower() in ("1", "true", "yes", "on")
            return bool(value)
        return kind(value)
    except (TypeError, ValueError) as err:
        raise error(f"{flag(spec.name)}: cannot read {value!r} as {kind.__name__}") from err


def from_mapping(cls: Callable[..., T], values: Mapping[str, Any], error: type[Exception]) -> T:
    """`cls` from a mapping of field names (dashes or underscores); unknown names refused."""
    known = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    normalized = {field_of(str(k)): v for k, v in values.items()}
    unknown = sorted(set(normalized) - set(known))
    if unknown:
        raise error(f"unknown config keys: {', '.join(unknown)}")
    return cls(**{k: _coerce(known[k], v, error) for k, v in normalized.items()})


def build_parser(cls: type, *, prog: str, description: str) -> argparse.ArgumentParser:
    """One flag per field; every default None, so that only given flags override the file."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="YAML or JSON file whose keys are flag names")
    for f in fields(cls):
        meta = f.metadata
        default = f.default if f.default is not MISSING else None
        text = meta["help"] if default is None else f"{meta['help']} (default: {default})"
        text = text.replace("%", "%%")  # argparse formats help with %
        if meta["type"] is bool:
            parser.add_argument(
                flag(f.name),
                dest=f.name,
                default=None,
                help=text,
                action=argparse.BooleanOptionalAction,
            )
        else:
            parser.add_argument(
                flag(f.name),
                dest=f.name,
                default=None,
                help=text,
                type=meta["type"],
                choices=meta["choices"],
            )
    return parser


def merge_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    load: Callable[[str], dict[str, Any]],
) -> dict[str, Any]:
    """The given flags over the ``--config`` file's values (read with `load`)."""
    args = vars(parser.parse_args(argv))
    path = args.pop("config")
    merged: dict[str, Any] = load(path) if path else {}
    merged = {str(k).replace("-", "_"): v for k, v in merged.items()}
    merged.update({k: v for k, v in args.items() if v is not None})
    return merged


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML or JSON mapping (JSON is YAML, but JSON needs no PyYAML)."""
    text = Path(path).read_text()
    if str(path).endswith(".json"):
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of flag names to values")
    return data


def parse_config(
    cls: Callable[..., T],
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    validate: Callable[[T], None],
) -> T:
    """CLI flags over the config file over the defaults, read into `cls` and validated."""
    cfg = from_mapping(cls, merge_args(parser, argv, load_config_file), ConfigError)
    validate(cfg)
    return cfg


def changed_values(cfg: Any) -> dict[str, Any]:
    """The fields of a config dataclass whose values differ from their defaults: what an
    entrypoint renders (the rest the workload's own defaults give)."""
    return {f.name: getattr(cfg, f.name) for f in fields(cfg) if getattr(cfg, f.name) != f.default}


def run_main(
    prog: str,
    argv: Sequence[str] | None,
    parse: Callable[[Sequence[str] | None], Any],
    launcher: str,
) -> int:
    """An entrypoint's ``main``: parse the flags, then ``run(cfg)`` of the `launcher` module,
    imported only once the flags are valid (it imports Ray and torch). 2 when the config is
    refused (before or at launch), 1 when the run did not succeed."""
    try:
        cfg = parse(argv)
        summary = importlib.import_module(launcher).run(cfg)
    except ConfigError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    return 0 if summary["status"] == "succeeded" else 1
