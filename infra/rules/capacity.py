"""Capacity rules: how a TPU pool's nodes are obtained (one capacity or a ladder of rungs) and
what may run on them (GKE's preconditions, Kueue's walk, nodes that expire or are preempted).

A pool's rules take the pool and its config-key prefix, so a component given the same
arguments outside a stack checks them the same way; workload rules take the resolved plan.
"""

from __future__ import annotations

import re

from pydantic.alias_generators import to_camel

from infra import catalog
from infra.resolve.types import RUNG_TAGS, PoolPlan, ServingPlan, TrainingPlan
from infra.schema.errors import ConfigProblem
from infra.schema.models import CapacityRung, StackConfig, TpuPoolConfig


def capacity_problems(
    prefix: str, capacity: str, reservation: str | None, autoscaling: bool
) -> list[ConfigProblem]:
    """Capacity rules shared by TPU and GPU pools (GKE's own preconditions)."""
    out = []
    if capacity == "reservation" and not reservation:
        out.append(
            ConfigProblem(
                f"{prefix}.reservation",
                reservation,
                "capacity 'reservation' needs a reservation name",
            )
        )
    if capacity != "reservation" and reservation:
        out.append(
            ConfigProblem(
                f"{prefix}.reservation",
                reservation,
                f"a reservation name is only used with capacity 'reservation', not {capacity!r}",
            )
        )
    if capacity in ("flex-start", "queued") and not autoscaling:
        out.append(
            ConfigProblem(
                f"{prefix}.autoscaling",
                autoscaling,
                f"capacity {capacity!r} needs autoscaling (the pool starts at 0 nodes)",
            )
        )
    return out


MAX_RUN_DURATION_S = 7 * 86_400  # GKE flex-start: "for up to seven days" (the default too)


def _run_duration_ok(value: str) -> bool:
    match = re.fullmatch(r"([0-9]{1,7})s", value)
    return match is not None and 1 <= int(match.group(1)) <= MAX_RUN_DURATION_S


def tpu_capacity_problems(prefix: str, pool: TpuPoolConfig) -> list[ConfigProblem]:
    """A TPU pool's capacity: its ladder as a whole, then each rung (or its one capacity)."""
    problems = _ladder_problems(prefix, pool)
    for at, rung in rung_keys(prefix, pool):
        problems += capacity_problems(at, rung.capacity, rung.reservation, pool.autoscaling)
        problems += _rung_problems(at, rung, pool)
    return problems


def rung_keys(prefix: str, pool: TpuPoolConfig) -> list[tuple[str, CapacityRung]]:
    """Each rung with the key its fields are read under (the pool's own without a ladder)."""
    if not pool.ladder:
        return [(prefix, pool.rungs()[0])]
    return [(f"{prefix}.ladder[{i}]", rung) for i, rung in enumerate(pool.ladder)]


def _ladder_problems(prefix: str, pool: TpuPoolConfig) -> list[ConfigProblem]:
    """A ladder replaces the pool's own capacity; each rung is a different capacity, DWS's at
    most once, and its node pools' names (`<pool>-<rung>-s<i>`) fit GKE's 40 characters."""
    if not pool.ladder:
        return []
    problems = [
        ConfigProblem(
            f"{prefix}.{to_camel(field)}",
            getattr(pool, field),
            "set on each rung of park:tpuPools[].ladder instead: a pool has a ladder or one "
            "capacity, not both",
        )
        for field in ("capacity", "reservation", "max_run_duration")
        if field in pool.model_fields_set
    ]
    seen: set[tuple[str, str | None]] = set()
    for i, rung in enumerate(pool.ladder):
        if (rung.capacity, rung.reservation) in seen:
            problems.append(
                ConfigProblem(
                    f"{prefix}.ladder[{i}]",
                    rung.capacity,
                    "the same capacity twice: Kueue would try it again only after the rungs "
                    "between; allowed: each capacity once (a reservation once per reservation)",
                )
            )
        seen.add((rung.capacity, rung.reservation))
    longest = f"{pool.name}-{_longest_tag(pool)}-s{max(pool.slices - 1, 0)}"
    if len(pool.ladder) > 1 and len(longest) > 40:
        problems.append(
            ConfigProblem(
                f"{prefix}.name",
                pool.name,
                f"with a ladder its node pools are <name>-<rung>-s<i> ({longest!r}, "
                f"{len(longest)} characters): GKE allows 40; shorten the name to "
                f"{len(pool.name) - (len(longest) - 40)} characters",
            )
        )
    return problems


def _longest_tag(pool: TpuPoolConfig) -> str:
    tags = [RUNG_TAGS[r.capacity] for r in pool.rungs()]
    return max(tags, key=len) + ("2" if len(tags) != len(set(tags)) else "")


def _rung_problems(at: str, rung: CapacityRung, pool: TpuPoolConfig) -> list[ConfigProblem]:
    """One rung's own fields: the run duration (flex-start only) and a sub-block's size."""
    problems = []
    if rung.max_run_duration and rung.capacity != "flex-start":
        problems.append(
            ConfigProblem(
                f"{at}.maxRunDuration",
                rung.max_run_duration,
                "only used with capacity 'flex-start'",
            )
        )
    elif rung.max_run_duration and not _run_duration_ok(rung.max_run_duration):
        problems.append(
            ConfigProblem(
                f"{at}.maxRunDuration",
                rung.max_run_duration,
                f"seconds with an 's' (e.g. 86400s), from 1s to {MAX_RUN_DURATION_S}s: "
                "flex-start nodes live seven days at most",
            )
        )
    machine = catalog.MACHINE_TYPES.get(pool.machine_type)
    sub_block = machine and catalog.GENERATIONS[machine.generation].sub_block_hosts
    if rung.reservation and "/reservationSubBlocks/" in rung.reservation and sub_block:
        try:
            hosts = catalog.lookup(pool.machine_type, pool.topology).hosts
        except catalog.CatalogError:
            return problems
        if hosts > sub_block:
            problems.append(
                ConfigProblem(
                    f"{at}.reservation",
                    rung.reservation,
                    f"a sub-block holds {sub_block} hosts; a {pool.topology} slice needs "
                    f"{hosts}: name the block (…/reservationBlocks/B) or a smaller topology",
                )
            )
    return problems


def capacity_warnings(config: StackConfig) -> list[ConfigProblem]:
    """Capacity that is allowed but likely to disappoint: spot on a generation Google does not
    document it for, and a rung that can stock out before the ladder's last (Kueue 0.19.2
    assigns it again after a PodsReadyTimeout eviction, infra.plan.kueue)."""
    warnings = []
    for i, pool in enumerate(config.tpu_pools):
        prefix = f"park:tpuPools[{i}]"
        machine = catalog.MACHINE_TYPES.get(pool.machine_type)
        generation = catalog.GENERATIONS[machine.generation] if machine else None
        rungs = rung_keys(prefix, pool)
        for at, rung in rungs:
            if rung.capacity == "spot" and generation and not generation.spot_documented:
                warnings.append(
                    ConfigProblem(
                        f"{at}.capacity",
                        rung.capacity,
                        f"Google documents no spot capacity for TPU {generation.name} (its "
                        "page: reservations, calendar mode, the account team; cluster-"
                        "toolkit: reservation, flex-start, queued): expect no nodes",
                    )
                )
        for at, rung in rungs[:-1]:
            if rung.capacity in STOCKOUT_CAPACITY:
                warnings.append(
                    ConfigProblem(
                        f"{at}.capacity",
                        rung.capacity,
                        "a stockout here is not walked past: Kueue 0.19.2 assigns this rung "
                        "again after evicting a job whose pods never started; the rungs below "
                        "are reached only once its quota is taken. Put reservation rungs first "
                        "and a spot, on-demand or flex-start rung last",
                    )
                )
    return warnings


# Capacity GKE may fail to find at the moment a job asks (a reservation's is known; DWS waits).
STOCKOUT_CAPACITY = ("spot", "on-demand", "flex-start")


def serving_pool_problems(pool: PoolPlan, key_value: str) -> list[ConfigProblem]:
    """A RayService runs until stopped: on one capacity (Kueue walks a ladder for RayJobs
    only) whose nodes do not go away on a clock."""
    expiring = [r.capacity for r in pool.rungs if r.nodes_expire]
    if pool.laddered:
        message = (
            "a capacity ladder is walked by Kueue, which admits RayJobs, not a RayService: "
            "serve from a pool of one capacity (on-demand, reservation, or spot with 2+ "
            "replicas)"
        )
    elif expiring:
        message = (
            f"a {expiring[0]} pool's nodes go away on a clock (a DWS booking, flex-start's run "
            "duration), which a service that runs until stopped outlives; serve from an "
            "on-demand, reservation or spot pool"
        )
    else:
        return []
    return [ConfigProblem("park:serving.pool", key_value, message)]


def spot_serving_warnings(serving: ServingPlan) -> list[ConfigProblem]:
    """One replica on spot: valid (dev's cheap default), but a preemption is an outage."""
    pool = serving.pool
    alone = [m for m in serving.models if m.min_slices < 2]
    if pool.capacity != "spot" or pool.laddered or not alone:
        return []
    return [
        ConfigProblem(
            f"{alone[0].key}.minReplicas",
            alone[0].min_slices,
            f"one replica on spot (pool {pool.name}): a preemption stops the service until a "
            "new slice is found; 2+ replicas on spot, or an on-demand or reservation pool, keep "
            "it answering",
        )
    ]


def training_pool_problems(training: TrainingPlan) -> list[ConfigProblem]:
    """Training on a rung whose nodes are preempted or expire resumes from its checkpoints only
    if Ray Train may restart it (maxFailures > 0)."""
    pool = training.pool
    lost = [r.capacity for r in pool.rungs if r.preemptible or r.capacity == "flex-start"]
    if not lost or training.spec.max_failures > 0:
        return []
    return [
        ConfigProblem(
            "park:training.maxFailures",
            training.spec.max_failures,
            f"pool {pool.name} runs on {lost[0]} capacity, whose nodes go away mid-run: allow "
            "restarts (1 or more) so the run resumes from its last checkpoint",
        )
    ]
