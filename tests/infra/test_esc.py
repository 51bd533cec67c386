"""Stacks that import Pulumi ESC environments (`environment:` in the stack file).

Offline, park cannot open an environment: it says so, names the environments, and renders with
what `pulumi config --json --show-secrets --open` or `esc env open --format json` printed
(`--esc-config`), merged as Pulumi merges them (the stack file's own keys win).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.schema.errors import ConfigError
from infra.schema.read import StackFileError, read_esc_values
from infra.stack import from_file
from infra.tools.render import render_stack_file
from tests.conftest import ROOT

TOKEN = "hf_" + "Zq7x" * 9  # looks like a credential: it must never be printed

STACK = """\
environment:
  - park-gke/common
  - park-gke/prod
config:
  gcp:region: us-east5
  park:zone: us-east5-b
  park:tpuPools:
  - name: serve
    machineType: ct6e-standard-8t
    topology: 2x4
  park:serving:
    enabled: true
    pool: serve
    models:
    - name: llama
      source: meta-llama/Llama-3.1-8B-Instruct
      tensorParallelSize: 8
"""


def _stack(tmp_path: Path, text: str = STACK) -> Path:
    path = tmp_path / "Pulumi.esc.yaml"
    path.write_text(text)
    return path


def _esc_open(tmp_path: Path, config: dict) -> Path:
    """What `esc env open park-gke/prod --format json` prints."""
    path = tmp_path / "env.json"
    opened = {"environmentVariables": {"CLOUDSDK_AUTH_ACCESS_TOKEN": "ya29.x"}}
    path.write_text(json.dumps({**opened, "pulumiConfig": config}))
    return path


def _park(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infra.tools.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_an_unopened_environment_is_named_with_how_to_render_anyway(tmp_path):
    # The project and the token come from ESC: without them the stack is incomplete.
    with pytest.raises(ConfigError) as err:
        from_file(_stack(tmp_path))
    assert [p.key for p in err.value.problems] == ["gcp:project", "environment"]
    (note,) = [p for p in err.value.problems if p.key == "environment"]
    assert note.value == ["park-gke/common", "park-gke/prod"]
    assert "--esc-config" in note.message and "pulumi config --json" in note.message


def test_a_rule_failing_without_the_environment_names_it_too(tmp_path):
    text = STACK.replace("  gcp:region", "  gcp:project: p\n  gcp:region")
    with pytest.raises(ConfigError) as err:
        from_file(_stack(tmp_path, text))
    # The gated model needs the token the environment would give.
    assert [p.key for p in err.value.problems] == ["park:hfToken", "environment"]


def test_a_stack_valid_without_its_environment_renders_with_a_warning(tmp_path):
    given = "  gcp:project: p\n  park:hfToken:\n    secure: v1:x\n"
    text = STACK.replace("  gcp:region", given + "  gcp:region")
    rendered = render_stack_file(_stack(tmp_path, text))
    (warning,) = [w for w in rendered.plan.warnings if w.key == "environment"]
    assert "cannot open" in warning.message


def test_opened_environment_values_fill_the_stack_and_the_file_wins(tmp_path):
    esc = _esc_open(
        tmp_path,
        {"gcp:project": "from-esc", "gcp:region": "europe-west4", "park:hfToken": TOKEN},
    )
    plan = from_file(_stack(tmp_path), esc_config=esc)
    assert plan.spec.project == "from-esc"
    assert plan.spec.region == "us-east5"  # the stack file's own key wins, as in Pulumi
    assert plan.spec.hf_token == "[secret]"  # known to be set, never held
    assert not [w for w in plan.warnings if w.key == "environment"]


@pytest.mark.e2e
def test_the_token_from_esc_reaches_the_secret_and_is_never_printed(tmp_path):
    stack, esc = _stack(tmp_path), _esc_open(tmp_path, {"gcp:project": "p", "park:hfToken": TOKEN})
    rendered = render_stack_file(stack, esc_config=esc)
    (secret,) = [r for r in rendered.resources if r.type == "kubernetes:core/v1:Secret"]
    assert TOKEN not in json.dumps(secret.inputs)  # the render masks secrets
    workers = [
        group["template"]["spec"]["containers"][0]
        for m in rendered.manifests()
        if m["kind"] == "RayService"
        for group in m["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    ]
    assert workers and all(any(e["name"] == "HF_TOKEN_PATH" for e in c["env"]) for c in workers)
    given = ("--config-file", str(stack), "--esc-config", str(esc))
    for verb in (("validate", "--no-serve-check"), ("render",), ("cost",)):
        done = _park(verb[0], "esc", *given, *verb[1:])
        assert done.returncode == 0, done.stdout + done.stderr
        assert TOKEN not in done.stdout + done.stderr


def test_the_cli_says_which_environments_it_could_not_open(tmp_path):
    done = _park("validate", "esc", "--config-file", str(_stack(tmp_path)))
    assert done.returncode == 1
    out = done.stdout + done.stderr
    assert "park-gke/common" in out and "park-gke/prod" in out and "--esc-config" in out


def test_pulumi_config_json_is_read_with_object_values(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "gcp:project": {"value": "p", "secret": False},
                "park:hfToken": {"value": TOKEN, "secret": True},
                "park:cpuPool": {
                    "value": '{"maxNodes":5}',
                    "objectValue": {"maxNodes": 5},
                    "secret": False,
                },
            }
        )
    )
    values = read_esc_values(path)
    assert values == {"gcp:project": "p", "park:hfToken": TOKEN, "park:cpuPool": {"maxNodes": 5}}
    plan = from_file(_stack(tmp_path), esc_config=path)
    assert plan.spec.cpu_pool.max_nodes == 5


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"values": {"pulumiConfig": {"park:hfToken": "${hf.token}"}}}', "interpolations"),
        ('{"gcp:project": {"value": "[unknown]", "secret": false}}', "--open"),
        ("[1, 2]", "expected what"),
        ("{not json", "cannot read it"),
    ],
)
def test_an_esc_file_park_cannot_use_says_why(tmp_path, content, fragment):
    path = tmp_path / "env.json"
    path.write_text(content)
    with pytest.raises(StackFileError, match=fragment):
        read_esc_values(path)


def test_environment_must_be_a_list_of_names(tmp_path):
    path = _stack(tmp_path, "environment:\n  name: x\nconfig:\n  gcp:project: p\n")
    with pytest.raises(StackFileError, match=r"Pulumi.esc.yaml:1: `environment:` must be a list"):
        from_file(path)
