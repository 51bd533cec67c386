"""What a new user meets first (issue 41, CLI): a misspelt key named with the nearest known one,
every unknown key at once without its value, `park --version`, a usage that lists every
command, and a missing stack answered with the known ones."""

from __future__ import annotations

import importlib.metadata
import shlex
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from infra import rules
from infra.rules.platform import PLACEHOLDER_PROJECT
from infra.schema.errors import ConfigError, nearest
from infra.schema.read import parse_values, read_stack_file
from infra.tools.cli import EXAMPLES, app, command_names
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
    for example in (line for lines in EXAMPLES.values() for line in lines):
        assert example in section, example


def test_a_missing_stack_lists_the_known_ones():
    result = park("validate", "nosuch")
    assert result.exit_code == 2
    assert "no stack 'nosuch'" in result.output
    known = result.output[result.output.index("Known stacks:") :]
    for stack in SHIPPED_STACKS:
        assert stack in known, stack


def test_every_command_shows_an_example_its_own_parser_accepts():
    """Each example is parsed by the command's own click parser (Typer's, not ours): an option
    renamed or removed, or a command without an example, fails here."""
    group: Any = typer.main.get_command(app)  # Typer's own click (typer._click)
    assert set(EXAMPLES) == set(command_names())
    for name in command_names():
        command = group.commands[name]
        shown = park(name, "-h", columns=100)
        assert shown.exit_code == 0, shown.output
        for example in EXAMPLES[name]:
            words = shlex.split(example)
            words = words[: words.index("|")] if "|" in words else words  # park's part of a pipe
            assert words[:2] == ["park", name], example
            assert example in shown.output, (name, shown.output)
            command.make_context(name, words[2:], resilient_parsing=False)  # raises if wrong


def test_an_example_with_an_unknown_option_is_refused_by_that_parser():
    """The check above can fail: the same parser refuses an option the command lacks."""
    group: Any = typer.main.get_command(app)
    with pytest.raises(Exception, match="--detials") as caught:
        group.commands["cost"].make_context("cost", ["dev", "--detials"])
    assert type(caught.value).__name__ == "NoSuchOption"


# ---- the placeholder project ------------------------------------------------------------------


def test_the_placeholder_is_what_every_shipped_stack_carries():
    """The warning's constant is the shipped stacks' own value, read from their files."""
    for stack in SHIPPED_STACKS:
        values, _ = read_stack_file(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
        assert values["gcp:project"] == PLACEHOLDER_PROJECT, stack


def test_a_stack_on_the_placeholder_project_is_warned_and_a_real_one_is_not():
    values, secrets = read_stack_file(ROOT / "stacks" / "Pulumi.dev.yaml")
    warned = rules.warnings(parse_values(values, "dev", secrets))
    said = [w for w in warned if w.key == "gcp:project"]
    assert len(said) == 1 and "the shipped placeholder" in str(said[0]), warned
    assert "pulumi config set gcp:project" in str(said[0])
    real = parse_values({**values, "gcp:project": "acme-ml-prod"}, "dev", secrets)
    assert not [w for w in rules.warnings(real) if w.key == "gcp:project"]
