"""A stack's values for serving tests: one pool of single-host slices, one of multi-host slices."""

from __future__ import annotations

import copy
from typing import Any

TWO_POOLS: dict[str, Any] = {
    "gcp:project": "p",
    "gcp:region": "us-east5",
    "park:zone": "us-east5-b",
    "park:tpuPools": [
        {"name": "host", "machineType": "ct6e-standard-8t", "topology": "2x4", "slices": 2},
        {"name": "slice", "machineType": "ct6e-standard-4t", "topology": "4x4", "slices": 2},
    ],
}


def serving_values(pool: str, *models: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """TWO_POOLS serving `models` on `pool` ("host" or "slice"); `extra`: more park:serving."""
    values = copy.deepcopy(TWO_POOLS)
    values["park:serving"] = {"enabled": True, "pool": pool, "models": list(models), **extra}
    return values
