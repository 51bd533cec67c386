"""Config problems: each names the key, the value and what is allowed; all are reported together.

A problem is printed, logged and raised into Pulumi's output, so it is made safe when built:
a value that may be a credential is hidden (infra.schema.secrets.redact), credential-shaped parts
of the key and the message are cut out (scrub), long text is cut and control characters are
escaped (infra.schema.safe): a hostile or careless value never reaches a terminal as given.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from infra.schema.safe import one_line, shown
from infra.schema.secrets import redact, scrub

_KEY_CHARS = 200


def nearest(key: str, known: Collection[str]) -> str:
    """What a misspelt key was meant to be: "did you mean 'capacity'?", or every known key.

    The one suggester: the stack's keys (infra.schema.read) and the components' arguments
    (infra.components._checks) both say it this way. A namespace the key shares with the
    known keys (`park:`) is not counted as likeness: `park:foo` is not near `park:zone`."""
    space = key[: key.index(":") + 1] if ":" in key else ""
    bare = {k.removeprefix(space) if space else k: k for k in known}
    close = difflib.get_close_matches(key.removeprefix(space), list(bare), n=1, cutoff=0.6)
    return f"did you mean {bare[close[0]]!r}?" if close else f"known: {', '.join(sorted(known))}"


@dataclass(frozen=True)
class NotShown:
    """A value a problem does not quote, only its kind: an unknown key's (a misspelt name can
    hold a credential the rules would look for under the right one)."""

    kind: str

    def __repr__(self) -> str:
        return f"<{self.kind}, not shown>"


def not_shown(value: Any) -> NotShown:
    """`value` as NotShown: "a mapping of 2 keys", "a list of 3 items", "a string"..."""
    if isinstance(value, Mapping):
        return NotShown(f"a mapping of {len(value)} key{'s' * (len(value) != 1)}")
    if isinstance(value, list | tuple):
        return NotShown(f"a list of {len(value)} item{'s' * (len(value) != 1)}")
    kinds = {bool: "true or false", int: "a number", float: "a number", str: "a string"}
    return NotShown("null" if value is None else kinds.get(type(value), "a value"))


@dataclass(frozen=True)
class ConfigProblem:
    key: str  # e.g. "park:tpuPools[1].topology"
    value: Any  # as given, except what may be a credential (infra.schema.secrets.redact)
    message: str  # what is wrong and what is allowed

    def __post_init__(self) -> None:
        # Problems are printed, logged and raised into Pulumi's output: never with a token.
        object.__setattr__(self, "key", one_line(scrub(str(self.key)), _KEY_CHARS))
        object.__setattr__(self, "value", redact(self.value, self.key.rsplit(".", 1)[-1]))
        object.__setattr__(self, "message", one_line(scrub(str(self.message))))

    @property
    def shown_value(self) -> str:
        """The value as messages quote it: cut, escaped, credentials hidden."""
        return scrub(shown(self.value))

    def __str__(self) -> str:
        return f"{self.key} = {self.shown_value}: {self.message}"


class ConfigError(ValueError):
    """All problems of one stack config, reported together."""

    def __init__(self, problems: list[ConfigProblem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid stack config ({len(problems)} problem(s)):\n{lines}")
