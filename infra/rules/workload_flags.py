"""A workload's own config rules, asked at preview time and answered with a stack key.

The trainer (workloads/train/config.py) and the RL workload (workloads/rl/config.py) refuse a
combination by its --flag; preview reads the flag back out of the refusal and names the stack
key that set it (or the pool, for the flags the plan derives from the pool and the catalog).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic.alias_generators import to_camel

from infra.resolve import StackPlan
from infra.schema.errors import ConfigProblem
from workloads import protocol
from workloads.flags import stack_keys, stack_name

# Flags the plan sets from a pool and the catalog: a refusal of one is the pool's problem.
POOL_FLAGS = frozenset(
    {
        "accelerator",
        "num_workers",
        "tpu_topology",
        "tpu_accelerator_type",
        "torch_tpu_topology",
        "chips_per_host",
    }
)
# Training also derives the slice count and the chips' peak from the pool.
_TRAINING_POOL_FLAGS = POOL_FLAGS | {"num_slices", "peak_tflops_per_device"}


def refused_field(message: str) -> str:
    """The config field a workload's refusal names by its --flag ('' when it names none)."""
    match = re.search(r"--([a-z0-9-]+)", message)
    return protocol.field_of(match.group(1)) if match else ""


def stack_key(config: type, field: str) -> str:
    """The stack key (camelCase) of a workload's flag: the key its declaration names (the
    trainer's `lr` is `learningRate`, workloads/train/config.py), else the flag's own name."""
    named = {f.name: stack_name(f, key) for f, key in stack_keys(config)}
    return to_camel(named.get(field, field))


def trainer_problems(plan: StackPlan) -> list[ConfigProblem]:
    """The entrypoint's flags through the trainer's own config rules (workloads/train/
    config.py, torch-free): a combination it refuses fails here, named by its stack key."""
    from infra.plan.ray import trainer_flags
    from workloads.flags import ConfigError as TrainerError
    from workloads.train.config import TrainConfig
    from workloads.train.config_check import validate

    assert plan.training is not None
    fields = trainer_flags(plan.training)
    try:
        validate(TrainConfig.from_dict(fields))
    except TrainerError as err:
        message = str(err)
        field = refused_field(message)
        value: Any = None
        if field in _TRAINING_POOL_FLAGS:
            key, value = "park:training.pool", plan.spec.training.pool
        elif field:
            key, value = (
                f"park:training.{stack_key(TrainConfig, field)}",
                fields.get(field),
            )
        else:
            key = "park:training"
        return [ConfigProblem(key, value, f"the trainer refuses it: {message}")]
    return []
