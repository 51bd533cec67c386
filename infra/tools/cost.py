"""What a stack costs per hour, while idle, and per training run, from list prices.

Pure arithmetic on the resolved StackPlan (infra.resolve): no render, no cloud. Prices come from
`infra/data/prices.yaml` (Google's list prices, each with its source and date) unless the stack
overrides them with `park:prices`; every figure records which of the two it came from, so the
output can say so.

The model, in words (the same words `park cost` prints):
- a TPU pool at full size runs every host of every slice; it is billed per chip-hour at its
  capacity type's price (the host VM is included in TPU prices);
- idle means no job and no serving replica: autoscaled TPU pools are at 0 nodes and cost
  nothing; a reservation is billed for its whole term anyway; a pool without autoscaling keeps
  its nodes; the CPU pool keeps its minimum nodes; the cluster fee runs always;
- the serving floor is idle plus the slices the RayService keeps up for its minimum replicas;
- a training run is `steps x park:training.estimatedStepSeconds` on the training slices;
- an RL run is `steps x park:rl.estimatedStepSeconds` on the learner's slice and, for as long,
  every slice (or GPU node) of the rollout pool: both sides are held for the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.resolve import PoolPlan, StackPlan
from infra.tools.prices import OVERRIDE, Price, PriceSheet, load_prices

SHOWN_CAPACITY_TYPES = ("on-demand", "spot", "reservation", "flex-start")
HOURS_PER_MONTH = 730  # Google's billing month


@dataclass(frozen=True)
class PoolCost:
    """One node pool: its size, and what it costs full, idle, and by capacity type."""

    name: str
    kind: str  # "tpu", "cpu" or "gpu"
    machine_type: str
    topology: str
    slices: int
    hosts: int  # at full size
    chips: int  # at full size
    capacity: str
    by_capacity: dict[str, float | None]  # full size, $/h, for each shown capacity type
    full_per_hour: float | None  # at the configured capacity type
    idle_per_hour: float | None
    idle_why: str
    price: Price | None  # per chip-hour (TPU) or node-hour (CPU / GPU)
    generation: str = ""  # TPU generation, e.g. "v6e"
    # A capacity ladder: (rung capacity, $/h at full size on that rung), in ladder order, and
    # the band a running pool costs: best (every slice on the first rung) and worst (on the
    # last), each with the reservations billed meanwhile. Empty / None without a ladder.
    rungs: tuple[tuple[str, float | None], ...] = ()
    band: tuple[float | None, float | None] | None = None

    @property
    def chip_hours_per_hour(self) -> int:
        return self.chips


@dataclass(frozen=True)
class RunCost:
    steps: int
    step_seconds: float
    hours: float
    chips: int
    chip_hours: float
    capacity: str
    cost: float | None
    note: str


@dataclass(frozen=True)
class StackCost:
    stack: str
    region: str
    pools: list[PoolCost]
    cluster_per_hour: float
    full_per_hour: float | None  # everything up at its configured capacity
    idle_per_hour: float | None
    serving_floor_per_hour: float | None
    serving_floor_why: str
    training_run: RunCost | None
    prices: PriceSheet
    missing: list[str]  # figures with no price: set them in park:prices
    rl_run: tuple[RunCost, RunCost] | None = None  # park:rl: (learner, rollout)

    def as_json(self) -> dict[str, Any]:
        """Plain data, for `park cost --json` and tests (money rounded to 1e-6 USD)."""
        return _rounded(
            {
                "stack": self.stack,
                "region": self.region,
                "currency": "USD",
                "pools": [
                    {
                        "name": p.name,
                        "kind": p.kind,
                        "machine_type": p.machine_type,
                        "topology": p.topology,
                        "slices": p.slices,
                        "hosts": p.hosts,
                        "chips": p.chips,
                        "chip_hours_per_hour": p.chip_hours_per_hour,
                        "capacity": p.capacity,
                        "per_hour_by_capacity": p.by_capacity,
                        "per_hour": p.full_per_hour,
                        "idle_per_hour": p.idle_per_hour,
                        "idle_why": p.idle_why,
                        "price_source": p.price.source if p.price else None,
                        "ladder": [{"capacity": c, "per_hour": v} for c, v in p.rungs],
                        "band_per_hour": None
                        if p.band is None
                        else {"best": p.band[0], "worst": p.band[1]},
                    }
                    for p in self.pools
                ],
                "cluster_per_hour": self.cluster_per_hour,
                "full_per_hour": self.full_per_hour,
                "idle_per_hour": self.idle_per_hour,
                "idle_per_month": _mul(self.idle_per_hour, HOURS_PER_MONTH),
                "serving_floor_per_hour": self.serving_floor_per_hour,
                "training_run": None
                if self.training_run is None
                else {
                    "steps": self.training_run.steps,
                    "step_seconds": self.training_run.step_seconds,
                    "hours": self.training_run.hours,
                    "chips": self.training_run.chips,
                    "chip_hours": self.training_run.chip_hours,
                    "capacity": self.training_run.capacity,
                    "cost": self.training_run.cost,
                },
                "rl_run": None
                if self.rl_run is None
                else {
                    side: {
                        "pool": run.note,
                        "hours": run.hours,
                        "chips": run.chips,
                        "capacity": run.capacity,
                        "cost": run.cost,
                    }
                    for side, run in zip(("learner", "rollout"), self.rl_run, strict=True)
                }
                | {"steps": self.rl_run[0].steps, "cost": _sum([r.cost for r in self.rl_run])},
                "prices": {
                    "override": self.prices.override_source,
                    "sources_used": sorted(used_sources(self)),
                },
                "missing": self.missing,
            }
        )


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _mul(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _sum(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _price_key(capacity: str) -> str:
    return "flex-start" if capacity == "queued" else capacity


def _tpu_pool_cost(plan: PoolPlan, sheet: PriceSheet) -> PoolCost:
    pool = plan.spec
    chips, hosts = plan.total_chips, plan.total_hosts
    generation = plan.slice.generation.name

    def per_hour(capacity: str) -> float | None:
        price = sheet.chip_hour(generation, capacity) or sheet.chip_hour(
            generation, _price_key(capacity)
        )
        return None if price is None else chips * price.value

    price = sheet.chip_hour(generation, plan.capacity) or sheet.chip_hour(
        generation, _price_key(plan.capacity)
    )
    full = per_hour(plan.capacity)
    rungs = tuple((r.capacity, per_hour(r.capacity)) for r in plan.rungs)
    reserved = _sum([cost for capacity, cost in rungs if capacity == "reservation"])
    if plan.laddered:
        idle, why = reserved, "its reservation rungs are billed whether nodes run or not"
    elif plan.capacity == "reservation":
        idle, why = full, "a reservation is billed whether nodes run or not"
    elif not pool.autoscaling:
        idle, why = full, "no autoscaling: its nodes stay up"
    else:
        idle, why = 0.0, "autoscaled to 0 nodes"
    band = None
    if plan.laddered:
        (first, best), (last, worst) = rungs[0], rungs[-1]
        band = (
            reserved if first == "reservation" else _sum([reserved, best]),
            reserved if last == "reservation" else _sum([reserved, worst]),
        )
    return PoolCost(
        name=pool.name,
        kind="tpu",
        machine_type=pool.machine_type,
        topology=pool.topology,
        slices=pool.slices,
        hosts=hosts,
        chips=chips,
        capacity=plan.capacity,
        by_capacity={c: per_hour(c) for c in SHOWN_CAPACITY_TYPES},
        full_per_hour=full,
        idle_per_hour=idle,
        idle_why=why,
        price=price,
        generation=generation,
        rungs=rungs if plan.laddered else (),
        band=band,
    )


def _node_pool_cost(
    name: str,
    kind: str,
    machine_type: str,
    capacity: str,
    max_nodes: int,
    min_nodes: int,
    sheet: PriceSheet,
    chips: int = 0,
) -> PoolCost:
    price = sheet.machines.get(machine_type)
    value = None if price is None else price.value
    # Only on-demand node prices are shipped; other capacity types need park:prices.
    full = None if value is None or capacity != "on-demand" else max_nodes * value
    idle = None if value is None or capacity != "on-demand" else min_nodes * value
    return PoolCost(
        name=name,
        kind=kind,
        machine_type=machine_type,
        topology="",
        slices=0,
        hosts=max_nodes,
        chips=chips,
        capacity=capacity,
        by_capacity={
            c: (max_nodes * value if value and c == "on-demand" else None)
            for c in SHOWN_CAPACITY_TYPES
        },
        full_per_hour=full,
        idle_per_hour=0.0 if min_nodes == 0 else idle,
        idle_why=f"keeps its minimum of {min_nodes} node(s)" if min_nodes else "scales to 0 nodes",
        price=price,
    )


def _serving_floor(plan: StackPlan, pools: dict[str, PoolCost]) -> tuple[float | None, str]:
    """Idle plus the slices the RayService keeps up: those of its models' minReplicas."""
    serving = plan.serving
    if serving is None or not serving.models:
        return 0.0, "no serving"
    pool = serving.pool
    slices = serving.min_slices
    cost = pools[pool.name]
    if slices == 0:
        return 0.0, "minReplicas 0: serving scales to 0"
    if cost.idle_per_hour == cost.full_per_hour:
        return 0.0, f"{slices} slice(s) of {pool.name}, already billed while idle"
    per_slice = _mul(cost.full_per_hour, 1 / pool.slices)
    return _mul(per_slice, slices), f"{slices} slice(s) of {pool.name} for minReplicas"


def _training_run(plan: StackPlan, pools: dict[str, PoolCost]) -> RunCost | None:
    training = plan.training
    if training is None:
        return None
    spec, pool = training.spec, training.pool
    chips = training.pool.slice.chips * training.slices  # priced per chip, not per worker
    hours = spec.steps * spec.estimated_step_seconds / 3600
    price = pools[pool.name].price
    cost = None if price is None else chips * hours * price.value
    note = (
        "already paid by the reservation; shown at its rate"
        if pool.capacity == "reservation"
        else "spot runs may be preempted and resume from a checkpoint: budget for reruns"
        if pool.capacity == "spot"
        else ""
    )
    return RunCost(
        steps=spec.steps,
        step_seconds=spec.estimated_step_seconds,
        hours=hours,
        chips=chips,
        chip_hours=chips * hours,
        capacity=pool.capacity,
        cost=cost,
        note=note,
    )


def _rl_run(plan: StackPlan, pools: dict[str, PoolCost]) -> tuple[RunCost, RunCost] | None:
    """(learner, rollout) of one RL run; each RunCost's note names its pool."""
    rl = plan.rl
    if rl is None:
        return None
    hours = rl.spec.steps * rl.spec.estimated_step_seconds / 3600
    rollout = pools[rl.rollout.pool_name]
    learner = pools[rl.learner.name]
    chip_price = learner.price.value if learner.price else None
    sides = []
    for pool, chips, per_hour in (
        (learner, rl.workers, _mul(chip_price, rl.workers)),
        (rollout, rollout.chips, rollout.full_per_hour),  # every slice / node of the pool
    ):
        sides.append(
            RunCost(
                steps=rl.spec.steps,
                step_seconds=rl.spec.estimated_step_seconds,
                hours=hours,
                chips=chips,
                chip_hours=chips * hours,
                capacity=pool.capacity,
                cost=_mul(per_hour, hours),
                note=pool.name,
            )
        )
    return sides[0], sides[1]


def estimate(plan: StackPlan, sheet: PriceSheet | None = None) -> StackCost:
    """The cost of a stack: per pool, in total, idle, at the serving floor, per training run."""
    sheet = sheet or load_prices(plan)
    cpu = plan.spec.cpu_pool
    pools = [
        _node_pool_cost(
            "cpu", "cpu", cpu.machine_type, "on-demand", cpu.max_nodes, cpu.min_nodes, sheet
        )
    ]
    pools += [_tpu_pool_cost(pool, sheet) for pool in plan.tpu_pools]
    for gpu in plan.gpu_pools:
        g = gpu.spec
        pools.append(
            _node_pool_cost(
                g.name,
                "gpu",
                g.machine_type,
                g.capacity,
                g.nodes,
                0 if g.autoscaling else g.nodes,
                sheet,
                chips=gpu.total_gpus,
            )
        )
    by_name = {p.name: p for p in pools}
    cluster = sheet.cluster.value
    full = _sum([cluster, *(p.full_per_hour for p in pools)])
    idle = _sum([cluster, *(p.idle_per_hour for p in pools)])
    floor_extra, floor_why = _serving_floor(plan, by_name)
    missing = [
        f"{p.name}: no {p.capacity} price for {p.machine_type} in {sheet.region}; "
        f"set {OVERRIDE}.{'tpuChipHour' if p.kind == 'tpu' else 'machineHour'}"
        for p in pools
        if p.full_per_hour is None
    ]
    return StackCost(
        stack=plan.stack,
        region=sheet.region,
        pools=pools,
        cluster_per_hour=cluster,
        full_per_hour=full,
        idle_per_hour=idle,
        serving_floor_per_hour=_sum([idle, floor_extra]),
        serving_floor_why=floor_why,
        training_run=_training_run(plan, by_name),
        prices=sheet,
        missing=missing,
        rl_run=_rl_run(plan, by_name),
    )


def used_sources(cost: StackCost) -> set[str]:
    """The price sources the estimate relied on (prices.yaml keys and/or park:prices)."""
    used = {cost.prices.cluster.source}
    used |= {p.price.source for p in cost.pools if p.price is not None}
    for pool in cost.pools:
        for cap in SHOWN_CAPACITY_TYPES if pool.kind == "tpu" else ():
            price = cost.prices.chip_hour(pool.generation, cap)
            if price is not None:
                used |= {price.source, *price.derived_from}
    return used
