"""Run configs whose fields are their own CLI flags: one definition per field, for the training
and the RL entrypoints alike (workloads/train/config.py, workloads/rl/config.py).

A field made with :func:`opt` carries its help text, type and choices; :func:`from_mapping`
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
from dataclasses import MISSING, Field, asdict, field, fields
from pathlib import Path
from typing import Any, Self, TypeVar, cast

from workloads.protocol import field_of, flag

T = TypeVar("T")


class ConfigError(ValueError):
    """A flag combination that cannot run; the message says which flag to change."""


def opt(default: Any, help: str, *, type: Any = str, choices: Sequence[str] | None = None) -> Any:
    """A dataclass field that also describes its CLI flag."""
    return field(default=default, metadata={"help": help, "type": type, "choices": choices})


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
