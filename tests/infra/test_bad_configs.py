"""Bad input, end to end: a catalogue of invalid stack files (tests/bad_configs/), one mistake
each, covering every config section. For each: `park render` and `park validate` exit 1 and
name the key; the Pulumi program itself refuses the config before registering any resource.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.schema.errors import ConfigError
from infra.schema.keys import config_keys
from infra.schema.read import read_stack_file
from infra.stack import from_file
from infra.tools.cli import app
from infra.tools.render import ProgramError, run_program
from tests.conftest import ROOT

CATALOGUE = ROOT / "tests" / "bad_configs"
CASES = sorted(CATALOGUE.glob("*.yaml"))


def _header(path: Path, field: str) -> str | None:
    match = re.search(rf"^# {field}: (\S+)$", path.read_text(), re.MULTILINE)
    return match.group(1) if match else None


def expected_key(path: Path) -> str:
    key = _header(path, "expect")
    assert key, f"{path.name} has no '# expect: <config key>' line"
    return key


def stack_of(path: Path) -> str:
    return _header(path, "stack") or "dev"


def names(key: str, problem_key: str) -> bool:
    """The problem is about that key, or inside it (park:kueue → park:kueue.version)."""
    return problem_key == key or problem_key.startswith((f"{key}.", f"{key}["))


def test_catalogue_is_big_enough_and_covers_every_section():
    assert len(CASES) >= 30
    sections = {re.split(r"[.\[]", expected_key(p), maxsplit=1)[0] for p in CASES}
    assert set(config_keys()) - sections == set(), "add an invalid config for these sections"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_config_error_names_the_key(path: Path):
    with pytest.raises(ConfigError) as err:
        from_file(path, stack_of(path))
    keys = [p.key for p in err.value.problems]
    assert any(names(expected_key(path), k) for k in keys), keys


@pytest.mark.parametrize("command", ["render", "validate"])
@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_cli_exits_1_naming_the_key(path: Path, command: str):
    assert command in {c.name or c.callback.__name__ for c in app.registered_commands}, (
        f"park {command} is not defined in infra/cli.py"
    )
    args = [command, stack_of(path), "--config-file", str(path)]
    if command == "validate":
        args.append("--no-serve-check")
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 1, result.output
    assert expected_key(path) in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_program_registers_nothing(path: Path):
    """The program as `pulumi up` runs it (no pre-validation): it fails on the config before
    the first resource is registered."""
    values, secrets = read_stack_file(path)
    with pytest.raises(ProgramError) as err:
        run_program(values, stack_of(path), secrets, prevalidate=False)
    assert err.value.resources == []
    assert expected_key(path) in str(err.value)


@pytest.mark.e2e
def test_park_commands_exit_1_in_a_subprocess():
    path = CATALOGUE / "22-tpu-topology-not-offered.yaml"
    for command in ("render", "validate"):
        result = subprocess.run(
            [sys.executable, "-m", "infra.tools.cli", command, "dev", "--config-file", str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
            env={**os.environ, "COLUMNS": "200"},
        )
        assert result.returncode == 1, result.stdout + result.stderr
        assert "park:tpuPools[0].topology" in result.stdout + result.stderr
