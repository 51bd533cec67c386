"""Config problems: each names the key, the value and what is allowed; all are reported together."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.spec.secrets import redact


@dataclass(frozen=True)
class ConfigProblem:
    key: str  # e.g. "park:tpuPools[1].topology"
    value: Any  # as given, except what may be a credential (infra.spec.secrets.redact)
    message: str  # what is wrong and what is allowed

    def __post_init__(self) -> None:
        # Problems are printed, logged and raised into Pulumi's output: never with a token.
        object.__setattr__(self, "value", redact(self.value, self.key.rsplit(".", 1)[-1]))

    def __str__(self) -> str:
        return f"{self.key} = {self.value!r}: {self.message}"


class ConfigError(ValueError):
    """All problems of one stack config, reported together."""

    def __init__(self, problems: list[ConfigProblem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid stack config ({len(problems)} problem(s)):\n{lines}")
