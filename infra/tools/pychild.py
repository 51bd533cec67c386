"""Python code run in a fresh interpreter: for checks that must not import what they check into
this process (Ray and vLLM, ~10 s: infra never imports workloads) and for timings that must
start cold (benchmarks/render.py)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def run_python(
    code: str,
    stdin: str = "",
    *,
    timeout: float | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`python -c code` with this interpreter, `stdin` as its input; its output as text.
    Raises subprocess.TimeoutExpired past `timeout`, CalledProcessError with `check`."""
    return subprocess.run(
        [sys.executable, "-c", code],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=None if env is None else dict(env),
        check=check,
    )
