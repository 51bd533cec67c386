"""Capacity ladders (issue 38): each TPU pool an ordered list of rungs, one node pool per rung and
slice, and Kueue walking them in order; the rules a ladder is held to at preview.

The walk is checked by replaying Kueue's own admission on the rendered objects: its flavor
assigner (kubernetes-sigs/kueue pkg/scheduler/flavorassigner: flavors tried in ClusterQueue order
from the first, a flavor skipped when the pod set does not tolerate its nodeTaints or its
nodeSelector contradicts the flavor's nodeLabels, the first with free quota taken when
flavorFungibility is TryNextFlavor), its admission (the flavor's nodeLabels merged into the pods'
nodeSelector), waitForPodsReady (a job whose pods do not start is evicted and requeued, and its
next assignment starts again from the first flavor: KEP-2560 names this as the limit it
proposes to lift), and the scheduler's own rule (a pod lands on a node whose labels hold its
nodeSelector and whose taints it tolerates). What is replayed is the rendered node pools,
flavors, ClusterQueue and RayJob: a label, taint or quota that disagrees between them fails here.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

import pytest

from infra import catalog
from infra.names import POOL_LABEL
from infra.plan import kueue, node_pools
from infra.plan import ray as ray_plan
from infra.rules import problems as rule_problems
from infra.rules import warnings as rule_warnings
from infra.schema.read import parse_values
from infra.stack import from_values
from infra.tools.schemas import validate_manifests
from tests.conftest import SHIPPED_STACKS, render_stack
from tests.infra.stack_problems import problems_of, shipped_values

LADDER_STACK = "prod"


def spec_of(values: dict, stack: str):
    return parse_values(values, stack, None)


LADDER_POOL = "train-v6e-16"


def _values(stack: str = LADDER_STACK) -> dict:
    return shipped_values(stack)


def _pool(values: dict, name: str = LADDER_POOL) -> dict:
    return next(p for p in values["park:tpuPools"] if p["name"] == name)


def _capacity_kind(node_pool: dict) -> str:
    """What GKE gives a node pool, read from its own arguments (not from park's tags)."""
    config = node_pool["nodeConfig"]
    if node_pool.get("queuedProvisioning", {}).get("enabled"):
        return "queued"
    if config.get("flexStart"):
        return "flex-start"
    if config.get("spot"):
        return "spot"
    affinity = config.get("reservationAffinity", {}).get("consumeReservationType")
    return "reservation" if affinity == "SPECIFIC_RESERVATION" else "on-demand"


# ---------------------------------------------------------------------------------------------
# What must hold, on the shipped stacks' renders


def test_a_shipped_pool_has_two_capacity_kinds_and_a_queue_that_walks_them():
    rendered = render_stack(LADDER_STACK)
    pools = [
        r.inputs
        for r in rendered.of_type("gcp:container/nodePool:NodePool")
        if r.inputs["nodeConfig"]["labels"].get(POOL_LABEL) == LADDER_POOL
    ]
    kinds = [_capacity_kind(p) for p in pools]
    assert len(set(kinds)) >= 2, kinds
    objects = {(m["kind"], m["metadata"]["name"]): m for m in rendered.manifests()}
    queue = objects[("ClusterQueue", f"park-{LADDER_POOL}")]["spec"]
    assert queue["flavorFungibility"] == {
        "whenCanBorrow": "TryNextFlavor",
        "whenCanPreempt": "TryNextFlavor",
    }
    (tpu_group,) = [
        g for g in queue["resourceGroups"] if catalog.TPU_RESOURCE in g["coveredResources"]
    ]
    flavor_kinds = []
    for entry in tpu_group["flavors"]:
        flavor = objects[("ResourceFlavor", entry["name"])]["spec"]
        assert flavor["nodeLabels"][POOL_LABEL] == LADDER_POOL
        matching = [p for p in pools if _holds(p["nodeConfig"]["labels"], flavor["nodeLabels"])]
        assert matching, f"flavor {entry['name']} selects no node pool"
        flavor_kinds.append({_capacity_kind(p) for p in matching})
    # the flavors follow the ladder: the stack's rungs, in order, one kind each
    rungs = [r["capacity"] for r in _pool(_values())["ladder"]]
    assert flavor_kinds == [{k} for k in rungs]


def _holds(labels: dict[str, str], wanted: dict[str, str]) -> bool:
    """The node pool's own labels hold the flavor's (GKE adds its cloud.google.com ones)."""
    return all(labels.get(k) == v for k, v in wanted.items() if not k.startswith("cloud.google"))


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_unreserved_pools_say_no_reservation_and_dws_pins_its_pods(stack):
    rendered = render_stack(stack)
    for resource in rendered.of_type("gcp:container/nodePool:NodePool"):
        inputs = resource.inputs
        if (
            "tpu" not in inputs["nodeConfig"]["machineType"]
            and "ct" not in inputs["nodeConfig"]["machineType"][:2]
        ):
            continue
        if _capacity_kind(inputs) in ("spot", "on-demand"):
            affinity = inputs["nodeConfig"]["reservationAffinity"]
            assert affinity["consumeReservationType"] == "NO_RESERVATION", resource.name
    for manifest in rendered.manifests():
        if manifest["kind"] == "ProvisioningRequestConfig":
            assert manifest["spec"]["podSetUpdates"]["nodeSelector"], stack


def test_prod_reserves_a_sub_block():
    rungs = _pool(_values())["ladder"]
    (reservation,) = [r["reservation"] for r in rungs if r["capacity"] == "reservation"]
    assert "/reservationBlocks/" in reservation and "/reservationSubBlocks/" in reservation
    plan = from_values(_values(), LADDER_STACK)  # valid: the grammar takes a sub-block path
    assert plan.tpu_pools[0].rungs[0].reservation == reservation


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_no_tpu7x_on_spot_without_a_warning(stack):
    spec = spec_of(_values(stack), stack)
    warned = {w.key for w in rule_warnings(spec)}
    for i, pool in enumerate(spec.tpu_pools):
        generation = catalog.GENERATIONS[catalog.MACHINE_TYPES[pool.machine_type].generation]
        for j, rung in enumerate(pool.rungs()):
            if rung.capacity == "spot" and not generation.spot_documented:
                at = f"park:tpuPools[{i}]" + (f".ladder[{j}]" if pool.ladder else "")
                assert f"{at}.capacity" in warned


def test_ladder_objects_validate_against_kueues_crds():
    plan = from_values(_values(), LADDER_STACK)
    manifests = kueue.manifests(plan)
    assert {m["kind"] for m in manifests} >= {"ResourceFlavor", "ClusterQueue", "LocalQueue"}
    assert validate_manifests(manifests) == []
    config = kueue.manager_config(plan)
    assert config["waitForPodsReady"]["requeuingStrategy"]["timestamp"] == "Eviction"


# ---------------------------------------------------------------------------------------------
# Rules at preview


def test_a_ladder_replaces_the_pools_own_capacity():
    values = _values()
    _pool(values)["capacity"] = "spot"
    problems = problems_of(values, LADDER_STACK)
    assert "a ladder or one capacity" in problems["park:tpuPools[0].capacity"]


def test_a_rung_twice_is_refused():
    values = _values()
    _pool(values)["ladder"].append({"capacity": "queued"})
    assert (
        "the same capacity twice" in problems_of(values, LADDER_STACK)["park:tpuPools[0].ladder[2]"]
    )


def test_each_rung_keeps_its_own_preconditions():
    values = _values()
    _pool(values)["ladder"][1] = {"capacity": "queued", "reservation": "not-for-dws"}
    problems = problems_of(values, LADDER_STACK)
    assert "not 'queued'" in problems["park:tpuPools[0].ladder[1].reservation"]
    values = _values()
    _pool(values)["ladder"][1] = {"capacity": "spot", "maxRunDuration": "3600s"}
    assert (
        "flex-start"
        in problems_of(values, LADDER_STACK)["park:tpuPools[0].ladder[1].maxRunDuration"]
    )


def test_serving_takes_one_capacity_whose_nodes_stay():
    values = _values()
    _pool(values, "serve-v6e-16")["capacity"] = "flex-start"
    assert "go away on a clock" in problems_of(values, LADDER_STACK)["park:serving.pool"]
    values = _values()
    serve = _pool(values, "serve-v6e-16")
    del serve["capacity"]
    serve["ladder"] = [{"capacity": "on-demand"}, {"capacity": "spot"}]
    assert (
        "admits RayJobs, not a RayService" in problems_of(values, LADDER_STACK)["park:serving.pool"]
    )


def test_training_on_a_rung_that_goes_away_must_be_allowed_to_restart():
    values = _values()
    _pool(values)["ladder"].append({"capacity": "spot"})
    values["park:training"]["maxFailures"] = 0
    assert (
        "resumes from its last checkpoint"
        in problems_of(values, LADDER_STACK)["park:training.maxFailures"]
    )


def test_a_slice_larger_than_a_sub_block_is_refused(monkeypatch):
    values = _values("ironwood")
    pool = _pool(values, "train-7x")  # 2x2x2: two hosts
    pool["capacity"] = "reservation"
    pool["reservation"] = (
        "projects/p-123456/reservations/r/reservationBlocks/b/reservationSubBlocks/s"
    )
    generation = catalog.GENERATIONS["tpu7x"]
    assert from_values(copy.deepcopy(values), "ironwood")  # 2 hosts fit a 16-host sub-block
    monkeypatch.setitem(
        catalog.GENERATIONS, "tpu7x", dataclasses.replace(generation, sub_block_hosts=1)
    )
    problems = problems_of(values, "ironwood")
    assert "a sub-block holds 1 hosts" in problems["park:tpuPools[0].reservation"]


def test_a_stockout_rung_before_the_last_is_warned():
    values = _values()
    _pool(values)["ladder"].insert(1, {"capacity": "spot"})
    warned = {w.key: w.message for w in rule_warnings(spec_of(values, LADDER_STACK))}
    assert "not walked past" in warned["park:tpuPools[0].ladder[1].capacity"]
    assert "park:tpuPools[0].ladder[2].capacity" not in warned  # queued waits, last anyway


def test_a_single_capacity_pool_keeps_its_node_pool_names():
    plan = from_values(_values("dev"), "dev")
    names = [p.name for pool in plan.tpu_pools for p in node_pools.tpu_slice_pools(pool, "z")]
    assert names == [f"{pool.name}-s0" for pool in plan.tpu_pools]
    assert not rule_problems(spec_of(_values("dev"), "dev"))


# ---------------------------------------------------------------------------------------------
# Kueue's walk, replayed on the rendered objects


@dataclass
class _Job:
    name: str
    flavor: str | None = None
    started: bool = False
    node_pools: list[str] = field(default_factory=list)


@dataclass
class _Cluster:
    """A ClusterQueue's TPU flavors with their quota, the node pools, and the capacity GKE
    has right now per node pool (False: stocked out)."""

    flavors: list[dict]
    quota: dict[str, int]
    node_pools: list[node_pools.NodePoolPlan]
    worker: dict  # the RayJob's TPU worker pod spec, as rendered
    chips_per_job: int
    checks: dict[str, list[str]]  # admission checks by flavor
    capacity: dict[str, bool] = field(default_factory=dict)
    used: dict[str, int] = field(default_factory=dict)

    def assign(self, job: _Job) -> str | None:
        """Kueue's flavor assigner: first flavor, in order, that the pods tolerate, whose
        labels the pods' nodeSelector does not contradict, and whose quota has room."""
        tolerated = {(t["key"], t.get("effect")) for t in self.worker.get("tolerations", [])}
        selector = self.worker.get("nodeSelector", {})
        for flavor in self.flavors:
            spec = flavor["spec"]
            name = flavor["metadata"]["name"]
            if any((t["key"], t["effect"]) not in tolerated for t in spec.get("nodeTaints", [])):
                continue
            if any(selector.get(k, v) != v for k, v in spec["nodeLabels"].items()):
                continue
            if self.used.get(name, 0) + self.chips_per_job <= self.quota[name]:
                self.used[name] = self.used.get(name, 0) + self.chips_per_job
                job.flavor = name
                return name
        return None

    def start(self, job: _Job) -> bool:
        """Admission (the flavor's labels into the pods' nodeSelector), then the scheduler: the
        pods start where a node pool has capacity, holds the selector and its taints are
        tolerated."""
        flavor = next(f for f in self.flavors if f["metadata"]["name"] == job.flavor)
        selector = {**self.worker.get("nodeSelector", {}), **flavor["spec"]["nodeLabels"]}
        tolerated = {t["key"] for t in self.worker.get("tolerations", [])}
        job.node_pools = [
            p.name
            for p in self.node_pools
            if all(
                p.args["node_config"]["labels"].get(k, _slice_label(p, k)) == v
                for k, v in selector.items()
            )
            and all(t["key"] in tolerated for t in p.taints)
        ]
        job.started = any(self.capacity.get(p, True) for p in job.node_pools)
        return job.started

    def evict(self, job: _Job) -> None:
        """waitForPodsReady's timeout: quota released, the job back in the queue."""
        assert job.flavor is not None
        self.used[job.flavor] -= self.chips_per_job
        job.flavor, job.started, job.node_pools = None, False, []

    def finish(self, job: _Job) -> None:
        self.evict(job)


def _slice_label(pool: node_pools.NodePoolPlan, key: str) -> str | None:
    """GKE's own labels on a TPU node (accelerator, topology): not in node_config's labels."""
    return {"cloud.google.com/gke-tpu-accelerator": "tpu-v6e-slice"}.get(key) or (
        pool.args.get("placement_policy", {}).get("tpu_topology")
        if key == "cloud.google.com/gke-tpu-topology"
        else None
    )


def _cluster(values: dict) -> _Cluster:
    plan = from_values(values, LADDER_STACK)
    pool = next(p for p in plan.tpu_pools if p.name == LADDER_POOL)
    objects = kueue.manifests(plan)
    queue = next(m for m in objects if m["kind"] == "ClusterQueue")["spec"]
    (group,) = [g for g in queue["resourceGroups"] if catalog.TPU_RESOURCE in g["coveredResources"]]
    by_name = {m["metadata"]["name"]: m for m in objects if m["kind"] == "ResourceFlavor"}
    assert plan.training is not None
    job = ray_plan.rayjob(plan.training, ray_plan.ray_pods(plan))
    (worker,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    checks: dict[str, list[str]] = {}
    for check in queue.get("admissionChecksStrategy", {}).get("admissionChecks", []):
        for flavor in check["onFlavors"]:
            checks.setdefault(flavor, []).append(check["name"])
    return _Cluster(
        flavors=[by_name[f["name"]] for f in group["flavors"]],
        quota={f["name"]: int(f["resources"][0]["nominalQuota"]) for f in group["flavors"]},
        node_pools=node_pools.tpu_slice_pools(pool, plan.spec.zone),
        worker=worker["template"]["spec"],
        chips_per_job=plan.training.slices * pool.slice.chips,
        checks=checks,
    )


def test_kueue_takes_the_reservation_first_and_dws_when_it_is_taken():
    cluster = _cluster(_values())
    first, second = _Job("a"), _Job("b")
    assert cluster.assign(first) == f"park-{LADDER_POOL}-rsv"
    assert cluster.start(first) and first.node_pools == [f"{LADDER_POOL}-rsv-s0"]
    # the reservation's one slice is taken: the next job goes on to DWS, behind its check
    assert cluster.assign(second) == f"park-{LADDER_POOL}-dws"
    assert cluster.checks[str(second.flavor)] == [kueue.DWS_CHECK]
    assert cluster.checks.get(str(first.flavor)) is None
    assert cluster.start(second) and second.node_pools == [f"{LADDER_POOL}-dws-s0"]
    # a third waits in the queue: no rung has room
    assert cluster.assign(_Job("c")) is None
    cluster.finish(first)
    assert cluster.assign(_Job("d")) == f"park-{LADDER_POOL}-rsv"


def test_a_stockout_is_evicted_and_the_job_moves_back_to_a_freed_reservation():
    values = _values()
    _pool(values)["ladder"] = [
        _pool(values)["ladder"][0],
        {"capacity": "spot"},
        {"capacity": "on-demand"},
    ]
    cluster = _cluster(values)
    holder, job = _Job("holder"), _Job("job")
    cluster.assign(holder)
    assert cluster.start(holder)
    cluster.capacity[f"{LADDER_POOL}-spot-s0"] = False  # spot stocked out in the zone
    assert cluster.assign(job) == f"park-{LADDER_POOL}-spot"
    assert not cluster.start(job)  # pods pending: only the spot rung's nodes are selected
    assert job.node_pools == [f"{LADDER_POOL}-spot-s0"]
    cluster.evict(job)  # waitForPodsReady's timeout
    # Kueue 0.19.2 starts again from the first flavor: the stocked-out rung comes back while
    # the reservation is held (the limit the capacity warning names)...
    assert cluster.assign(job) == f"park-{LADDER_POOL}-spot"
    cluster.evict(job)
    # ...and the freed reservation is taken as soon as it frees
    cluster.finish(holder)
    assert cluster.assign(job) == f"park-{LADDER_POOL}-rsv"
    assert cluster.start(job)


def test_cost_prices_each_rung_and_the_ladders_band():
    from infra.tools.cost import estimate
    from infra.tools.prices import load_prices

    plan = from_values(_values(), LADDER_STACK)
    sheet = load_prices(plan)
    pool = next(p for p in plan.tpu_pools if p.name == LADDER_POOL)
    cost = next(p for p in estimate(plan, sheet).pools if p.name == LADDER_POOL)

    def full(capacity: str) -> float:
        price = sheet.chip_hour("v6e", capacity) or sheet.chip_hour("v6e", "flex-start")
        assert price is not None
        return pool.total_chips * price.value

    assert [c for c, _ in cost.rungs] == ["reservation", "queued"]
    reserved, queued = full("reservation"), full("queued")
    assert cost.idle_per_hour == pytest.approx(reserved)  # a reservation is billed idle
    assert cost.band == (pytest.approx(reserved), pytest.approx(reserved + queued))


def test_a_rungs_reservation_is_held_to_the_grammar():
    values = _values()
    _pool(values)["ladder"][0]["reservation"] = "projects/p/reservations/R_1"
    assert (
        "a reservation"
        in problems_of(values, LADDER_STACK)["park:tpuPools[0].ladder[0].reservation"]
    )
