"""The stack's job keys and the RayTrainingJob's argument, written from the one declaration of
each: the workload's flag (a field with `stack=` of workloads/train/config.py `TrainConfig`,
workloads/rl/config.py `RLRunConfig`).

`python -m infra.tools.fields` rewrites the marked blocks of infra/schema/jobs.py (the Literal of
each named choice, the keys of `TrainingConfig` and `RlConfig`) and of infra/components/_args.py
(`TrainingArgs`: every training key but `enabled`, `pool` and `image`, typed with the provider's
enums, described as the key is with its default); a test fails when they are stale.

Written, not built at import: mypy (with its pydantic plugin) types every `spec.<key>` infra
reads, and Pulumi's schema analyzer reads each argument's description from source, so both need
these classes as source. `workloads/` never imports `infra`, so the declaration sits there.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import types
import typing
from dataclasses import Field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from workloads.flags import StackKey, stack_default, stack_keys, stack_name
from workloads.rl.config import RLRunConfig
from workloads.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "infra" / "schema" / "jobs.py"
ARGS = ROOT / "infra" / "components" / "_args.py"
# The stack keys that are not component arguments: the component is the enabled job on a pool,
# with an image of its own argument.
NOT_ARGUMENTS = ("enabled", "pool", "image")
_TYPES = {bool: "bool", int: "int", float: "float", str: "str"}
# The job sections whose keys are a workload's flags: block name → the workload's config.
LINE_LENGTH = 100  # pyproject's [tool.ruff] line-length
SECTIONS: dict[str, type] = {"training": TrainConfig, "rl": RLRunConfig}


def _py(value: Any) -> str:
    """A value as ruff-formatted Python source."""
    if isinstance(value, str):
        if "\\" in value and '"' not in value:
            return f'r"{value}"'
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return f"[{', '.join(_py(v) for v in value)}]"
    return repr(value)


def _stack_type(f: Field[Any], key: StackKey) -> str:
    base = key.enum or (str(key.type) if key.type else _TYPES[f.metadata["type"]])
    if not key.enum and f.metadata["choices"]:
        base = f"Literal[{', '.join(_py(c) for c in f.metadata['choices'])}]"
    return f"{base} | None" if stack_default(f, key) is None else base


def _stack_value(f: Field[Any], key: StackKey) -> str:
    bounds = dict(key.bounds)
    if f.metadata["type"] is float and key.type is None:  # a stack number is a finite one
        bounds["allow_inf_nan"] = False
    default = _py(stack_default(f, key))
    if not bounds:
        return default
    return f"Field({', '.join([default, *(f'{k}={_py(v)}' for k, v in bounds.items())])})"


def _doc(text: str, indent: str) -> str:
    assert '"""' not in text and not text.endswith("\\"), text
    return f'{indent}"""{text}"""'


def _literal(name: str, choices: tuple[object, ...]) -> str:
    """`Name = Literal[...]` on one line, or one choice a line past the line length (as
    `ruff format` would write it, so the generated block is already formatted)."""
    one_line = f"{name} = Literal[{', '.join(_py(c) for c in choices)}]"
    if len(one_line) <= LINE_LENGTH:
        return one_line
    return "\n".join([f"{name} = Literal[", *(f"    {_py(c)}," for c in choices), "]"])


def enum_block(config: type) -> str:
    """`Name = Literal[...]` for each key whose choices are named (`stack(enum=...)`)."""
    return "\n".join(
        _literal(key.enum, tuple(f.metadata["choices"]))
        for f, key in stack_keys(config)
        if key.enum
    )


def spec_block(config: type) -> str:
    """The pydantic fields of the stack keys, in the trainer's flag order."""
    lines = []
    for f, key in stack_keys(config):
        lines.append(f"    {stack_name(f, key)}: {_stack_type(f, key)} = {_stack_value(f, key)}")
        lines.append(_doc(key.doc, "    "))
    return "\n".join(lines)


def _arg_type(model: type[BaseModel], name: str, config: type) -> str:
    """A component argument's type: the provider's enum for a named Literal (`_types.XArg`, a
    `SPEC_ENUMS` entry of infra/components/_types.py), a string for an unnamed one (the spec
    refuses another value at preview), else the value's own type; optional values are
    arguments left out."""
    annotation = model.model_fields[name].annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (annotation,) = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        enum = [key.enum for f, key in stack_keys(config) if stack_name(f, key) == name]
        return f"_types.{enum[0]}Arg" if enum and enum[0] else "str"
    assert isinstance(annotation, type), (name, annotation)
    return _TYPES[annotation]


def args_block(model: type[BaseModel] | None = None, config: type = TrainConfig) -> str:
    """TrainingArgs' fields: the training keys of the stack but NOT_ARGUMENTS, each described
    as the key is, with its default (`_types.spec_doc`)."""
    from infra.components import _types
    from infra.schema import jobs

    model = model or jobs.TrainingConfig
    lines = []
    for name in model.model_fields:
        if name in NOT_ARGUMENTS:
            continue
        lines.append(f"    {name}: NotRequired[{_arg_type(model, name, config)}]")
        lines.append(_doc(_types.spec_doc(model, name), "    "))
    return "\n".join(lines)


def _marker(name: str, end: bool = False) -> str:
    return f"# {'END' if end else 'BEGIN'} generated {name}"


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the lines between its `name` markers replaced by `body`."""
    pattern = re.compile(
        rf"(^[ \t]*{re.escape(_marker(name))}[^\n]*\n).*?(^[ \t]*{re.escape(_marker(name, True))})",
        re.S | re.M,
    )
    if not pattern.search(text):
        raise ValueError(f"no {name} block")
    return pattern.sub(lambda m: f"{m.group(1)}{body}\n{m.group(2)}", text)


def spec_text(sections: dict[str, type] = SECTIONS) -> str:
    """infra/schema/jobs.py with each section's blocks written from its workload's config."""
    text = SPEC.read_text()
    for name, config in sections.items():
        text = replace_block(text, f"{name}-enums", enum_block(config))
        text = replace_block(text, f"{name}-keys", spec_block(config))
    return text


def args_text(model: type[BaseModel] | None = None, config: type = TrainConfig) -> str:
    """infra/components/_args.py with TrainingArgs written from `model`'s keys."""
    return replace_block(ARGS.read_text(), "training-args", args_block(model, config))


def main() -> int:
    SPEC.write_text(spec_text())
    from infra.schema import jobs

    model = importlib.reload(jobs).TrainingConfig  # the keys just written
    ARGS.write_text(args_text(model))
    print(f"updated {SPEC.relative_to(ROOT)}, {ARGS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
