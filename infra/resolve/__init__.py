"""The resolve step: a validated stack spec → a frozen StackPlan, every derived number once.

`stack.resolve` builds the whole plan; `types` holds its records (the pieces the layers above
read); `training`, `rl`, `disk` and `host_memory` derive their pieces, and `training_fit` sizes
a training step per chip. Inside this package, modules import each other by module, never
through this file, so the package has no cycle (tests/infra/test_layers.py).
"""

from infra.resolve.stack import (
    StackPlan,
    image,
    image_builds,
    image_name,
    resolve,
    resolve_pool,
    resolve_served_model,
    training_workers,
)
from infra.resolve.types import (
    CHECKPOINTS_PREFIX,
    WORKLOAD_IMAGE,
    GpuPoolPlan,
    ModelWait,
    PoolPlan,
    RlPlan,
    RolloutPlan,
    ServedModelPlan,
    ServingPlan,
    SyncEstimate,
    TrainingPlan,
)

__all__ = [
    "CHECKPOINTS_PREFIX",
    "WORKLOAD_IMAGE",
    "GpuPoolPlan",
    "ModelWait",
    "PoolPlan",
    "RlPlan",
    "RolloutPlan",
    "ServedModelPlan",
    "ServingPlan",
    "StackPlan",
    "SyncEstimate",
    "TrainingPlan",
    "image",
    "image_builds",
    "image_name",
    "resolve",
    "resolve_pool",
    "resolve_served_model",
    "training_workers",
]
