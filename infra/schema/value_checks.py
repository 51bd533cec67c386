"""What a stack's values may not hold, checked before they are typed: a credential in plain
text (or under a key that moved), a control character, a provider credential outside a
secret. Each problem names the key and never shows the value."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.alias_generators import to_camel

from infra.schema.errors import ConfigProblem
from infra.schema.keys import KEY_OF_FIELD, parks_own
from infra.schema.models import SECRET_PLACEHOLDER, StackConfig
from infra.schema.secrets import credentials_in, secret_named

# Config keys that hold credentials: `pulumi config set --secret <key> <value>`.
SECRET_KEYS = ("park:hfToken", "park:iapOauthClientSecret")
# Where a credential used to live: the problem says where it went (never the value).
MOVED_SECRETS = {("park:serving", "hfToken"): "park:hfToken"}
_HIDDEN = "<plain text, not shown>"


def without_secrets(values: Mapping[str, Any]) -> dict[str, Any]:
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
        if key in KEY_OF_FIELD.values() or key.startswith("park:"):
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
