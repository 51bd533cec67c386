"""Runs the cluster does not kill, and a second `up` that changes nothing (issue 36, items 6
and 8): Ray heads that neither the autoscaler nor a drain evicts, training clusters that GKE
does not upgrade under a run, TPU pools that never take a reservation's chips, and the cluster
arguments GKE reads back as something else.

Held against the references: the rendered manifests (KubeRay's labels on the pods it makes,
infra.tools.manifests.pods), the GKE API's discovery document, pulumi-gcp's own argument types,
and the provider's read-back (terraform-provider-google 7.x flattenMaintenancePolicy, modelled
below as tests/infra/test_tpu7x_pools.py models the placement policy's).
"""

from __future__ import annotations

import inspect
import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from infra.plan import cluster as cluster_plan
from infra.plan import node_pools
from infra.plan.ray.pods import RAY_KINDS, SAFE_TO_EVICT_ANNOTATION
from infra.stack import from_values, read_offline
from infra.tools.manifests.pods import derived_pods
from tests.conftest import SHIPPED_STACKS, render_stack

ROOT = Path(__file__).resolve().parents[2]
CONTAINER = ROOT / "infra" / "schemas" / "gke-container-v1" / "container.v1.json"
CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
PDB = "kubernetes:policy/v1:PodDisruptionBudget"


def _api() -> dict[str, Any]:
    schemas: dict[str, Any] = json.loads(CONTAINER.read_text())["schemas"]
    return schemas


def _matches(selector: dict[str, str], pod: dict[str, Any]) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


# ---- Ray heads: safe-to-evict false, and a PodDisruptionBudget each ----------------------------


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_ray_head_is_kept_from_eviction(stack):
    rendered = render_stack(stack)
    manifests = rendered.manifests()
    budgets = [m for m in manifests if m["kind"] == "PodDisruptionBudget"]
    ray = [m for m in manifests if m["kind"] in RAY_KINDS]
    assert ray, f"{stack} has a Ray object"
    for manifest in ray:
        pods = derived_pods(manifest)  # what KubeRay makes of it, with KubeRay's labels
        heads = [
            p for p in pods if (p["metadata"].get("labels") or {}).get("ray.io/node-type") == "head"
        ]
        others = [p for p in pods if p not in heads]
        (head,) = heads
        assert head["metadata"]["annotations"][SAFE_TO_EVICT_ANNOTATION] == "false"
        # TPU workers are left to the autoscaler: an idle slice must scale to 0
        assert all(
            SAFE_TO_EVICT_ANNOTATION not in p["metadata"].get("annotations", {}) for p in others
        )
        namespace = manifest["metadata"]["namespace"]
        mine = [
            b
            for b in budgets
            if b["metadata"]["namespace"] == namespace
            and _matches(b["spec"]["selector"]["matchLabels"], head)
        ]
        assert len(mine) == 1, (stack, manifest["metadata"]["name"], mine)
        (budget,) = mine
        assert budget["spec"]["maxUnavailable"] == 0
        assert not any(_matches(budget["spec"]["selector"]["matchLabels"], p) for p in others)
        # nor the head of another workload of the stack
        for other in ray:
            if other is not manifest:
                assert not any(
                    _matches(budget["spec"]["selector"]["matchLabels"], p)
                    for p in derived_pods(other)
                )


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_each_budget_is_created_by_the_component_of_its_workload(stack):
    rendered = render_stack(stack)
    ray = {r.parent: r for r in rendered.resources if r.type.startswith("kubernetes:ray.io/")}
    budgets = rendered.of_type(PDB)
    assert len(budgets) == len(ray)
    for budget in budgets:
        assert budget.parent in ray, budget.name
        assert budget.name == f"{ray[budget.parent].name}-head"


# ---- training clusters: a maintenance exclusion that converges ----------------------------------


def _flatten_maintenance_policy(api: dict[str, Any] | None) -> dict[str, Any] | None:
    """terraform-provider-google 7.x flattenMaintenancePolicy (pulumi-gcp 10.2.0), in its
    snake_case state: nothing without a window; an exclusion with an end-time behaviour reads
    back no end_time (GKE computes one and moves it with each minor upgrade)."""
    window = (api or {}).get("window")
    if not window:
        return None
    exclusions = []
    for name, item in (window.get("maintenanceExclusions") or {}).items():
        exclusion: dict[str, Any] = {"exclusion_name": name, "start_time": item["startTime"]}
        options = item.get("maintenanceExclusionOptions")
        if options and options.get("endTimeBehavior"):
            exclusion["exclusion_options"] = {
                "scope": options.get("scope") or "NO_UPGRADES",
                "end_time_behavior": options["endTimeBehavior"],
            }
        else:
            if options:
                exclusion["exclusion_options"] = {"scope": options.get("scope") or "NO_UPGRADES"}
            if item.get("endTime"):
                exclusion["end_time"] = item["endTime"]
        exclusions.append(exclusion)
    state: dict[str, Any] = {"maintenance_exclusions": exclusions}
    recurring = window.get("recurringWindow")
    if recurring:
        state["recurring_window"] = {
            "start_time": recurring["window"]["startTime"],
            "end_time": recurring["window"]["endTime"],
            "recurrence": recurring["recurrence"],
        }
    if "daily_maintenance_window" not in state and "recurring_window" not in state:
        return None
    return state


def _gke_returns(sent: dict[str, Any]) -> dict[str, Any]:
    """The MaintenancePolicy GKE answers for what was sent: the exclusion with the end of
    support it computed as its endTime, a resourceVersion."""
    recurring = sent["recurring_window"]
    exclusions = {
        e["exclusion_name"]: {
            "startTime": e["start_time"],
            "endTime": "2027-08-15T00:00:00Z",
            "maintenanceExclusionOptions": {
                "scope": e["exclusion_options"]["scope"],
                "endTimeBehavior": e["exclusion_options"]["end_time_behavior"],
            },
        }
        for e in sent["maintenance_exclusions"]
    }
    return {
        "resourceVersion": "6d7f2a1c",
        "window": {
            "recurringWindow": {
                "window": {"startTime": recurring["start_time"], "endTime": recurring["end_time"]},
                "recurrence": recurring["recurrence"],
            },
            "maintenanceExclusions": exclusions,
        },
    }


def test_the_maintenance_policy_reads_back_as_sent():
    sent = cluster_plan.MAINTENANCE_POLICY
    assert _flatten_maintenance_policy(_gke_returns(sent)) == sent
    # what it avoids: an exclusion alone reads back as no policy (a diff at every `up`), and an
    # end time computed at each run (now() + n days) never equals the one stored
    alone = {k: v for k, v in sent.items() if k != "recurring_window"}
    assert _flatten_maintenance_policy(_gke_returns({**sent, **alone})) != alone


def test_the_maintenance_policy_is_fixed_and_what_the_api_and_provider_take():
    policy = cluster_plan.MAINTENANCE_POLICY
    times = [policy["recurring_window"]["start_time"], policy["recurring_window"]["end_time"]]
    times += [e["start_time"] for e in policy["maintenance_exclusions"]]
    for value in times:  # UTC "Z" form: what GKE returns, so no diff
        assert value.endswith("Z") and datetime.fromisoformat(value)
    start, end = (datetime.fromisoformat(t) for t in times[:2])
    # GKE asks for 48 h of maintenance availability in any 32 days: a weekly 48 h window
    assert end - start >= timedelta(hours=48) and start.strftime("%a") == "Sat"
    (exclusion,) = policy["maintenance_exclusions"]
    options = _api()["MaintenanceExclusionOptions"]["properties"]
    assert exclusion["exclusion_options"]["scope"] in options["scope"]["enum"]
    assert "UNTIL_END_OF_SUPPORT" in options["endTimeBehavior"]["enum"]
    assert "end_time" not in exclusion  # exactly one of end_time and end_time_behavior
    from pulumi_gcp.container import (
        ClusterMaintenancePolicyArgs,
        ClusterMaintenancePolicyMaintenanceExclusionArgs,
        ClusterMaintenancePolicyMaintenanceExclusionExclusionOptionsArgs,
        ClusterMaintenancePolicyRecurringWindowArgs,
    )

    for args, given in (
        (ClusterMaintenancePolicyArgs, policy),
        (ClusterMaintenancePolicyRecurringWindowArgs, policy["recurring_window"]),
        (ClusterMaintenancePolicyMaintenanceExclusionArgs, exclusion),
        (
            ClusterMaintenancePolicyMaintenanceExclusionExclusionOptionsArgs,
            exclusion["exclusion_options"],
        ),
    ):
        assert set(given) <= set(inspect.signature(args.__init__).parameters), args


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_training_clusters_are_not_upgraded_under_a_run(stack):
    rendered = render_stack(stack)
    (cluster,) = rendered.of_type(CLUSTER)
    runs = rendered.plan.training is not None or rendered.plan.rl is not None
    assert runs, f"{stack}: every shipped stack trains; one that runs none sets no policy"
    policy = cluster.inputs["maintenancePolicy"]
    (exclusion,) = policy["maintenanceExclusions"]
    assert exclusion["exclusionOptions"] == {
        "scope": "NO_MINOR_OR_NODE_UPGRADES",
        "endTimeBehavior": "UNTIL_END_OF_SUPPORT",
    }
    assert policy["recurringWindow"]["recurrence"] == "FREQ=WEEKLY;BYDAY=SA"


def test_a_stack_without_runs_keeps_the_channels_upgrades():
    offline = read_offline(ROOT / "stacks" / "Pulumi.dev.yaml")
    values = dict(offline.values)
    values["park:training"] = {"enabled": False}
    values["park:serving"] = {"enabled": False}
    plan = from_values(values, offline.stack)
    assert "maintenance_policy" not in cluster_plan.cluster(plan).args


# ---- the cluster's nodeConfig: what GKE reads back is the first pool's ------------------------


def test_gke_reports_the_first_pools_config_as_the_clusters():
    field = _api()["Cluster"]["properties"]["nodeConfig"]
    assert "first node pool" in field["description"]


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_the_clusters_node_config_is_not_diffed_after_create(stack):
    rendered = render_stack(stack)
    (cluster,) = rendered.of_type(CLUSTER)
    assert "nodeConfig" in cluster.ignore_changes
    # why it must be: the first pool (the CPU pool) has fields the cluster never declares
    declared = cluster.inputs["nodeConfig"]
    pools = {r.name: r.inputs["nodeConfig"] for r in rendered.of_type(NODE_POOL)}
    read_back = pools["cpu"]
    assert set(read_back) - set(declared), "the CPU pool's config would equal the cluster's"
    # and what it is declared for: the default pool runs as the nodes' own account
    assert declared["serviceAccount"] == read_back["serviceAccount"]


# ---- TPU pools never take a reservation's chips unless named ----------------------------------


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_tpu_pool_states_its_reservation_affinity(stack):
    offline = read_offline(ROOT / "stacks" / f"Pulumi.{stack}.yaml")
    plan = from_values(dict(offline.values), offline.stack)
    capacity = {
        (p.name, r.tag if p.laddered else None): r.capacity for p in plan.tpu_pools for r in p.rungs
    }
    enum = _api()["ReservationAffinity"]["properties"]["consumeReservationType"]["enum"]
    for pool in node_pools.all_node_pools(plan):
        if pool.kind != "tpu":
            continue
        affinity = pool.args["node_config"]["reservation_affinity"]
        assert affinity["consume_reservation_type"] in enum
        expected = (
            "SPECIFIC_RESERVATION"
            if capacity[(pool.pool, pool.rung)] == "reservation"
            else "NO_RESERVATION"
        )
        assert affinity["consume_reservation_type"] == expected, (stack, pool.name)


def test_spot_and_on_demand_state_no_reservation():
    offline = read_offline(ROOT / "stacks" / "Pulumi.dev.yaml")
    seen = set()
    for capacity in node_pools.UNRESERVED_CAPACITY:
        values = dict(offline.values)
        values["park:tpuPools"] = [{**p, "capacity": capacity} for p in values["park:tpuPools"]]
        plan = from_values(values, offline.stack)
        for pool in node_pools.all_node_pools(plan):
            if pool.kind == "tpu":
                affinity = pool.args["node_config"]["reservation_affinity"]
                assert affinity == {"consume_reservation_type": "NO_RESERVATION"}
                seen.add(capacity)
    assert seen == {"spot", "on-demand"}


# ---- destroy converges: queued's bucket goes with its contents -----------------------------------


def test_queued_bucket_can_be_destroyed():
    (bucket,) = render_stack("queued").of_type("gcp:storage/bucket:Bucket")
    assert bucket.inputs["forceDestroy"] is True
