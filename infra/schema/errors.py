"""Config problems: each names the key, the value and what is allowed; all are reported together.

A problem is printed, logged and raised into Pulumi's output, so it is made safe when built:
a value that may be a credential is hidden (infra.schema.secrets.redact), credential-shaped parts
of the key and the message are cut out (scrub), long text is cut and control characters are
escaped (infra.schema.safe): a hostile or careless value never reaches a terminal as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.schema.safe import one_line, shown
from infra.schema.secrets import redact, scrub

_KEY_CHARS = 200


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
