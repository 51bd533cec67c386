"""The `park` CLI: exit codes, stack lookup, render, cost, and validate catching broken input.

`park validate` is run on a set of broken stack configs (each must exit 1 naming the config key)
and on hand-broken copies of rendered manifests (each must exit 1 naming the manifest and the
path inside it). Ray's own serve-config check is exercised once each way (it imports Ray and
vLLM in a subprocess); the other cases pass --no-serve-check.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.tools.checks import serve_check_available
from infra.tools.cli import app
from infra.tools.render import write_outputs
from tests.conftest import SHIPPED_STACKS, STACKS_DIR, render_stack

# The `park` CLI end to end (render, validate, cost on every shipped stack and on edited
# manifests): the e2e tier, which keeps the fast tier under 3 minutes.
pytestmark = pytest.mark.e2e

runner = CliRunner()


def park(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


# ---------------------------------------------------------------------------------------------
# Basics


def test_bare_park_explains_itself_and_exits_0():
    result = park()
    assert result.exit_code == 0
    for command in ("park render", "park validate", "park cost", "park local"):
        assert command in result.output


def test_help_lists_every_command():
    result = park("--help")
    assert result.exit_code == 0
    for command in ("render", "validate", "cost", "local"):
        assert command in result.output


@pytest.mark.parametrize(
    "args",
    [
        ("nonsense",),
        ("validate", "no-such-stack"),
        ("cost", "dev", "--config-file", "/nonexistent/Pulumi.x.yaml"),
        ("local", "dev", "--only", "everything"),
        ("render",),
    ],
)
def test_usage_errors_exit_2(args):
    assert park(*args).exit_code == 2


def test_stack_names_resolve_from_any_directory(tmp_path, monkeypatch):
    """No ./stacks here: the stacks beside the installed package are used."""
    monkeypatch.chdir(tmp_path)
    result = park("cost", "dev", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["stack"] == "dev"


def test_render_writes_resources_and_manifests(tmp_path):
    result = park("render", "dev", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "resources.json").read_text())
    assert (tmp_path / "manifests" / "rayjob-park-train.yaml").exists()
    assert "TPU pools" in result.output


def test_cost_prints_figures_and_says_which_prices():
    result = park("cost", "dev", "--details")
    assert result.exit_code == 0, result.output
    assert "$8.64*" in result.output  # a spot v6e 2x4 slice, the configured capacity
    assert "idle" in result.output and "one training run" in result.output
    assert "https://cloud.google.com/blog/products/compute/trillium-tpu-is-ga" in result.output
    assert "List prices" in result.output


def test_cost_says_when_stack_prices_are_used(tmp_path):
    stack = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    stack["config"]["park:prices"] = {"source": "our contract", "tpuChipHour": {"spot": 1.0}}
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(stack))
    result = park("cost", "dev", "--details", "--config-file", str(path))
    assert result.exit_code == 0, result.output
    assert "park:prices (our contract)" in result.output
    assert "$8.00*" in result.output


# ---------------------------------------------------------------------------------------------
# validate: shipped stacks are valid


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_shipped_stacks_validate(stack):
    result = park("validate", stack, "--no-serve-check")
    assert result.exit_code == 0, result.output
    assert f"{stack}: valid" in result.output


@pytest.mark.serve
@pytest.mark.skipif(not serve_check_available(), reason="workloads not installed")
def test_validate_runs_rays_serve_check():
    result = park("validate", "dev")
    assert result.exit_code == 0, result.output
    assert "ok serve: serveConfigV2 with Ray Serve's" in result.output


# ---------------------------------------------------------------------------------------------
# validate: broken configs


def _edit(config: dict, key: str, path: list, value) -> None:
    node = config[key]
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value


BROKEN_CONFIGS = {
    # name: (key in the stack file, path inside it, new value, key the message must name)
    "topology not offered": ("park:tpuPools", [0, "topology"], "3x3", "park:tpuPools[0].topology"),
    "machine type unknown": (
        "park:tpuPools",
        [1, "machineType"],
        "ct6e-standard-2t",
        "park:tpuPools[1].machineType",
    ),
    "training pool unknown": ("park:training", ["pool"], "nope", "park:training.pool"),
    "tp does not fit": (
        "park:serving",
        ["models", 0, "tensorParallelSize"],
        3,
        "park:serving.models[0].tensorParallelSize",
    ),
    "batch not a multiple of workers": (
        "park:training",
        ["globalBatchSize"],
        12,
        "park:training.globalBatchSize",
    ),
    "GKE too old for v6e": ("park:cluster", ["version"], "1.29.1", "park:cluster.version"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_CONFIGS))
def test_validate_catches_broken_config(case, tmp_path):
    key, path, value, named = BROKEN_CONFIGS[case]
    stack = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    _edit(stack["config"], key, path, value)
    file = tmp_path / "Pulumi.dev.yaml"
    file.write_text(yaml.safe_dump(stack))
    result = park("validate", "dev", "--config-file", str(file), "--no-serve-check")
    assert result.exit_code == 1, result.output
    assert named in result.output


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("park:nonsense", 1, "park:nonsense"),
        ("park:prices", {"tpuChipHour": {"spot": -1}}, "park:prices.tpuChipHour.spot"),
        ("park:zone", "europe-west4-a", "park:zone"),
    ],
)
def test_validate_catches_bad_keys(key, value, named, tmp_path):
    stack = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    stack["config"][key] = value
    file = tmp_path / "Pulumi.dev.yaml"
    file.write_text(yaml.safe_dump(stack))
    result = park("validate", "dev", "--config-file", str(file), "--no-serve-check")
    assert result.exit_code == 1, result.output
    assert named in result.output


# ---------------------------------------------------------------------------------------------
# validate: hand-broken manifests


@pytest.fixture(scope="module")
def rendered_dirs(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for stack in ("dev", "prod"):
        directory = tmp_path_factory.mktemp(f"render-{stack}")
        write_outputs(render_stack(stack), directory)
        out[stack] = directory / "manifests"
    return out


def _worker_group(doc: dict) -> dict:
    spec = doc["spec"]
    return (spec.get("rayClusterSpec") or spec.get("rayClusterConfig"))["workerGroupSpecs"][0]


def _container(doc: dict) -> dict:
    return _worker_group(doc)["template"]["spec"]["containers"][0]


def _serve_llm(doc: dict) -> tuple[dict, dict]:
    serve = yaml.safe_load(doc["spec"]["serveConfigV2"])
    return serve, serve["applications"][0]["args"]["llm_configs"][0]


def _set_serve(doc: dict, serve: dict) -> None:
    doc["spec"]["serveConfigV2"] = yaml.safe_dump(serve, sort_keys=False)


def break_hosts(doc):
    _worker_group(doc)["numOfHosts"] = 2


def break_tpu_per_pod(doc):
    for side in ("requests", "limits"):
        _container(doc)["resources"][side]["google.com/tpu"] = "8"


def break_unknown_field(doc):
    doc["spec"]["entrypointt"] = doc["spec"].pop("entrypoint")


def break_ray_start_param_type(doc):
    _worker_group(doc)["rayStartParams"]["num-cpus"] = 4


def break_num_workers(doc):
    doc["spec"]["entrypoint"] = doc["spec"]["entrypoint"].replace(
        "--num-workers 16", "--num-workers 8"
    )


def break_toleration(doc):
    _worker_group(doc)["template"]["spec"].pop("tolerations")


def break_max_replicas(doc):
    _worker_group(doc)["maxReplicas"] = 5


def break_tp(doc):
    serve, llm = _serve_llm(doc)
    llm["engine_kwargs"]["tensor_parallel_size"] = 12
    _set_serve(doc, serve)


def break_multihost_backend(doc):
    serve, llm = _serve_llm(doc)
    llm["runtime_env"]["env_vars"].pop("TPU_MULTIHOST_BACKEND")
    _set_serve(doc, serve)


def break_serve_topology(doc):
    serve, llm = _serve_llm(doc)
    llm["accelerator_config"]["topology"] = "2x4"
    _set_serve(doc, serve)


def break_namespace(doc):
    doc["metadata"]["labelz"] = {"a": "b"}


def _break_privileged(doc: dict) -> None:
    head = doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    head["containers"][0]["securityContext"]["privileged"] = True


def _break_host_path(doc: dict) -> None:
    worker = doc["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    worker.setdefault("volumes", []).append({"name": "host", "hostPath": {"path": "/"}})


BROKEN_MANIFESTS = {
    # name: (file in prod's manifests/, edit, text the message must contain)
    "numOfHosts x chips != topology": (
        "rayjob-park-train.yaml",
        break_hosts,
        "RayJob/park-train: spec.rayClusterSpec.workerGroupSpecs[0].numOfHosts",
    ),
    "google.com/tpu is not a host's chips": (
        "rayjob-park-train.yaml",
        break_tpu_per_pod,
        "workerGroupSpecs[0].template.spec.containers[0].resources.limits",
    ),
    "field the CRD does not declare": (
        "rayjob-park-train.yaml",
        break_unknown_field,
        "Additional properties are not allowed ('entrypointt' was unexpected)",
    ),
    "rayStartParams value not a string": (
        "rayjob-park-train.yaml",
        break_ray_start_param_type,
        "workerGroupSpecs[0].rayStartParams.num-cpus: the value is not of type 'string'",
    ),
    "entrypoint workers vs pods": (
        "rayjob-park-train.yaml",
        break_num_workers,
        "RayJob/park-train: spec.entrypoint: --num-workers 8",
    ),
    "no TPU toleration": (
        "rayjob-park-train.yaml",
        break_toleration,
        "workerGroupSpecs[0].template.spec.tolerations",
    ),
    "more replicas than the pool's slices": (
        "rayservice-park-serve.yaml",
        break_max_replicas,
        "spec.rayClusterConfig.workerGroupSpecs[0].maxReplicas",
    ),
    "TP does not fit the slice": (
        "rayservice-park-serve.yaml",
        break_tp,
        "llm_configs[0].engine_kwargs.tensor_parallel_size",
    ),
    "multi-host TP without the Ray backend": (
        "rayservice-park-serve.yaml",
        break_multihost_backend,
        "TPU_MULTIHOST_BACKEND=ray",
    ),
    "LLM topology unlike its worker group": (
        "rayservice-park-serve.yaml",
        break_serve_topology,
        "llm_configs[0].accelerator_config.topology",
    ),
    "privileged container (the policy pack's pod hardening)": (
        "rayjob-park-train.yaml",
        _break_privileged,
        "headGroupSpec.template container ray-head: privileged containers are not allowed",
    ),
    "hostPath volume": (
        "rayjob-park-train.yaml",
        _break_host_path,
        "hostPath volumes are not allowed",
    ),
    "core object with an unknown field": (
        "namespace-park.yaml",
        break_namespace,
        "Namespace/park",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_MANIFESTS))
def test_validate_catches_hand_broken_manifest(case, rendered_dirs, tmp_path):
    filename, edit, message = BROKEN_MANIFESTS[case]
    manifests = tmp_path / "manifests"
    shutil.copytree(rendered_dirs["prod"], manifests)
    doc = yaml.safe_load((manifests / filename).read_text())
    edit(doc)
    (manifests / filename).write_text(yaml.safe_dump(doc, sort_keys=False))
    result = park("validate", "prod", "--manifests", str(manifests), "--no-serve-check")
    assert result.exit_code == 1, result.output
    assert message in result.output


def test_unedited_manifests_validate(rendered_dirs):
    result = park("validate", "prod", "--manifests", str(rendered_dirs["prod"]), "--no-serve-check")
    assert result.exit_code == 0, result.output


@pytest.mark.serve
@pytest.mark.skipif(not serve_check_available(), reason="workloads not installed")
def test_rays_classes_catch_an_unknown_engine_knob(rendered_dirs, tmp_path):
    """Only Ray's LLMConfig + vLLM's engine args know which engine_kwargs exist."""
    manifests = tmp_path / "manifests"
    shutil.copytree(rendered_dirs["dev"], manifests)
    path = manifests / "rayservice-park-serve.yaml"
    doc = yaml.safe_load(path.read_text())
    serve, llm = _serve_llm(doc)
    llm["engine_kwargs"]["max_num_seqz"] = 8
    _set_serve(doc, serve)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = park("validate", "dev", "--manifests", str(manifests))
    assert result.exit_code == 1, result.output
    assert "RayService/park-serve: spec.serveConfigV2:" in result.output
    assert "max_num_seqz" in result.output
