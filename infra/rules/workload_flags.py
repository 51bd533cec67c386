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
from infra.spec.errors import ConfigProblem
from workloads import protocol

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
# The trainer's flags that are not park:training.<camelCase of the flag>.
_TRAINING_KEY_OF_FLAG = {"lr": "learningRate"}
# Training also derives the slice count and the chips' peak from the pool.
_TRAINING_POOL_FLAGS = POOL_FLAGS | {"num_slices", "peak_tflops_per_device"}


def refused_field(message: str) -> str:
    """The config field a workload's refusal names by its --flag ('' when it names none)."""
    match = re.search(r"--([a-z0-9-]+)", message)
    return protocol.field_of(match.group(1)) if match else ""


def trainer_problems(plan: StackPlan) -> list[ConfigProblem]:
    """The entrypoint's flags through the trainer's own config rules (workloads/train/
    config.py, torch-free): a combination it refuses fails here, named by its stack key."""
    from infra.plan.ray import training_fields
    from workloads.train.config import ConfigError as TrainerError
    from workloads.train.config import TrainConfig, validate

    assert plan.training is not None
    fields = training_fields(plan.training)
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
                f"park:training.{_TRAINING_KEY_OF_FLAG.get(field, to_camel(field))}",
                fields.get(field),
            )
        else:
            key = "park:training"
        return [ConfigProblem(key, value, f"the trainer refuses it: {message}")]
    return []
