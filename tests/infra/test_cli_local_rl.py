"""`park local rl`: the RL stack's RayJob entrypoint with the CPU profile is one the RL
workload's own parser accepts, every change is said, and the shipped task is the generated one."""

from __future__ import annotations

import json
import shlex

from infra.tools.local.rl import (
    RL_CPU_PROFILE,
    answers_line,
    cpu_rl_entrypoint,
    reward_line,
    runs_rl,
    serve_config,
    toy_prompts,
)
from tests.conftest import render_stack
from workloads import protocol
from workloads.protocol import flag, split_entrypoint
from workloads.rl.config_check import parse_args
from workloads.rl.toy import prompts
from workloads.train.outputs.export import MARKER_NAME


def _rayjob() -> dict:
    return next(m for m in render_stack("rl").manifests() if m["kind"] == "RayJob")


def test_rl_profile_gives_a_cpu_run_the_workload_accepts():
    rayjob = _rayjob()
    assert runs_rl(rayjob)
    rendered = rayjob["spec"]["entrypoint"]
    entrypoint, changes = cpu_rl_entrypoint(rendered)
    words = shlex.split(entrypoint)
    assert words[:3] == ["python", "-m", "workloads.rl"]
    cfg = parse_args(words[3:])  # the workload's own parser and rules
    assert (cfg.accelerator, cfg.num_workers, cfg.rollout_accelerator) == ("cpu", 1, "cpu")
    assert cfg.model == "park:tiny-llama" and cfg.init == "config"
    assert cfg.tpu_topology is None and cfg.rollout_torch_tpu_topology is None
    assert cfg.rollout_resource is None  # one local node: no rollout pods to pin engines to
    # the rendered bucket path: the job writes to the emulated bucket (infra/tools/local/bucket.py)
    assert cfg.storage_path == split_entrypoint(rendered)[1]["storage_path"] and cfg.export
    assert cfg.storage_path.startswith("gs://")
    assert cfg.data == str(toy_prompts()) and cfg.rewards == "workloads.rl.toy:vowel_share"
    assert cfg.probe_prompts == 1  # the starting policy's answer to the served question
    # what the profile does not name is kept as rendered (the run name, the temperature, ...)
    _, before = split_entrypoint(rendered)
    _, after = split_entrypoint(entrypoint)
    for field, value in before.items():
        if field not in RL_CPU_PROFILE:
            assert after[field] == value
    assert any(c.startswith("--accelerator tpu -> cpu (") for c in changes)
    assert any(c.startswith(f"{flag('tpu_topology')} ") and "dropped" in c for c in changes)


def test_training_jobs_are_not_rl():
    rayjob = next(m for m in render_stack("dev").manifests() if m["kind"] == "RayJob")
    assert not runs_rl(rayjob)


def test_shipped_prompts_are_the_toy_task():
    lines = toy_prompts().read_text().splitlines()
    assert [json.loads(line) for line in lines] == prompts()


def test_reward_line_and_serve_config():
    assert reward_line(0.312, 0.6) == "reward  0.31 → 0.60"
    llm = serve_config("/x/export/final")["applications"][0]["args"]["llm_configs"][0]
    assert llm["model_loading_config"]["model_source"] == "/x/export/final"
    # its replica waits for the marker the export writes last (the job runs beside it)
    assert llm["callback_config"]["callback_class"] == protocol.SERVE_WAIT_CALLBACK
    assert llm["callback_config"]["callback_kwargs"]["marker"] == MARKER_NAME


def test_answers_line_scores_both_answers_with_the_task_reward():
    """The served answer's score beside the starting policy's (the run's probe), both by the
    task's reward (the share of vowels)."""
    start = {"prompt": "q", "reply": "xkcd", "reward": 0.0, "version": 0}
    line = answers_line("q", start, "aeio u")
    assert line.startswith("answer reward  0.00 → 1.00")
    assert "'xkcd'" in line and "'aeio u'" in line
    assert answers_line("q", {}, "ab").startswith("answer reward  n/a → 0.50")
    assert "no probe" in answers_line("q", {}, "ab")
