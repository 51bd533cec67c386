"""The resolve step: a validated stack spec → a frozen StackPlan, every derived number once.

`stack.resolve` builds the whole plan; `types` holds its records (the pieces the layers above
read); `training`, `rl`, `disk` and `host_memory` derive their pieces, and `training_fit` sizes
a training step per chip. Inside this package, modules import each other by module, never
through this file, so the package has no cycle (tests/infra/test_layers.py); this file
re-exports only what the layers above import from the package.
"""

from infra.resolve.stack import StackPlan, resolve, resolve_pool
from infra.resolve.types import PoolPlan, ServedModelPlan, ServingPlan, TrainingPlan

__all__ = [
    "PoolPlan",
    "ServedModelPlan",
    "ServingPlan",
    "StackPlan",
    "TrainingPlan",
    "resolve",
    "resolve_pool",
]
