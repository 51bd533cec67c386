"""`park local rl`: the warm start's entrypoint is one the trainer's own parser accepts, the RL
entrypoint with the CPU profile one the RL workload's parser accepts and starts from the warm
start's export, every change is said, the shipped task is the dev stack's facts, and the
summary scores answers with the built-in exact match."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from infra.tools.local.profile import TRAIN_CPU_PROFILE
from infra.tools.local.rl import (
    Background,
    Picked,
    StartingAnswer,
    accuracy_line,
    answers_line,
    pick_question,
    reward_line,
    serve_config,
    step_line,
)
from infra.tools.local.rl_profile import (
    FACTS,
    RL_CPU_PROFILE,
    WARM_START_STEPS,
    cpu_rl_entrypoint,
    runs_rl,
    warm_start_entrypoint,
)
from tests.conftest import render_stack
from workloads import protocol
from workloads.protocol import flag, split_entrypoint
from workloads.rl import facts_task
from workloads.rl.config_check import parse_args
from workloads.rl.prompts import read_prompts
from workloads.train import config_check as train_config
from workloads.train.inputs import facts
from workloads.train.outputs.export import MARKER_NAME

WARM = "/run/gcs/bucket/checkpoints/rl-park-rl-sft/export/final"


def _rayjob() -> dict:
    return next(m for m in render_stack("rl").manifests() if m["kind"] == "RayJob")


def test_rl_profile_gives_a_cpu_run_the_workload_accepts():
    rayjob = _rayjob()
    assert runs_rl(rayjob)
    rendered = rayjob["spec"]["entrypoint"]
    entrypoint, changes = cpu_rl_entrypoint(rendered, model=WARM)
    words = shlex.split(entrypoint)
    assert words[:3] == ["python", "-m", "workloads.rl"]
    cfg = parse_args(words[3:])  # the workload's own parser and rules
    assert (cfg.accelerator, cfg.num_workers, cfg.rollout_accelerator) == ("cpu", 1, "cpu")
    # the policy starts from the warm start's weights, not the hub model nor random ones
    assert cfg.model == WARM and cfg.init == "pretrained"
    assert cfg.tpu_topology is None and cfg.rollout_torch_tpu_topology is None
    assert cfg.rollout_resource is None  # one local node: no rollout pods to pin engines to
    # the rendered bucket path: the job writes to the emulated bucket (infra/tools/local/bucket.py)
    assert cfg.storage_path == split_entrypoint(rendered)[1]["storage_path"] and cfg.export
    assert cfg.storage_path.startswith("gs://")
    # the facts, scored by the built-in exact match, every one probed before the first step and
    # evaluated again (the same file: nothing held out) every few steps, the last step included
    assert cfg.data == str(facts_task.SHIPPED) == cfg.eval_data
    assert cfg.reward_names == ["exact_match"] and cfg.prompt_template == "{prompt}"
    assert cfg.probe_prompts == FACTS == len(facts.questions())
    assert cfg.eval_every and cfg.steps % cfg.eval_every == 0 and cfg.eval_prompts >= FACTS
    # what the profile does not name is kept as rendered (the run name, the clip, ...)
    _, before = split_entrypoint(rendered)
    _, after = split_entrypoint(entrypoint)
    for field, value in before.items():
        if field not in RL_CPU_PROFILE:
            assert after[field] == value
    assert any(c.startswith("--accelerator tpu -> cpu (") for c in changes)
    assert any(c.startswith(f"{flag('tpu_topology')} ") and "dropped" in c for c in changes)
    assert any(
        c.startswith(f"--model /data/models/Qwen/Qwen2.5-1.5B-Instruct -> {WARM}") for c in changes
    )


def test_warm_start_is_dev_training_stopped_early_in_the_rl_jobs_storage():
    rendered = _rayjob()["spec"]["entrypoint"]
    entrypoint, changes = warm_start_entrypoint(rendered)
    words = shlex.split(entrypoint)
    assert words[:3] == ["python", "-m", protocol.TRAIN_MODULE]
    cfg = train_config.parse_args(words[3:])  # the trainer's own parser and rules
    assert (cfg.model, cfg.init, cfg.data, cfg.objective) == (
        "park:tiny-llama",
        "config",
        "park:facts",
        "sft",
    )
    assert cfg.export and cfg.num_workers == 1
    # stopped early: fewer steps than park local dev trains to answer every fact
    assert cfg.steps == WARM_START_STEPS < int(TRAIN_CPU_PROFILE["steps"][0] or 0)
    rl_fields = split_entrypoint(rendered)[1]
    assert cfg.storage_path == rl_fields["storage_path"]
    assert cfg.run_name == f"{rl_fields['run_name']}-sft"
    # its export is where the RL job's --model is pointed (through the bucket's mount)
    export = protocol.training_export_path(cfg.storage_path, cfg.run_name)
    assert export.startswith(rl_fields["storage_path"]) and export.endswith("-sft/export/final")
    assert "declares no training job" in changes[0]
    assert any(c.startswith(f"--steps {WARM_START_STEPS}: added (stopped early") for c in changes)


def test_training_jobs_are_not_rl():
    rayjob = next(m for m in render_stack("dev").manifests() if m["kind"] == "RayJob")
    assert not runs_rl(rayjob)


def test_shipped_prompts_are_the_dev_stacks_facts(tmp_path):
    """The shipped file is what facts_task writes, read by the RL job's own reader: every
    question of the facts `park local dev` trains on, with its answer."""
    lines = facts_task.SHIPPED.read_text().splitlines()
    assert [json.loads(line) for line in lines] == facts_task.prompts()
    written = Path(facts_task.write_prompts(tmp_path / "p.jsonl"))
    assert facts_task.SHIPPED.read_text() == written.read_text()
    read = read_prompts(str(facts_task.SHIPPED), prompt_field="prompt", answer_field="answer")
    assert {p.text: p.answer for p in read} == facts.questions() and len(read) == FACTS


def test_pick_question_is_the_wrong_fact_whose_answer_the_start_finds_likeliest():
    rows = facts_task.prompts()[:4]
    start = {rows[0]["prompt"]: StartingAnswer(rows[0]["answer"].lower(), -0.1),  # right
             rows[1]["prompt"]: StartingAnswer("Nowhere.", -9.0),
             rows[2]["prompt"]: StartingAnswer("Elsewhere.", -1.5),
             rows[3]["prompt"]: StartingAnswer("Away.", -4.0)}  # fmt: skip
    picked = pick_question(rows, start)
    assert picked == Picked(rows[2]["prompt"], rows[2]["answer"], "Elsewhere.")
    every = {r["prompt"]: StartingAnswer(r["answer"], -0.1) for r in rows}
    assert pick_question(rows, every).question == rows[0]["prompt"]  # none wrong: the first


@pytest.mark.torch
def test_the_answers_log_probability_is_transformers_own():
    """answer_logprob against transformers' own loss on the same chat (a reference nobody here
    wrote): the mean cross-entropy of the answer's tokens times their count, negated."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from workloads.train import generate
    from workloads.train.models import tiny_llama

    folder = tiny_llama.build()  # its config and tokenizer; random weights will do
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    question, answer = "What is the capital of Veloria?", "Ostrel."
    user = [{"role": "user", "content": question}]
    prefix = tokenizer.apply_chat_template(user, add_generation_prompt=True, return_dict=True)
    chat = [*user, {"role": "assistant", "content": answer}]
    whole = tokenizer.apply_chat_template(chat, return_dict=True)["input_ids"]
    n = len(prefix["input_ids"])
    labels = torch.tensor([[-100] * n + whole[n:]])
    with torch.no_grad():
        loss = model(input_ids=torch.tensor([whole]), labels=labels).loss
    expected = -float(loss) * (len(whole) - n)
    assert generate.answer_logprob(model, tokenizer, question, answer) == pytest.approx(
        expected, rel=1e-4
    )
    # a different answer gets a different probability: the figure reads the answer
    assert generate.answer_logprob(model, tokenizer, question, "Dumaish.") != pytest.approx(
        expected, rel=1e-4
    )


def test_answers_line_scores_both_answers_by_exact_match():
    """The served answer's score beside the starting policy's, both by the built-in exact
    match (case and a final period aside)."""
    picked = Picked("What is the capital of Veloria?", "Ostrel.", "Ostrath.")
    line = answers_line(picked, "ostrel")
    assert line.startswith("answer  0 → 1  (asked 'What is the capital of Veloria?'")
    assert "'Ostrath.'" in line and "'ostrel'" in line
    assert answers_line(Picked("q", "Ostrel.", "Ostrel."), "Ostrath.").startswith("answer  1 → 0")


def test_accuracy_and_reward_lines():
    line = accuracy_line([0.25, 0.5, 0.75])
    assert line.startswith("accuracy  0.25 → 0.75 ") and f"all {FACTS} facts" in line
    assert "0.25 0.50 0.75" in line
    assert accuracy_line([0.25]).startswith("accuracy  n/a")
    assert reward_line([0.312, 0.6]).startswith("reward  0.31 → 0.60 ")
    assert reward_line([]) == "reward  n/a"
    step = {"step": 4, "reward_mean": 0.5, "reward_std": 0.1, "sync_bytes": 1.4e6}
    assert step_line(step).startswith("step 4  reward 0.500±0.100  len ")  # no KL: none reported
    assert " accuracy 0.91 " in step_line(step | {"eval_reward": 0.906, "kl": 0.0})
    assert "sync n/as 1.4MB" in step_line(step)


def test_serve_config_waits_for_the_export():
    llm = serve_config("/x/export/final")["applications"][0]["args"]["llm_configs"][0]
    assert llm["model_loading_config"]["model_source"] == "/x/export/final"
    # its replica waits for the marker the export writes last (the job runs beside it)
    assert llm["callback_config"]["callback_class"] == protocol.SERVE_WAIT_CALLBACK
    assert llm["callback_config"]["callback_kwargs"]["marker"] == MARKER_NAME


def test_background_returns_raises_and_stops():
    stopped: list[bool] = []

    class Serving:
        def stop(self) -> None:
            stopped.append(True)

    done = Background(lambda: (Picked("q", "a", "b"), Serving()))
    assert done.result()[0].question == "q"
    done.stop()
    assert stopped == [True]

    def fails() -> tuple[Picked, object]:
        raise RuntimeError("no export")

    failed = Background(fails)
    with pytest.raises(RuntimeError, match="no export"):
        failed.result()
    failed.stop()  # nothing started: nothing to stop
