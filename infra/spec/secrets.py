"""What a credential looks like, so no error, log or report ever echoes one.

Shared by config problems (infra.spec.errors redacts every value it carries) and the policy
pack's no-plaintext-secrets rule (policy/security.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Values that are credentials whatever their key: tokens with a known prefix and key material.
CREDENTIAL_PATTERNS = {
    "a Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}\b"),
    "a Google API key": re.compile(r"\bAIza[0-9A-Za-z_\-]{35}\b"),
    "a Google OAuth access token": re.compile(r"\bya29\.[0-9A-Za-z_\-]{20,}"),
    "a GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "an OpenAI-style API key": re.compile(r"\bsk-[A-Za-z0-9_\-]{20,}"),
    "an AWS access key": re.compile(r"\bAKIA[0-9A-Z]{16}\b"),
    "a private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "a service-account key file": re.compile(r'"private_key_id"\s*:'),
}
SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|CREDENTIAL)", re.I)
_REFERENCE_SUFFIXES = ("_PATH", "_FILE", "_DIR", "_NAME", "_URL")
# A long run of letters and digits with both present and no spaces: an opaque token.
_OPAQUE = re.compile(r"^(?=.*[A-Za-z])(?=.*\d)[A-Za-z0-9_\-+/=.]{32,}$")
HIDDEN = "<hidden: looks like a credential>"


def secret_named(name: str) -> bool:
    """A key named like a credential (HF_TOKEN, apiKey), not like a reference to one (_PATH)."""
    return bool(SECRET_NAME.search(name)) and not name.upper().endswith(_REFERENCE_SUFFIXES)


def credential_kind(value: str) -> str | None:
    """What kind of credential a string holds, or None."""
    for kind, pattern in CREDENTIAL_PATTERNS.items():
        if pattern.search(value):
            return kind
    return None


def looks_like_credential(value: str) -> bool:
    return credential_kind(value) is not None or bool(_OPAQUE.match(value.strip()))


def redact(value: Any, key: str = "") -> Any:
    """The value with anything that may be a credential replaced by HIDDEN (shape kept)."""
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, key) for v in value]
    if isinstance(value, str) and (looks_like_credential(value) or (key and secret_named(key))):
        return HIDDEN
    return value
