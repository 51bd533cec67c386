"""Reading a stack: Pulumi config values or a stack file → a typed StackConfig.

Values come from Pulumi config (`pulumi config set ...`) when the program runs, or from
`stacks/Pulumi.<stack>.yaml` read offline by `park render` / `park validate`. This module only
maps keys and checks types; `infra.rules` then checks what needs the catalog or several keys.
Credentials never enter the StackConfig: the program reads them as Pulumi secrets.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from infra.schema.errors import ConfigError, ConfigProblem
from infra.schema.models import SECRET_PLACEHOLDER, StackConfig
from infra.schema.safe import load_yaml, read_bounded
from infra.schema.secrets import credentials_in, secret_named

# Top-level model fields and the config key each comes from.
_KEY_OF_FIELD = {
    "project": "gcp:project",
    "region": "gcp:region",
    **{
        name: f"park:{to_camel(name)}"
        for name in StackConfig.model_fields
        if name not in ("project", "region", "stack")
    },
}
REQUIRED = ("project", "region", "zone")

# Config keys that hold credentials: `pulumi config set --secret <key> <value>`.
SECRET_KEYS = ("park:hfToken", "park:iapOauthClientSecret")
# Where a credential used to live: the problem says where it went (never the value).
MOVED_SECRETS = {("park:serving", "hfToken"): "park:hfToken"}
_HIDDEN = "<plain text, not shown>"


def parks_own(key: str) -> bool:
    """A key park reads (park:*, and the gcp:* keys it takes from the provider's namespace).
    Every other key (gcp:accessToken, kubernetes:kubeconfig...) is a provider's: the provider
    reads it, park never writes it anywhere, so park's secret rules do not judge it."""
    return key.startswith("park:") or key in _KEY_OF_FIELD.values()


def config_keys() -> list[str]:
    """Every config key the program reads, e.g. "gcp:project", "park:tpuPools"."""
    return list(_KEY_OF_FIELD.values())


def key_of(loc: tuple[int | str, ...]) -> str:
    """The config key of a pydantic error location: ("tpu_pools", 0, "topology") →
    "park:tpuPools[0].topology"."""
    head, *rest = loc
    key = _KEY_OF_FIELD.get(str(head), f"park:{head}")
    for part in rest:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key


def _without_secrets(values: Mapping[str, Any]) -> dict[str, Any]:
    """The values with every credential replaced by SECRET_PLACEHOLDER: the spec knows that a
    token is set (a gated model needs one), never what it is."""
    out = dict(values)
    for key in SECRET_KEYS:
        if key in out:
            out[key] = SECRET_PLACEHOLDER if out[key] not in (None, "") else None
    for (key, field), _ in MOVED_SECRETS.items():
        section = out.get(key)
        if isinstance(section, Mapping) and field in section:
            out[key] = {k: v for k, v in section.items() if k != field}
    return out


def moved_secret_problems(values: Mapping[str, Any]) -> list[ConfigProblem]:
    """A credential under a key it no longer lives at: say where it goes (never the value)."""
    problems = []
    for (key, field), new in MOVED_SECRETS.items():
        section = values.get(key)
        if isinstance(section, Mapping) and section.get(field) not in (None, ""):
            problems.append(
                ConfigProblem(
                    f"{key}.{field}",
                    _HIDDEN,
                    f"moved to {new} (one token for training and serving, and a key an ESC "
                    f"environment can set): pulumi config rm --path '{key}.{field}'; "
                    f"pulumi config set --secret {new} <value>",
                )
            )
    return problems


def _field_names(model: type[BaseModel], into: set[str]) -> set[str]:
    """Every key the spec declares (camelCase and snake_case), nested models included."""
    for name, field in model.model_fields.items():
        into |= {name, to_camel(name)}
        for kind in (field.annotation, *getattr(field.annotation, "__args__", ())):
            for inner in (kind, *getattr(kind, "__args__", ())):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    _field_names(inner, into)
    return into


# Spec fields are never credentials by their name (iapOauthSecret holds a Secret's *name*);
# free-form keys (engineKwargs, env vars) named like one are.
# The credential's own field (hfToken) is a credential wherever else it appears.
_SPEC_FIELDS = frozenset(
    _field_names(StackConfig, set())
    - {"hf_token", "hfToken", "iap_oauth_client_secret", "iapOauthClientSecret"}
)


def credential_problems(values: Mapping[str, Any]) -> list[ConfigProblem]:
    """A credential anywhere but park:hfToken: in engine arguments, a URL's user-info or
    query, a prices source, a Secret's name... It would be rendered in clear into manifests,
    resources.json and the Pulumi state, so it is refused, naming the key (never the value)."""
    problems = []
    moved = {f"{key}.{field}" for key, field in MOVED_SECRETS}
    for key, value in values.items():
        if key in SECRET_KEYS or not isinstance(key, str) or not parks_own(key):
            continue
        for path, what in credentials_in(value, key, fields=_SPEC_FIELDS):
            if path in moved:
                continue  # moved_secret_problems says where it goes
            problems.append(
                ConfigProblem(
                    path,
                    _HIDDEN,
                    f"holds {what}: a credential outside park:hfToken would be written in clear "
                    "into the manifests, resources.json and the Pulumi state. Remove it; give "
                    "the Hugging Face token as park:hfToken (pulumi config set --secret), and "
                    "other credentials through a Kubernetes Secret created out of band",
                )
            )
    return problems


def provider_credential(key: str, value: Any) -> bool:
    """A provider's key holding a credential (named like one, or holding one)."""
    if parks_own(key) or value in (None, ""):
        return False
    return secret_named(key.split(":", 1)[-1]) or any(credentials_in(value, key))


def provider_credential_warnings(
    values: Mapping[str, Any], secret_keys: Collection[str]
) -> list[ConfigProblem]:
    """A provider's credential stored in plain text: park does not judge it (the provider
    reads it, park never writes it), but a stack file is committed, so it is said."""
    return [
        ConfigProblem(
            key,
            _HIDDEN,
            "a provider's credential stored in plain text in the stack's config: store it "
            f"encrypted (pulumi config set --secret {key} <value>) or from an ESC environment",
        )
        for key, value in values.items()
        if key not in secret_keys and provider_credential(key, value)
    ]


# C0 controls but tab and newline, DEL, C1, and the bidirectional overrides that make a name
# read differently in a terminal than it is.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def control_problems(values: Mapping[str, Any]) -> list[ConfigProblem]:
    """A terminal control character in any key or value: nothing here needs one, and printed
    back it would rewrite the terminal of whoever reads the output."""
    problems = []
    stack: list[tuple[str, Any]] = [(str(k), v) for k, v in values.items()]
    while stack:
        path, item = stack.pop()
        if _CONTROL.search(path.rsplit(".", 1)[-1]) or (
            isinstance(item, str) and _CONTROL.search(item)
        ):
            problems.append(
                ConfigProblem(path, item, "holds terminal control characters; remove them")
            )
        elif isinstance(item, Mapping):
            stack += [(f"{path}.{k}", v) for k, v in item.items()]
        elif isinstance(item, list):
            stack += [(f"{path}[{i}]", v) for i, v in enumerate(item)]
    return sorted(problems, key=lambda p: p.key)


def secret_problems(values: Mapping[str, Any], secret_keys: Collection[str]) -> list[ConfigProblem]:
    """A credential is stored encrypted (a secret key, or masked as SECRET_PLACEHOLDER by the
    offline reader), never in plain text in a stack file that is committed. Any other key
    stored as a secret is refused: park renders every other value into manifests and the
    state in clear, so its secretness could not survive (Pulumi's flag would be a lie)."""
    problems = []
    for key in sorted(set(secret_keys) - set(SECRET_KEYS)):
        if key in _KEY_OF_FIELD.values() or key.startswith("park:"):
            problems.append(
                ConfigProblem(
                    key,
                    _HIDDEN,
                    "stored as a secret, but park renders this key into the manifests and the "
                    "state in clear, so it cannot stay one. Only park:hfToken is a secret: move "
                    "the credential there (or into a Kubernetes Secret created out of band) and "
                    f"store {key} in plain text",
                )
            )
    for key in SECRET_KEYS:
        value = values.get(key)
        if key not in secret_keys and value not in (None, "", SECRET_PLACEHOLDER):
            problems.append(
                ConfigProblem(
                    key,
                    _HIDDEN,
                    "a credential in plain text; store it encrypted "
                    f"(pulumi config set --secret {key} <value>) or as fn::secret in an ESC "
                    "environment",
                )
            )
    return problems


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
    values = _without_secrets(values)
    known = {v: k for k, v in _KEY_OF_FIELD.items()}
    for key, value in values.items():
        if key in known:
            raw[known[key]] = value
        elif key.startswith("park:"):
            problems.append(
                ConfigProblem(key, value, f"unknown key; allowed: {', '.join(sorted(known))}")
            )
    for required in REQUIRED:
        if required not in raw:
            problems.append(
                ConfigProblem(_KEY_OF_FIELD[required], None, "required; set it in the stack")
            )
    if problems:
        raise ConfigError(problems)
    try:
        return StackConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(
            [ConfigProblem(key_of(e["loc"]), e.get("input"), e["msg"]) for e in err.errors()]
        ) from None


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
