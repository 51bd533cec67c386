"""The CPU profile of the training job: every change `park local` makes to the RayJob's
entrypoint, in one place, each with its reason.

The entrypoint is read and written through the workloads' own protocol (workloads/protocol.py):
field names of TrainConfig, not hand-parsed flags.
"""

from __future__ import annotations

from typing import Any

import yaml

from workloads import protocol

# field -> (new value, or None to drop it; why).
ProfileTable = dict[str, tuple[str | None, str]]
# What both CPU profiles (this training one, rl.py's RL one) change alike: CPU, no TPU slice.
ON_CPU = ("cpu", "no TPU here: torch on CPU, gloo process group")
NO_TPU_SLICE: ProfileTable = {
    "tpu_topology": (None, "no TPU slice"),
    "tpu_accelerator_type": (None, "no TPU slice"),
    "torch_tpu_topology": (None, "no TPU slice"),
    "chips_per_host": (None, "no TPU slice"),
}
# ... and what both do to run once, here: no retries. The storage path stays the rendered
# gs:// one: the job writes to the emulated bucket (bucket.py), as the pods do to the real one.
LOCAL_RUN: ProfileTable = {
    "max_failures": ("0", "fail fast instead of retrying"),
}
# The loop the stack runs on TPU, small enough for two CPU cores: a tiny Llama built on the
# worker (random weights from a config, a tokenizer trained there), supervised fine-tuning on
# the shipped made-up facts, an export the serving half then loads. The stack's strategy
# (DDP or FSDP2), schedule shape and export settings are kept.
TRAIN_CPU_PROFILE: ProfileTable = {
    "accelerator": ON_CPU,
    "num_workers": ("2", "two Ray Train workers on this machine"),
    **NO_TPU_SLICE,
    "num_slices": (None, "no TPU slice"),
    "peak_tflops_per_device": (None, "a TPU peak; MFU on CPU is not meaningful"),
    "model": ("park:tiny-llama", "a 0.6M-parameter Llama built here, no download"),
    "model_wait_s": (None, "a model built here is not staged: nothing to wait for"),
    "tokenizer": (None, "the tiny model's own"),
    "init": ("config", "random weights: what it answers, it learned here"),
    "model_size": (None, "the tiny Llama instead of a GPT preset"),
    "data": ("park:facts", "32 made-up facts the model can learn in a minute"),
    "objective": ("sft", "chat template, loss on the answers only"),
    "steps": ("100", "enough to answer every fact"),
    "global_batch_size": ("8", "4 chats per worker"),
    # The plan's micro-batch is sized for a TPU chip's memory (infra.resolve.training_fit).
    "micro_batch_size": ("2", "2 chats a pass, 2 passes a step: gradients accumulate as on TPU"),
    "seq_len": ("128", "a few facts per sequence"),
    "lr": ("0.003", "a tiny model learns fast"),
    "warmup_steps": ("10", "a tenth of the run"),
    "checkpoint_every": ("50", "two checkpoints in 100 steps"),
    "report_every": ("10", "progress every 10 steps"),
    **LOCAL_RUN,
    "no_export": (None, "serving loads the export"),
}


def staged_profile(local: str, repo: str) -> ProfileTable:
    """TRAIN_CPU_PROFILE for a run whose model the stack stages (`park local` stages the tiny
    Llama from a local hub into the run's bucket folder, infra/tools/local/staging.py): the
    model is that folder, and the trainer waits for it as rendered (--model-wait-s)."""
    why = (
        f"the stack's staged copy of {repo}, in this run's bucket folder: the tiny Llama, "
        "staged there from a local hub once the trainer waits for it"
    )
    table = {k: v for k, v in TRAIN_CPU_PROFILE.items() if k != "model_wait_s"}
    return {**table, "model": (local, why)}


# A question from the training data the served export is asked (and its learned answer).
FACT_QUESTION_INDEX = 0


class ProfileError(ValueError):
    """The RayJob cannot be run on CPU as it is (not our entrypoint, a broken runtime env)."""


def cpu_entrypoint(
    entrypoint: str,
    profile: ProfileTable | None = None,
    module: str = protocol.TRAIN_MODULE,
) -> tuple[str, list[str]]:
    """Apply a CPU profile (TRAIN_CPU_PROFILE unless given; the RL job's is in rl.py) to a
    rendered RayJob entrypoint that runs ``module``; return it and what changed."""
    head, fields = protocol.split_entrypoint(entrypoint)
    if head[-2:] != ["-m", module]:
        raise ProfileError(f"the RayJob entrypoint does not run {module}: {entrypoint!r}")
    table = TRAIN_CPU_PROFILE if profile is None else profile
    changes: list[str] = []
    out: dict[str, Any] = {}
    for field, value in fields.items():
        if field not in table:
            out[field] = True if value is None else value
            continue
        new, why = table[field]
        if new is None:
            changes.append(f"{protocol.flag(field)} {value}: dropped ({why})")
            continue
        if new != value:
            changes.append(f"{protocol.flag(field)} {value} -> {new} ({why})")
        out[field] = new
    for field, (new, why) in table.items():
        if field not in fields and new is not None:
            changes.append(f"{protocol.flag(field)} {new}: added ({why})")
            out[field] = new
    return protocol.render_entrypoint(out, tuple(head)), changes


def total_steps() -> int:
    """The steps a local run trains (the profile's `steps`)."""
    return int(TRAIN_CPU_PROFILE["steps"][0] or 0)


def runtime_env_of(rayjob: dict[str, Any]) -> dict[str, Any]:
    """The RayJob's runtimeEnvYAML as the runtime_env the Jobs API takes (unchanged)."""
    text = (rayjob.get("spec") or {}).get("runtimeEnvYAML") or "{}"
    env = yaml.safe_load(text) or {}
    if not isinstance(env, dict):
        raise ProfileError("the RayJob's runtimeEnvYAML is not a mapping")
    return env
