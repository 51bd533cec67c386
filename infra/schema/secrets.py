"""The one credential detector: what a credential looks like, wherever it sits.

Used by the config reader (a credential outside park:hfToken is refused, naming the key),
by every message (errors and warnings are scrubbed), by `park validate` on manifests, and by
the policy pack's no-plaintext-secrets rule (policy/security.py): one definition, so the gates
cannot disagree about what a credential is.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from typing import Any

_URL_SCHEME = r"\b[A-Za-z][A-Za-z0-9+.\-]*://"
_QUERY_KEYS = (
    r"access_?token|id_?token|refresh_?token|token|auth|api_?key|apikey|key|sig|signature|"
    r"password|passwd|pwd|secret|client_?secret|credentials?|"
    r"x-goog-signature|x-goog-credential|x-amz-signature|x-amz-credential|x-amz-security-token"
)
# Values that are credentials whatever their key: tokens with a known prefix, key material,
# and credentials carried inside URLs. Each pattern matches the secret part, so `scrub` can
# cut exactly that out of a message.
CREDENTIAL_PATTERNS = {
    "a Hugging Face token": re.compile(r"\bhf_[A-Za-z0-9]{30,}"),
    "a Google API key": re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"),
    "a Google OAuth client secret": re.compile(r"\bGOCSPX-[0-9A-Za-z_\-]{20,}"),
    "a Google OAuth access token": re.compile(r"\bya29\.[0-9A-Za-z_\-.]{20,}"),
    "a GitHub token": re.compile(r"\b(gh[pousr]_|github_pat_)[A-Za-z0-9_]{36,}"),
    "an OpenAI-style API key": re.compile(r"\bsk-[A-Za-z0-9_\-]{20,}"),
    "an AWS access key": re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"),
    "a Slack token": re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"),
    "a private key": re.compile(
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----(?:.*?-----END [A-Z ]*PRIVATE KEY-----|.*)", re.S
    ),
    "a service-account key file": re.compile(r'"private_key(?:_id)?"\s*:\s*("[^"]*"?)?'),
    "a password in a URL": re.compile(_URL_SCHEME + r"[^\s/?#@:]*:[^\s/?#@]+@"),
    "a credential in a URL query": re.compile(r"[?&;](?:" + _QUERY_KEYS + r")=[^&#\s]+", re.I),
}
# Words of a key that name a credential (HF_TOKEN, apiKey, client-secret), and the last words
# that make it a reference to one instead (HF_TOKEN_PATH, secretName).
_SECRET_WORDS = {"token", "secret", "password", "passwd", "pwd", "credential", "credentials"}
_SECRET_PAIRS = {("api", "key"), ("access", "key"), ("private", "key"), ("auth", "key")}
_SECRET_JOINED = {"apikey", "accesskey", "privatekey", "authkey"}
_TOKENIZER_WORDS = {"bos", "eos", "pad", "unk", "sep", "cls", "mask", "special", "stop"}
_REFERENCE_WORDS = {"path", "file", "dir", "name", "url", "ref", "id"}
# A long run of letters and digits with both present and no spaces: an opaque token.
_OPAQUE = re.compile(r"^(?=.*[A-Za-z])(?=.*\d)[A-Za-z0-9_\-+/=.]{32,}$")
# A Google resource path (projects/P/reservations/R/reservationBlocks/B/...): long, letters and
# digits, but every segment a lowercase name or a camelCase collection; a token's are not.
_RESOURCE_PATH = re.compile(r"^[a-z][-a-z0-9]*(?:/(?:[a-z][-a-z0-9]*|[a-z]+(?:[A-Z][a-z]+)+)){2,}$")
# User-info before a host that is itself an opaque token (https://<token>@github.com/...).
_URL_USER = re.compile(_URL_SCHEME + r"([^\s/?#@:]+)@")
HIDDEN = "<hidden: looks like a credential>"
CUT = "<hidden>"


def _words(name: str) -> list[str]:
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def secret_named(name: str) -> bool:
    """A key named like a credential (HF_TOKEN, apiKey), not like a reference to one
    (HF_TOKEN_PATH, secretName) nor a word that merely contains one (tokenizer, max_tokens)."""
    words = _words(name)
    if not words or words[-1] in _REFERENCE_WORDS:
        return False
    pairs = set(itertools.pairwise(words))
    if any(pair[1] in ("token", "tokens") and pair[0] in _TOKENIZER_WORDS for pair in pairs):
        return False  # eos_token, pad_token: a tokenizer's special token, not a credential
    return bool(_SECRET_WORDS & set(words) or _SECRET_JOINED & set(words) or _SECRET_PAIRS & pairs)


def credential_kind(value: str) -> str | None:
    """What kind of credential a string holds (anywhere in it), or None."""
    for kind, pattern in CREDENTIAL_PATTERNS.items():
        if pattern.search(value):
            return kind
    for match in _URL_USER.finditer(value):
        if _OPAQUE.match(match.group(1)):
            return "a token as a URL's user name"
    return None


def looks_like_credential(value: str) -> bool:
    stripped = value.strip()
    opaque = bool(_OPAQUE.match(stripped)) and not _RESOURCE_PATH.match(stripped)
    return credential_kind(value) is not None or opaque


def redact(value: Any, key: str = "") -> Any:
    """The value with anything that may be a credential replaced by HIDDEN (shape kept)."""
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, key) for v in value]
    if isinstance(value, str) and (looks_like_credential(value) or (key and secret_named(key))):
        return HIDDEN
    return value


def scrub(text: str) -> str:
    """A message with every credential-shaped part cut out (the rest of it kept)."""
    for pattern in CREDENTIAL_PATTERNS.values():
        text = pattern.sub(CUT, text)
    return _URL_USER.sub(
        lambda m: m.group().replace(m.group(1), CUT) if _OPAQUE.match(m.group(1)) else m.group(),
        text,
    )


def credentials_in(
    node: Any, where: str = "", *, fields: frozenset[str] = frozenset()
) -> Iterator[tuple[str, str]]:
    """(path, what) of every credential in a tree of mappings, lists and strings: a string
    that holds one, or a non-empty value under a key named like one (HF_TOKEN, api_key) unless
    that key is one of `fields` (a spec field such as iapOauthSecret, which holds a name).
    Kubernetes env lists ({name: HF_TOKEN, value: ...}) count as such keys. Never the value."""
    stack: list[tuple[str, Any]] = [(where, node)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, Mapping):
            env_name = item.get("name") if "value" in item else None
            if isinstance(env_name, str) and secret_named(env_name) and _filled(item["value"]):
                yield f"{path}.value" if path else "value", f"a literal {env_name}"
            for key, value in reversed(list(item.items())):
                sub = f"{path}.{key}" if path else str(key)
                named = isinstance(key, str) and key not in fields and secret_named(key)
                if named and _filled(value):
                    yield sub, f"a value under {key}"
                    continue
                stack.append((sub, value))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([(f"{path}[{i}]", v) for i, v in enumerate(item)]))
        elif isinstance(item, str):
            kind = credential_kind(item)
            if kind is not None:
                yield path or "value", kind


def _filled(value: Any) -> bool:
    """A value that can be a credential: a non-empty string (a flag such as
    automountServiceAccountToken: true is not one)."""
    return isinstance(value, str) and bool(value.strip())
