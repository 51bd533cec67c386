"""`park local` serves every model of the stack (issue 39): a dev stack with two models, the
training run's export and a hub model, gets both deployed, each with the CPU profile, and asks
each one question. Checked on what the local serving builds (its command, read by the serving
workload's own parser, and the CPU serveConfigV2 it deploys), without Ray or vLLM."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import stack as stack_front
from infra.rules.operator import ray_manifests
from infra.tools.local.outcome import Outcome
from infra.tools.local.ray_head import CPUS_PER_SERVED_MODEL, TRAIN_CPUS, logical_cpus
from infra.tools.local.serving import serve_command, served_ids
from tests.conftest import STACKS_DIR
from workloads import protocol
from workloads.serve import local

EXPORT = "/runs/dev/gcs/bucket/checkpoints/dev-park-train/export/final"
STAND_IN = "/cache/tiny-model"  # the tiny model the child builds for a model it has no folder of


def _two_model_dev(tmp_path: Path) -> dict:
    """The dev stack with a second served model (a hub model) on a second serving slice: its
    RayService as the plan builds it."""
    config = yaml.safe_load((STACKS_DIR / "Pulumi.dev.yaml").read_text())
    values = config["config"]
    next(p for p in values["park:tpuPools"] if p["name"] == "serve-v6e-8")["slices"] = 2
    values["park:serving"]["models"].append(
        {"name": "qwen3-0.6b", "source": "Qwen/Qwen3-0.6B", "tensorParallelSize": 8}
    )
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(config))
    plan = stack_front.from_file(path, "dev")
    assert plan.serving is not None
    assert [m.spec.name for m in plan.serving.models] == ["qwen3-1.7b-tuned", "qwen3-0.6b"]
    return next(m for m in ray_manifests(plan) if m["kind"] == "RayService")


def _child_args(tmp_path: Path, outcome: Outcome, **options: Any) -> argparse.Namespace:
    """The serving child's command line for ``outcome``, as its own parser reads it."""
    command = serve_command(
        tmp_path / "serveConfigV2.yaml",
        "127.0.0.1:1",
        outcome,
        keep=False,
        wait_for_model=True,
        config_from="/hub/tiny-llama",
        **options,
    )
    assert command[1:3] == ["-m", protocol.SERVE_LOCAL_MODULE]
    return local.build_parser().parse_args(command[3:])


def test_every_model_of_a_two_model_stack_is_served_and_asked(tmp_path):
    rayservice = _two_model_dev(tmp_path)
    text = rayservice["spec"]["serveConfigV2"]
    assert served_ids(text) == ["qwen3-1.7b-tuned", "qwen3-0.6b"]
    outcome = Outcome(
        export=EXPORT,
        question="What is the capital of Sevaeria?",
        trained_models=["qwen3-1.7b-tuned"],
    )
    args = _child_args(tmp_path, outcome)
    assert args.model is None  # no model left out
    assert args.smoke and args.wait_for_model
    folders = local.model_folders(args.serve_from)
    assert folders == {"qwen3-1.7b-tuned": EXPORT}

    cpu, changes = local.cpu_serve_config(
        yaml.safe_load(text),
        model_path=STAND_IN,
        model_paths=folders,
        keep_models=args.model,
        wait_s=int(args.timeout),
        config_from=args.config_from,
    )
    llms = {
        llm["model_loading_config"]["model_id"]: llm
        for app in cpu["applications"]
        for llm in app["args"]["llm_configs"]
    }
    assert list(llms) == ["qwen3-1.7b-tuned", "qwen3-0.6b"]  # the smoke asks each of these
    assert local.served_models(cpu) == list(llms)
    trained, hub = llms["qwen3-1.7b-tuned"], llms["qwen3-0.6b"]
    assert trained["model_loading_config"]["model_source"] == EXPORT
    assert hub["model_loading_config"]["model_source"] == STAND_IN
    # the export is still being written: its replica waits for it; the stand-in is complete
    assert trained["callback_config"]["callback_kwargs"]["timeout_s"] == int(args.timeout)
    assert "callback_config" not in hub
    for model, llm in llms.items():  # the CPU profile, each model
        assert llm["accelerator_config"] == {"kind": "cpu"}, model
        assert "accelerator_type" not in llm and "placement_group_config" not in llm, model
        assert "tensor_parallel_size" not in llm["engine_kwargs"], model
        assert any(c.startswith(f"app 'llm' model '{model}': ") for c in changes), model
    assert not any("dropped" in c for c in changes)
    # the local head has room for the training workers and both models' servers at once
    assert logical_cpus(2) >= TRAIN_CPUS + 2 * CPUS_PER_SERVED_MODEL


def test_without_a_run_every_model_serves_the_stand_in(tmp_path):
    """`park local dev --only serve`: no export; every model from the tiny model, no waits."""
    rayservice = _two_model_dev(tmp_path)
    command = serve_command(
        tmp_path / "s.yaml",
        "127.0.0.1:1",
        Outcome(),
        keep=True,
        wait_for_model=False,
        config_from=None,
    )
    args = local.build_parser().parse_args(command[3:])
    assert args.keep and not args.serve_from and not args.wait_for_model
    cpu, _ = local.cpu_serve_config(
        yaml.safe_load(rayservice["spec"]["serveConfigV2"]), model_path=STAND_IN
    )
    llms = [llm for app in cpu["applications"] for llm in app["args"]["llm_configs"]]
    assert [llm["model_loading_config"]["model_source"] for llm in llms] == [STAND_IN, STAND_IN]
    assert not any("callback_config" in llm for llm in llms)


def test_a_question_picked_while_serving_starts_reaches_the_smoke_request(tmp_path: Path):
    """`park local rl` starts serving before it picks the question: the child gets a file to
    read it from once ready, its own parser accepts it, and it reads the whole first line."""
    outcome = Outcome(export=EXPORT, trained_models=["rl-policy"])
    question = tmp_path / "served-question.txt"
    args = _child_args(tmp_path, outcome, prompt_file=question)
    assert args.prompt_file == str(question) and args.prompt == local.SMOKE_PROMPT
    with pytest.raises(SystemExit, match=r"--prompt-file .* not written in 0s"):
        local.read_prompt(args.prompt_file, timeout_s=0)
    question.write_text("What language is spoken in Zutumor?\n")
    assert local.read_prompt(args.prompt_file, timeout_s=0) == "What language is spoken in Zutumor?"
