"""What a new user meets first (issue 41, CLI): a misspelt key named with the nearest known one,
every unknown key at once without its value, `park --version`, a usage that lists every
command, and a missing stack answered with the known ones."""

from __future__ import annotations

import importlib.metadata

from typer.testing import CliRunner

from infra.schema.errors import ConfigError, nearest
from infra.schema.read import parse_values
from infra.tools.cli import app, command_names
from tests.conftest import ROOT, SHIPPED_STACKS

runner = CliRunner()
TYPO_CASE = ROOT / "tests" / "bad_configs" / "112-tpu-capacity-typo.yaml"
BASE = {"gcp:project": "p", "gcp:region": "us-east5", "park:zone": "us-east5-b"}
POOL = {"name": "v6e-8", "machineType": "ct6e-standard-8t", "topology": "2x4"}


def park(*args: str, columns: int = 200):
    return runner.invoke(app, list(args), env={"COLUMNS": str(columns), "NO_COLOR": "1"})


def problems(values: dict) -> dict[str, str]:
    try:
        parse_values(values, "dev", secret_keys=[])  # as a stack file with no secrets
    except ConfigError as err:
        return {p.key: str(p) for p in err.problems}
    raise AssertionError("no ConfigError")


# ---- unknown keys -----------------------------------------------------------------------------


def test_a_misspelt_pool_key_gets_did_you_mean():
    result = park("validate", "dev", "--config-file", str(TYPO_CASE), "--no-serve-check")
    assert result.exit_code == 1, result.output
    assert "park:tpuPools[0].capcity" in result.output
    assert "did you mean 'capacity'" in result.output
    assert "Extra inputs are not permitted" not in result.output


def test_a_top_level_typo_does_not_hide_the_nested_ones():
    found = problems(
        {
            **BASE,
            "park:tpuPool": [POOL],  # top level
            "park:tpuPools": [{**POOL, "capcity": "spot"}],
            "park:serving": {"modl": "x", "models": [{"nme": "m", "source": "org/m"}]},
            "park:observability": {"exposeDashbord": True},
        }
    )
    assert "did you mean 'park:tpuPools'" in found["park:tpuPool"]
    assert "did you mean 'capacity'" in found["park:tpuPools[0].capcity"]
    assert "did you mean 'models'" in found["park:serving.modl"]
    assert "did you mean 'name'" in found["park:serving.models[0].nme"]
    assert "did you mean 'exposeDashboard'" in found["park:observability.exposeDashbord"]


def test_a_credential_problem_does_not_hide_the_unknown_keys():
    token = "hf_" + "a1B2" * 10
    found = problems({**BASE, "park:hfToken": token, "park:tpuPools": [{**POOL, "capcity": "x"}]})
    assert "park:hfToken" in found
    assert "did you mean 'capacity'" in found["park:tpuPools[0].capcity"]


def test_no_suggestion_when_nothing_is_near_lists_the_known_keys():
    found = problems({**BASE, "park:zzz": 1, "park:tpuPools": [{**POOL, "qqq": 1}]})
    assert "known: gcp:project, gcp:region, park:cluster" in found["park:zzz"]
    assert "known: autoscaling, capacity" in found["park:tpuPools[0].qqq"]


def test_the_shared_namespace_is_not_counted_as_likeness():
    assert nearest("park:foo", ["park:zone", "park:tpuPools"]).startswith("known:")
    assert (
        nearest("park:tpuPool", ["park:zone", "park:tpuPools"]) == "did you mean 'park:tpuPools'?"
    )
    assert nearest("capcity", ["capacity", "topology"]) == "did you mean 'capacity'?"


def test_no_whole_value_is_echoed():
    """An unknown key's value, and the mapping around a missing key, are never printed back:
    only the value's kind."""
    plain = "not-a-token-but-private-" + "x" * 20
    token = "hf_" + "a1B2" * 10
    values = {
        **BASE,
        "park:tpuPol": {"note": plain},
        "park:tpuPools": [{**POOL, "capcity": plain, "extra": {"hfTokn": token, "n": plain}}],
        "park:serving": {"models": [{"nme": plain}]},  # name and source missing
    }
    found = problems(values)
    text = "\n".join(found.values())
    assert plain not in text and token not in text and "note" not in text
    assert "<a mapping of 1 key, not shown>" in found["park:tpuPol"]
    assert "<a string, not shown>" in found["park:tpuPools[0].capcity"]
    assert "<a mapping of 2 keys, not shown>" in found["park:tpuPools[0].extra"]
    assert "required" in found["park:serving.models[0].name"]
    path = ROOT / "tests" / "bad_configs" / "112-tpu-capacity-typo.yaml"
    result = park("validate", "dev", "--config-file", str(path), "--no-serve-check")
    assert "'spot'" not in result.output


# ---- the commands -----------------------------------------------------------------------------


def test_version_prints_the_package_version_and_exits_0():
    result = park("--version")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"park-gke {importlib.metadata.version('park-gke')}"


def _stack_word(name: str) -> str:
    """` STACK` after a command that takes one (all but `park tpus`, the catalog's)."""
    return "" if name == "tpus" else " STACK"


def test_usage_lists_every_registered_command_within_80_columns():
    names = command_names()
    assert {"render", "validate", "cost", "stage-model", "local"} <= set(names)
    for args in ((), ("--help",), ("-h",)):
        result = park(*args, columns=80)
        assert result.exit_code == 0, result.output
        for name in names:
            assert f"park {name}{_stack_word(name)}" in result.output, (name, result.output)
        assert max(len(line) for line in result.output.splitlines()) < 80, result.output
        assert "--version" in result.output


def test_the_cli_page_lists_every_command():
    section = (ROOT / "docs" / "cli.md").read_text()
    for name in command_names():
        assert f"park {name}{_stack_word(name)}" in section, name
    assert "park --version" in section


def test_a_missing_stack_lists_the_known_ones():
    result = park("validate", "nosuch")
    assert result.exit_code == 2
    assert "no stack 'nosuch'" in result.output
    known = result.output[result.output.index("Known stacks:") :]
    for stack in SHIPPED_STACKS:
        assert stack in known, stack
