"""Reading a stack: Pulumi config values or a stack file → a typed StackConfig.

Values come from Pulumi config (`pulumi config set ...`) when the program runs, or from
`stacks/Pulumi.<stack>.yaml` read offline by `park render` / `park validate`. This module only
maps keys and checks types; `infra.rules` then checks what needs the catalog or several keys.
Credentials never enter the StackConfig: the program reads them as Pulumi secrets.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from infra.schema.errors import ConfigError, ConfigProblem, NotShown, nearest, not_shown
from infra.schema.keys import KEY_OF_FIELD, REQUIRED, key_of, parks_own
from infra.schema.models import SECRET_PLACEHOLDER, StackConfig
from infra.schema.safe import load_yaml, read_bounded
from infra.schema.value_checks import (
    SECRET_KEYS,
    control_problems,
    credential_problems,
    moved_secret_problems,
    provider_credential,
    secret_problems,
    without_secrets,
)


def parse_values(
    values: Mapping[str, Any], stack: str, secret_keys: Collection[str] | None = None
) -> StackConfig:
    """Build a typed StackConfig from `{"gcp:project": ..., "park:tpuPools": [...]}` or raise
    ConfigError with every key problem at once.

    Keys outside `gcp:` / `park:` belong to providers and are ignored here. With `secret_keys`
    (the keys stored as secrets), a credential in plain text is a problem.
    """
    raw: dict[str, Any] = {"stack": stack}
    problems: list[ConfigProblem] = []
    if secret_keys is not None:
        problems += secret_problems(values, secret_keys)
    problems += moved_secret_problems(values)
    problems += credential_problems(values)
    problems += control_problems(
        {k: v for k, v in values.items() if k not in SECRET_KEYS and parks_own(k)}
    )
    values = without_secrets(values)
    known = {v: k for k, v in KEY_OF_FIELD.items()}
    unknown: list[ConfigProblem] = []
    for key, value in values.items():
        if key in known:
            raw[known[key]] = value
        elif key.startswith("park:"):
            unknown.append(_unknown_key(key, key, value, known))
    missing = [
        ConfigProblem(KEY_OF_FIELD[required], None, "required; set it in the stack")
        for required in REQUIRED
        if required not in raw
    ]
    # A top-level typo does not hide the keys inside: the model is judged whatever else is.
    try:
        spec = StackConfig.model_validate(raw)
    except ValidationError as err:
        found = [_model_problem(e) for e in err.errors() if not _reported_missing(e, missing)]
    else:
        found = []
    nested = [p for p in found if _is_unknown(p)]
    rest = [p for p in found if not _is_unknown(p)]
    if problems:  # a credential or a control character: only what quotes no value besides
        quiet = [p for p in rest if p.value is None]
        raise ConfigError([*problems, *unknown, *nested, *missing, *quiet])
    if unknown or missing or found:
        raise ConfigError([*unknown, *nested, *missing, *rest])
    return spec


_UNKNOWN = "unknown key; "


def _unknown_key(key: str, name: str, value: Any, known: Collection[str]) -> ConfigProblem:
    """`name` (at `key`), which no model declares: the nearest known one, and never its value
    (a misspelt name can hold a credential the rules would have looked for under the right
    one)."""
    return ConfigProblem(key, not_shown(value), _UNKNOWN + nearest(name, known))


def _is_unknown(problem: ConfigProblem) -> bool:
    return isinstance(problem.value, NotShown)


def _reported_missing(error: Any, missing: list[ConfigProblem]) -> bool:
    """pydantic's "Field required" for a top-level key REQUIRED already reported."""
    loc = error["loc"]
    return error["type"] == "missing" and len(loc) == 1 and key_of(loc) in {p.key for p in missing}


def _model_problem(error: Any) -> ConfigProblem:
    loc = error["loc"]
    if error["type"] == "extra_forbidden":
        return _unknown_key(key_of(loc), str(loc[-1]), error.get("input"), _keys_at(loc[:-1]))
    if error["type"] == "missing":  # pydantic's input is the whole mapping around the key
        return ConfigProblem(key_of(loc), None, "required; set it")
    return ConfigProblem(key_of(loc), error.get("input"), error["msg"])


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the spec declares at a pydantic location inside StackConfig (camelCase, as a
    stack file spells them): ("tpu_pools", 0) → name, machineType, topology, capacity..."""
    kinds: list[Any] = [StackConfig]
    for part in loc:
        inside: list[Any] = []
        for kind in _concrete(kinds):
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                for name, field in kind.model_fields.items():
                    if part in (name, field.alias):
                        inside.append(field.annotation)
                if part == kind.__name__:  # a union's member, as pydantic names it
                    inside.append(kind)
            elif get_origin(kind) in (list, tuple, set, frozenset) and isinstance(part, int):
                inside += get_args(kind)[:1]
            elif get_origin(kind) is dict:
                inside += get_args(kind)[1:]
        kinds = inside
    models = [k for k in _concrete(kinds) if isinstance(k, type) and issubclass(k, BaseModel)]
    return sorted({f.alias or n for m in models for n, f in m.model_fields.items()})


def _concrete(kinds: list[Any]) -> list[Any]:
    """Types with their unions (X | None, Annotated...) opened."""
    out: list[Any] = []
    kinds = list(kinds)
    while kinds:
        kind = kinds.pop()
        origin = get_origin(kind)
        if origin is not None and origin not in (list, tuple, set, frozenset, dict):
            kinds += [a for a in get_args(kind) if not isinstance(a, str | int | float)]
        else:
            out.append(kind)
    return out


# ---- stack files ----------------------------------------------------------------------------


def _unwrap_secrets(value: Any) -> tuple[Any, bool]:
    """Offline, `secure:` values cannot be decrypted: they become a masked placeholder."""
    if isinstance(value, dict):
        if set(value) == {"secure"}:
            return SECRET_PLACEHOLDER, True
        out, any_secret = {}, False
        for k, v in value.items():
            out[k], s = _unwrap_secrets(v)
            any_secret |= s
        return out, any_secret
    if isinstance(value, list):
        items = [_unwrap_secrets(v) for v in value]
        return [v for v, _ in items], any(s for _, s in items)
    return value, False


class StackFileError(ValueError):
    """A stack file that cannot be read as one: `<file>:<line>: what is wrong`."""


def _line_of(text: str, key: str) -> int:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith(f"{key}:"):
            return number
    return 1


def read_stack_file(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The `config:` block of a Pulumi stack file, and which keys hold secrets.

    Raises StackFileError (file and line, no contents echoed) for a file that is not UTF-8,
    not YAML, or not a mapping with a `config:` mapping."""
    values, secrets, _ = read_stack_document(path)
    return values, secrets


def read_stack_document(path: Path) -> tuple[dict[str, Any], list[str], tuple[str, ...]]:
    """read_stack_file's values and secret keys, and the Pulumi ESC environments the file
    imports (`environment:`, a list of `<project>/<env>` names, merged in order)."""
    try:
        raw = read_bounded(path)
    except yaml.YAMLError as err:
        raise StackFileError(f"{path}:1: {getattr(err, 'problem', None) or err}") from None
    except OSError as err:
        why = err.strerror or type(err).__name__
        raise StackFileError(f"{path}: cannot read it ({why})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise StackFileError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[err.start]:02x}); save it as UTF-8"
        ) from None
    try:
        document = load_yaml(text)  # bounded: size, depth, alias expansion
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        problem = getattr(err, "problem", None) or "cannot be parsed"
        raise StackFileError(f"{path}:{line}: not YAML: {problem}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise StackFileError(
            f"{path}:1: a stack file is a YAML mapping with a `config:` key, not a "
            f"{type(document).__name__}"
        )
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise StackFileError(
            f"{path}:{_line_of(text, 'config')}: `config:` must be a mapping of keys to values, "
            f"not a {type(config).__name__}"
        )
    environments = document.get("environment") or []
    if isinstance(environments, str):
        environments = [environments]
    if not isinstance(environments, list) or not all(isinstance(e, str) for e in environments):
        raise StackFileError(
            f"{path}:{_line_of(text, 'environment')}: `environment:` must be a list of ESC "
            "environment names (<project>/<environment>)"
        )
    values, secrets = {}, []
    for key, value in config.items():
        values[key], is_secret = _unwrap_secrets(value)
        if is_secret:
            secrets.append(key)
    return values, secrets, tuple(environments)


def read_esc_values(path: Path) -> dict[str, Any]:
    """The Pulumi config a stack's ESC environments give it, read from a file (read_esc_config
    without the secret flags)."""
    return read_esc_config(path)[0]


def read_esc_config(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The Pulumi config a stack's ESC environments give it, read from a file, and which of
    its keys Pulumi holds as secrets.

    `path` holds what `pulumi config --json --show-secrets --open -s STACK` prints (the stack's
    config with its environments merged, as `pulumi up` sees it: each key carries Pulumi's own
    `secret` flag, kept here), or what `esc env open ENV --format json` prints (one
    environment: its `pulumiConfig` is used; it prints no flags, so only the credential keys,
    which come from the environment rather than the committed file, count as secret), or a
    plain mapping of config keys; JSON or YAML. Values must be resolved: a definition holding
    `${...}` interpolations or `fn::` functions (fn::secret, fn::open...) is refused, because
    only ESC resolves them: an unopened `fn::secret` is ciphertext, not the value."""
    try:
        document = load_yaml(read_bounded(path))  # JSON is YAML; bounded
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        problem = getattr(err, "strerror", None) or getattr(err, "problem", None) or "unreadable"
        raise StackFileError(f"{path}: cannot read it as JSON or YAML: {problem}") from None
    if isinstance(document, dict) and isinstance(document.get("values"), dict):
        document = document["values"]  # an environment definition rather than its opened form
    if isinstance(document, dict) and "pulumiConfig" in document:
        document = document["pulumiConfig"]
    if not isinstance(document, dict) or not all(isinstance(k, str) for k in document):
        raise StackFileError(
            f"{path}: expected what `pulumi config --json --show-secrets --open` or `esc env "
            "open ENV --format json` prints, or a mapping of config keys"
        )
    if document and all(_is_cli_config_entry(v) for v in document.values()):
        secrets = sorted(k for k, entry in document.items() if entry.get("secret") is True)
        document = {key: _cli_config_value(entry) for key, entry in document.items()}
    else:
        # No flags: the credential keys are secrets, park's and the providers' (what ESC's
        # fn::secret or a login provider such as gcp-login gives, e.g. gcp:accessToken).
        secrets = sorted(
            k for k, v in document.items() if k in SECRET_KEYS or provider_credential(k, v)
        )
    unresolved = sorted(k for k, v in document.items() if _unresolved(v))
    if unresolved:
        raise StackFileError(
            f"{path}: {', '.join(unresolved)} hold ${{...}} interpolations or fn:: functions "
            "(fn::secret...) only ESC resolves; pass what `esc env open ENV --format json` "
            "prints instead of the definition"
        )
    return dict(document), secrets


def _unresolved(value: Any) -> bool:
    """A value still holding ESC syntax: `${...}`, or a mapping key `fn::...`."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str) and "${" in item:
            return True
        if isinstance(item, dict):
            if any(isinstance(k, str) and k.startswith("fn::") for k in item):
                return True
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _is_cli_config_entry(value: Any) -> bool:
    """`pulumi config --json` prints each key as {"value": ..., "secret": ..., "objectValue"?}."""
    return (
        isinstance(value, dict)
        and "secret" in value
        and ("value" in value or "objectValue" in value)
    )


def _cli_config_value(entry: dict[str, Any]) -> Any:
    if "objectValue" in entry:
        return entry["objectValue"]
    if entry.get("value") == "[unknown]":
        raise StackFileError(
            "an ESC value shows as [unknown]: run `pulumi config` with --open (and --show-secrets)"
        )
    return entry.get("value")


def stack_name_of(path: Path) -> str:
    """`stacks/Pulumi.dev.yaml` → `dev`."""
    name = path.name
    return name[len("Pulumi.") : -len(".yaml")] if name.startswith("Pulumi.") else path.stem
