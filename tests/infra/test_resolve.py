"""The resolve step owns every derived number; the consumers agree because they read it.

The serving rule: a replica of a served model holds one whole slice (Ray 2.60 Serve LLM's
SlicePlacementGroup takes every chip of the topology, whatever the TP), so the slices a
RayService needs are the sum of its models' replicas. Before the resolve step, config
validation allowed chips // TP replicas per slice for each model, while the RayService and
`park cost` took the largest minReplicas over the models: these stacks are where they disagreed.
"""

from __future__ import annotations

import copy

import pytest

from infra import catalog
from infra.resolve import resolve_pool
from infra.schema.errors import ConfigError
from infra.schema.models import TpuPoolConfig
from infra.stack import from_values
from infra.tools.cost import estimate
from infra.tools.render import run_program
from tests.policy.helpers import run as run_policies

SERVE_POOL = {
    "name": "serve",
    "machineType": "ct6e-standard-8t",
    "topology": "2x4",
    "slices": 3,
    "capacity": "on-demand",
}
BASE = {
    "gcp:project": "p",
    "gcp:region": "us-east5",
    "park:zone": "us-east5-b",
    "park:tpuPools": [SERVE_POOL],
    "park:serving": {
        "enabled": True,
        "pool": "serve",
        "models": [
            # TP below the slice's 8 chips, and minReplicas > 1: each replica still holds a slice
            {"name": "a", "source": "o/a", "tensorParallelSize": 4, "maxReplicas": 1},
            {"name": "b", "source": "o/b", "minReplicas": 2, "maxReplicas": 2},
        ],
    },
}


def _values(**serving) -> dict:
    values = copy.deepcopy(BASE)
    values["park:serving"].update(serving)
    return values


def _worker_group(rendered) -> dict:
    (service,) = [m for m in rendered.manifests() if m["kind"] == "RayService"]
    (group,) = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return group


@pytest.mark.parametrize(
    ("machine_type", "topology", "slices"),
    [(s.machine_type, s.topology, n) for s in catalog.all_slices() for n in (1, 3)],
)
def test_pool_totals_are_the_catalogs_slice_times_slices(machine_type, topology, slices):
    pool = resolve_pool(
        TpuPoolConfig(name="x", machine_type=machine_type, topology=topology, slices=slices)
    )
    tpu = catalog.lookup(machine_type, topology)
    assert (pool.total_chips, pool.total_hosts) == (tpu.chips * slices, tpu.hosts * slices)


def test_several_models_on_one_pool_agree_everywhere():
    plan = from_values(BASE, "dev")
    serving = plan.serving
    assert serving is not None
    assert [m.tensor_parallel for m in serving.models] == [4, 8]  # default: every chip
    assert [m.idle_devices_per_replica for m in serving.models] == [4, 0]
    assert (serving.min_slices, serving.max_slices, serving.slice_budget) == (3, 3, 3)

    rendered = run_program(BASE, "dev", [])
    group = _worker_group(rendered)
    # the RayService's worker group: one replica per slice, as many as the models hold
    assert (group["replicas"], group["maxReplicas"]) == (3, 3)
    # the node pools hold them: one node pool per slice
    node_pools = [
        r for r in rendered.of_type("gcp:container/nodePool:NodePool") if r.parent == "serve"
    ]
    assert len(node_pools) == group["maxReplicas"]
    # the policy pack's view of the same graph (worker groups vs the pools' slices)
    assert [v for v in run_policies([r.as_json() for r in rendered.resources], "dev")] == []
    # park cost keeps the slices of minReplicas up: all three, at on-demand per chip-hour
    cost = estimate(plan)
    per_slice = next(p for p in cost.pools if p.name == "serve").full_per_hour / 3
    assert cost.serving_floor_per_hour == pytest.approx(cost.idle_per_hour + 3 * per_slice)


def test_models_that_need_more_slices_than_the_pool_are_refused():
    """Two TP-4 models on one 8-chip slice: the old config rule allowed it (8 // 4 = 2
    replicas per slice), but each replica reserves the whole slice, so the second never starts."""
    values = _values(models=[{"name": "a", "source": "o/a", "tensorParallelSize": 4}] * 1)
    values["park:serving"]["models"].append({"name": "b", "source": "o/b", "tensorParallelSize": 4})
    values["park:tpuPools"] = [{**SERVE_POOL, "slices": 1}]
    with pytest.raises(ConfigError) as info:
        from_values(values, "dev")
    (problem,) = info.value.problems
    assert problem.key == "park:serving.models[1].maxReplicas"
    assert "2 slice(s)" in problem.message and "whole 2x4 slice" in problem.message


def test_blue_green_upgrades_keep_room_for_a_second_cluster():
    values = _values(upgradeStrategy="NewCluster")
    with pytest.raises(ConfigError) as info:
        from_values(values, "dev")
    assert "NewCluster" in str(info.value)
    values["park:tpuPools"] = [{**SERVE_POOL, "slices": 6}]
    plan = from_values(values, "dev")
    assert plan.serving is not None and plan.serving.slice_budget == 3


def test_training_workers_and_hosts_are_one_per_chip_and_per_host():
    values = {
        **{k: v for k, v in BASE.items() if k != "park:serving"},
        "park:tpuPools": [
            {"name": "t", "machineType": "ct6e-standard-4t", "topology": "4x4", "slices": 2}
        ],
        "park:training": {"enabled": True, "pool": "t", "numSlices": 2, "globalBatchSize": 64},
    }
    plan = from_values(values, "dev")
    assert plan.training is not None
    assert (plan.training.workers, plan.training.hosts) == (32, 8)
    rendered = run_program(values, "dev", [])
    (job,) = [m for m in rendered.manifests() if m["kind"] == "RayJob"]
    assert "--num-workers 32" in job["spec"]["entrypoint"]
    (group,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["replicas"] * group["numOfHosts"] == plan.training.hosts
    assert estimate(plan).training_run.chips == 32
