"""From a model and data to a served endpoint, in one stack: park:training's keys reach the
trainer as it parses them, its refusals fail the preview under the stack key, and a served
model with `source: training` loads the run's export where the run writes it.

The references: the trainer's own argument parser and rules (workloads/train/config.py), the
export path rule the trainer writes to (workloads/protocol.py), and KubeRay's pod specs as
rendered.
"""

from __future__ import annotations

import copy
import shlex

import pytest
import yaml

from infra import model_lookup
from infra.plan import ray as ray_plan
from infra.schema.read import read_stack_file
from infra.stack import from_values
from infra.tools.checks import check_manifests
from tests.conftest import STACKS_DIR, render_stack
from tests.infra.stack_problems import problems_of
from workloads import protocol
from workloads.train.config_check import parse_args


def _dev(**training) -> dict:
    values, _ = read_stack_file(STACKS_DIR / "Pulumi.dev.yaml")
    values = copy.deepcopy(values)
    values["park:training"] = {**values["park:training"], **training}
    return values


# park:training keys a stack sets, their values, and the trainer's field that must hold each.
PASSED = [
    ("objective", "sft", "objective"),
    ("data", "/data/chats.jsonl", "data"),
    ("messagesField", "conversation", "messages_field"),
    ("lrSchedule", "linear", "lr_schedule"),
    ("minLrRatio", 0.05, "min_lr_ratio"),
    ("warmupSteps", 7, "warmup_steps"),
    ("keepCheckpoints", 3, "keep_checkpoints"),
    ("exportEvery", 2, "export_every"),
    ("exportDtype", "bfloat16", "export_dtype"),
    ("exportMaxShardSize", "2GiB", "export_max_shard_size"),
    ("activationCheckpointing", True, "activation_checkpointing"),
    ("learningRate", 1e-5, "lr"),
]


def test_training_keys_reach_the_trainer_as_it_parses_them():
    values = _dev(model="Qwen/Qwen3-0.6B", **{key: value for key, value, _ in PASSED})
    plan = from_values(values, "dev")
    rayjob = ray_plan.rayjob(plan.training, ray_plan.ray_pods(plan))
    words = shlex.split(rayjob["spec"]["entrypoint"])
    assert words[:3] == ["python", "-m", protocol.TRAIN_MODULE]
    parsed = parse_args(words[3:])  # the trainer's own parser
    expected = {field: value for _, value, field in PASSED} | {
        # a hub model is read from its copy staged once in the bucket (infra/resolve/disk.py)
        "model": f"{plan.spec.storage.mount_path}/models/Qwen/Qwen3-0.6B",
        "export": True,
        "num_workers": 8,
        "storage_path": plan.training.storage_path,
        "run_name": plan.training.run_name,
    }
    assert {k: getattr(parsed, k) for k in expected} == expected


def test_a_gpt_preset_run_renders_no_model_fields():
    values = _dev(model=None, objective="clm", data="synthetic", modelSize="tiny")
    values["park:serving"] = {"enabled": False}
    plan = from_values(values, "dev")
    fields = ray_plan.trainer_flags(plan.training)
    assert fields["model_size"] == "tiny"
    assert not {"model", "export", "tokenizer", "init", "text_field"} & set(fields)
    assert fields["objective"] == "clm"


@pytest.mark.parametrize(
    ("training", "key", "fragment"),
    [
        # the trainer's own rules, named by the stack key
        (
            {"model": None, "objective": "sft", "data": "synthetic"},
            "park:training.objective",
            "needs --model",
        ),
        (
            {"model": None, "objective": "clm", "data": "synthetic", "exportEvery": 2},
            "park:training.exportEvery",
            "needs --model",
        ),
        ({"data": "park:recipes"}, "park:training.data", "park:"),
        ({"objective": "sft", "data": "synthetic"}, "park:training.objective", "sft"),
        # the spec's
        ({"exportMaxShardSize": "5 gigs"}, "park:training.exportMaxShardSize", "pattern"),
        ({"minLrRatio": 2}, "park:training.minLrRatio", "less than or equal to 1"),
        ({"lrSchedule": "step"}, "park:training.lrSchedule", "cosine"),
        # the model: one the trainer trains, reachable with the stack's credentials
        ({"model": "Qwen/Qwen3-30B-A3B"}, "park:training.model", "mixture of experts"),
        ({"model": "meta-llama/Llama-3.1-8B"}, "park:hfToken", "park:training.model"),
        ({"model": "park:giant"}, "park:training.model", "no such built-in model"),
    ],
)
def test_a_training_config_the_trainer_refuses_fails_at_preview(training, key, fragment):
    problems = problems_of(_dev(**training))
    assert key in problems, problems
    assert fragment in problems[key]


def test_the_served_export_is_where_the_run_writes_it():
    plan = from_values(_dev(), "dev")
    (model,) = plan.serving.models
    assert model.from_training
    export = protocol.training_export_path(plan.training.storage_path, plan.training.run_name)
    assert model.source == export == plan.training.export_path
    assert export == f"gs://{plan.names.bucket}/checkpoints/dev-park-train/export/final"
    # its facts are the base model's, so the engine's rules and the fit table apply
    assert model.facts.facts == model_lookup.lookup("Qwen/Qwen3-1.7B").facts
    assert model.fit is not None
    rendered = render_stack("dev")
    (service,) = [m for m in rendered.manifests() if m["kind"] == "RayService"]
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    (llm,) = serve["applications"][0]["args"]["llm_configs"]
    assert llm["model_loading_config"]["model_source"] == (
        "/data/checkpoints/dev-park-train/export/final"
    )
    assert not check_manifests(rendered.manifests(), rendered.plan)


@pytest.mark.parametrize(
    ("training", "fragment"),
    [
        ({"enabled": False}, "park:training is not enabled"),
        ({"model": None, "objective": "clm", "data": "synthetic"}, "set park:training.model"),
        ({"export": False}, "does not export"),
    ],
)
def test_serving_the_training_run_needs_a_run_that_exports(training, fragment):
    problems = problems_of(_dev(**training))
    assert fragment in problems.get("park:serving.models[0].source", ""), problems


def test_a_gated_base_model_needs_the_token_for_training_not_for_serving_its_export():
    values = _dev(model="meta-llama/Llama-3.2-1B")
    values["park:serving"]["models"][0]["tensorParallelSize"] = 8
    problems = problems_of(values)
    assert list(problems) == ["park:hfToken"]  # once: the trainer downloads, serving does not
    assert "park:training.model" in problems["park:hfToken"]
    values["park:hfToken"] = "[secret]"
    plan = from_values(values, "dev")
    rayjob = ray_plan.rayjob(plan.training, ray_plan.ray_pods(plan), hf_token=True)
    workers = rayjob["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert any(e["name"] == "HF_TOKEN_PATH" for e in workers["containers"][0]["env"])
    assert any("secret" in v for v in workers["volumes"])


def _service(rendered) -> dict:
    return copy.deepcopy(next(m for m in rendered.manifests() if m["kind"] == "RayService"))


def _worker_spec(service: dict) -> dict:
    return service["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]


def test_validate_finds_a_serving_pod_that_cannot_read_the_export():
    rendered = render_stack("dev")
    # the worker pod lost its bucket mount: the engine there cannot read the export
    unmounted = _service(rendered)
    spec = _worker_spec(unmounted)
    spec["volumes"] = [v for v in spec["volumes"] if "csi" not in v]
    spec["containers"][0]["volumeMounts"] = [
        m for m in spec["containers"][0]["volumeMounts"] if m["name"] != "gcs"
    ]
    found = [str(p) for p in check_manifests([unmounted], rendered.plan)]
    assert any("is under no GCS FUSE mount" in p and "workerGroupSpecs[0]" in p for p in found)
    # another bucket at the mount: not where the run writes
    other = _service(rendered)
    for volume in _worker_spec(other)["volumes"]:
        if "csi" in volume:
            volume["csi"]["volumeAttributes"]["bucketName"] = "someone-elses-bucket"
    found = [str(p) for p in check_manifests([other], rendered.plan)]
    assert any("someone-elses-bucket" in p for p in found)
    # a model source that is not the run's export
    moved = _service(rendered)
    serve = yaml.safe_load(moved["spec"]["serveConfigV2"])
    serve["applications"][0]["args"]["llm_configs"][0]["model_loading_config"]["model_source"] = (
        "/data/checkpoints/elsewhere/final"
    )
    moved["spec"]["serveConfigV2"] = yaml.safe_dump(serve)
    found = [str(p) for p in check_manifests([moved], rendered.plan)]
    assert any("the run exports to" in p for p in found)


def test_the_builtin_tiny_llama_has_the_facts_the_trainer_builds_it_with():
    from workloads.train.models import tiny_llama

    facts = model_lookup.lookup("park:tiny-llama").facts
    assert facts is not None and facts.architecture == "LlamaForCausalLM"
    assert facts.attention_heads == tiny_llama.SPEC["num_attention_heads"]
    assert facts.kv_heads == tiny_llama.SPEC["num_key_value_heads"]
    assert facts.max_positions == tiny_llama.SPEC["max_position_embeddings"]
