"""`park local`: the stack's RayJob and RayService on a local Ray, on CPU (in progress)."""

from __future__ import annotations

from typing import Any


class LocalRunError(RuntimeError):
    """The local run failed; the message says at which step."""


def run_local(rendered: Any, *, only: str | None, keep: bool, console: Any) -> None:
    raise LocalRunError("park local is not implemented yet")
