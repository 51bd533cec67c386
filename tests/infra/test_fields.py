"""One declaration per job key: a workload's flag with `stack=` (workloads/train/config.py,
workloads/rl/config.py) is the stack key, the component argument and the entrypoint's flag.

The written blocks (infra/tools/fields.py) are held to their declarations; a key added in test
data, once, is seen by pydantic's JSON schema, Pulumi's schema analyzer, argparse and the
rendered RayJob entrypoint."""

from __future__ import annotations

import dataclasses
import importlib.util
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pydantic
import pytest

from infra.plan import ray as ray_plan
from infra.plan.ray import job as ray_job
from infra.rules.workload_flags import stack_key
from infra.schema import jobs
from infra.stack import from_file
from infra.tools import docs, fields
from park_gke import provider
from tests.conftest import STACKS_DIR
from workloads import flags, protocol
from workloads.flags import opt
from workloads.flags import stack as key
from workloads.rl.config import RLRunConfig
from workloads.train.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class WithLabelSmoothing(TrainConfig):
    """The trainer with one more option: its one declaration."""

    loss_reduction: str = opt(
        "mean",
        "how token losses combine",
        choices=("mean", "sum"),
        stack=key("How token losses combine: `mean` or `sum`."),
    )
    label_smoothing: float = opt(
        0.0,
        "label smoothing of the cross-entropy",
        type=float,
        stack=key("Label smoothing of the cross-entropy (0: none).", ge=0, lt=1),
    )


def _load(path: Path, name: str, text: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """`text` as module `name` (written to `path`, so its classes have source to read)."""
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


def test_the_written_blocks_are_their_declarations():
    assert fields.spec_text() == fields.SPEC.read_text(), (
        "a workload flag's stack key changed: run `python -m infra.tools.fields`"
    )
    assert fields.args_text() == fields.ARGS.read_text(), (
        "park:training's keys changed: run `python -m infra.tools.fields`"
    )


def test_a_new_training_option_is_one_declaration(tmp_path, monkeypatch):
    sections = {"training": WithLabelSmoothing, "rl": RLRunConfig}
    spec = _load(tmp_path / "jobs.py", "park_fields_jobs", fields.spec_text(sections), monkeypatch)
    model = spec.TrainingConfig

    # the stack schema: pydantic's JSON schema, and README's config reference row
    prop = model.model_json_schema(by_alias=True)["properties"]["labelSmoothing"]
    assert prop["type"] == "number" and prop["default"] == 0.0
    assert (prop["minimum"], prop["exclusiveMaximum"]) == (0, 1)
    assert prop["description"] == "Label smoothing of the cross-entropy (0: none)."
    with pytest.raises(pydantic.ValidationError, match="labelSmoothing"):
        model.model_validate({"labelSmoothing": 1.5})
    row = docs.description(model.model_fields["label_smoothing"])
    assert row == "Label smoothing of the cross-entropy (0: none)."
    reduction = model.model_json_schema(by_alias=True)["properties"]["lossReduction"]
    assert (reduction["enum"], reduction["default"]) == (["mean", "sum"], "mean")

    # the component argument, as Pulumi's analyzer reads it for the provider schema
    args_source = fields.args_text(model, WithLabelSmoothing)
    args = _load(tmp_path / "args.py", "park_fields_args", args_source, monkeypatch)
    assert "label_smoothing" in args.TrainingArgs.__optional_keys__
    properties, names = provider.analyzer().analyze_type(
        args.TrainingArgs, is_component_output=False
    )
    assert names["labelSmoothing"] == "label_smoothing"
    described = properties["labelSmoothing"]
    assert described.description == "Label smoothing of the cross-entropy (0: none). Default: 0.0."
    assert described.type.value == "number"
    assert properties["lossReduction"].type.value == "string"  # unnamed choices: the spec's check

    # the trainer's flag and the RayJob's entrypoint, read back by argparse
    parser = flags.build_parser(WithLabelSmoothing, prog="train", description="")
    assert parser.parse_args(["--label-smoothing", "0.1"]).label_smoothing == 0.1
    plan = from_file(STACKS_DIR / "Pulumi.dev.yaml")
    assert plan.training is not None
    keys = plan.training.spec.model_dump() | {"label_smoothing": 0.1}
    training = dataclasses.replace(plan.training, spec=model.model_validate(keys))
    monkeypatch.setattr(ray_job, "TrainConfig", WithLabelSmoothing)
    entrypoint = protocol.render_entrypoint(ray_plan.trainer_flags(training))
    assert "--label-smoothing 0.1" in entrypoint
    assert parser.parse_args(shlex.split(entrypoint)[3:]).label_smoothing == 0.1


def test_the_stack_keys_are_the_flags_that_declare_them():
    """What a key's declaration gives infra: its name, default, choices and bounds."""
    training = jobs.TrainingConfig.model_fields
    assert training["learning_rate"].default == TrainConfig.lr  # the flag `lr`, same default
    assert training["steps"].default == 1000 != TrainConfig.steps  # a cloud run's own default
    strategy = {f.name: f for f in dataclasses.fields(TrainConfig)}["strategy"]
    schema = jobs.TrainingConfig.model_json_schema()
    assert schema["properties"]["strategy"]["enum"] == list(strategy.metadata["choices"])
    assert "sync_every" in jobs.RlConfig.model_fields  # RLRunConfig's --publish-every
    # the refusal of a flag names the key that set it
    assert stack_key(TrainConfig, "lr") == "learningRate"
    assert stack_key(RLRunConfig, "publish_every") == "syncEvery"
    assert stack_key(RLRunConfig, "rollout_tensor_parallel_size") == "tensorParallelSize"
    assert stack_key(TrainConfig, "run_name") == "runName"  # not a key: the flag's own name


def test_a_model_runs_key_reaches_a_preset_run_only_when_set():
    """`runs="model"`: a Hugging Face run's flag; on a preset run the trainer judges it only
    when the stack sets it (it refuses an init without a model)."""
    from workloads.flags import ConfigError
    from workloads.train.config_check import validate

    plan = from_file(STACKS_DIR / "Pulumi.queued.yaml")  # a GPT preset run
    assert plan.training is not None and plan.training.spec.model is None
    assert "init" not in ray_plan.trainer_flags(plan.training)
    spec = plan.training.spec.model_copy(update={"init": "pretrained"})
    set_init = ray_plan.trainer_flags(dataclasses.replace(plan.training, spec=spec))
    assert set_init["init"] == "pretrained"
    with pytest.raises(ConfigError, match="--init"):
        validate(TrainConfig.from_dict(set_init))
