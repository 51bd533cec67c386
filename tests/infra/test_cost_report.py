"""`park cost` in an 80-column terminal: cost first (what the stack costs left up, per month), at
most 45 lines, nothing cut; every figure of the rest behind --details, in blocks when narrow."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from infra.stack import from_file
from infra.tools import report_cost
from infra.tools.cli import app
from infra.tools.cost import HOURS_PER_MONTH, estimate
from tests.conftest import ROOT, SHIPPED_STACKS, STACKS_DIR


def _money(value: float) -> str:
    return f"${value:,.2f}" if value >= 0.995 else f"${value:,.3f}"


def _check_summary(stack: str, output: str) -> None:
    lines = output.rstrip("\n").splitlines()
    assert len(lines) <= 45, len(lines)
    assert max(len(line) for line in lines) <= 80, output
    assert "…" not in output and "..." not in output, output
    result = estimate(from_file(STACKS_DIR / f"Pulumi.{stack}.yaml"))
    left = result.serving_floor_per_hour
    assert left is not None
    assert lines[0].startswith(f"{stack} left up: ${left * HOURS_PER_MONTH:,.0f}/month"), lines[0]
    for pool in result.pools:  # every pool by its whole name, with its whole price
        assert pool.full_per_hour is not None
        assert f"{pool.name}: {_money(pool.full_per_hour)}/h" in output, (pool.name, output)


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_cost_is_short_and_cost_first(stack):
    result = CliRunner().invoke(app, ["cost", stack], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    _check_summary(stack, result.output)


@pytest.mark.e2e
def test_cost_in_an_80_column_terminal():
    """As a user runs it: `COLUMNS=80 park cost dev`, the installed command."""
    park = Path(sys.executable).parent / "park"
    done = subprocess.run(
        [str(park), "cost", "dev"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert done.returncode == 0, done.stderr
    _check_summary("dev", done.stdout)


def test_details_in_a_narrow_terminal_are_blocks_with_nothing_cut():
    result = estimate(from_file(STACKS_DIR / "Pulumi.prod.yaml"))
    out = Console(file=io.StringIO(), width=80)
    report_cost.cost(result, out)
    text = out.file.getvalue()
    assert "…" not in text, text
    for pool in result.pools:
        assert f"{pool.name}: {pool.machine_type}" in text, pool.name
        for value in pool.by_capacity.values():
            if value is not None:
                assert _money(value) in text, (pool.name, value)


def test_the_summary_check_can_fail():
    result = CliRunner().invoke(app, ["cost", "dev", "--details"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    with pytest.raises(AssertionError):
        _check_summary("dev", result.output)  # the details are longer than 45 lines
