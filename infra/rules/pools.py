"""Rules for the zone, the GKE version and the node pools: what GKE would reject at `pulumi up`.

Each rule reads the spec and the TPU catalog; pool-level rules take one pool (and a config-key
prefix), so a component given the same arguments outside a stack checks them the same way.
"""

from __future__ import annotations

import re

from infra import catalog
from infra.spec.errors import ConfigProblem
from infra.spec.models import GpuPoolConfig, StackConfig, TpuPoolConfig

_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:-gke\.(\d+))?$")
POOL_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,28}[a-z0-9])?$")


def gke_version_tuple(version: str) -> tuple[int, int, int, int] | None:
    """``"1.31.2-gke.1115000"`` → ``(1, 31, 2, 1115000)``; ``"1.32"`` → ``(1, 32, 0, 0)``."""
    match = _VERSION_RE.match(version)
    if not match:
        return None
    major, minor, patch, gke = (int(g or 0) for g in match.groups())
    return major, minor, patch, gke


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


def tpu_pool_problems(prefix: str, pool: TpuPoolConfig) -> list[ConfigProblem]:
    """One TPU pool on its own: its name, slices, catalog entry and capacity."""
    problems: list[ConfigProblem] = []
    if not POOL_NAME_RE.match(pool.name):
        problems.append(
            ConfigProblem(
                f"{prefix}.name",
                pool.name,
                "must be lowercase letters, digits and '-', start with a letter, ≤ 30 chars",
            )
        )
    if pool.slices < 1:
        problems.append(
            ConfigProblem(f"{prefix}.slices", pool.slices, "must be a positive integer")
        )
    try:
        catalog.lookup(pool.machine_type, pool.topology)
    except catalog.CatalogError as err:
        bad_key = "machineType" if pool.machine_type not in catalog.MACHINE_TYPES else "topology"
        value = pool.machine_type if bad_key == "machineType" else pool.topology
        problems.append(ConfigProblem(f"{prefix}.{bad_key}", value, str(err)))
    problems += capacity_problems(prefix, pool.capacity, pool.reservation, pool.autoscaling)
    if pool.max_run_duration and pool.capacity != "flex-start":
        problems.append(
            ConfigProblem(
                f"{prefix}.maxRunDuration",
                pool.max_run_duration,
                "only used with capacity 'flex-start'",
            )
        )
    return problems


def _zone_and_version(config: StackConfig, pool: TpuPoolConfig) -> list[ConfigProblem]:
    """The stack's zone and GKE version must offer the pool's TPU generation."""
    machine = catalog.MACHINE_TYPES.get(pool.machine_type)
    if machine is None:
        return []
    generation = catalog.GENERATIONS[machine.generation]
    problems = []
    zones = (*generation.zones, *config.extra_tpu_zones)
    if config.zone not in zones:
        problems.append(
            ConfigProblem(
                "park:zone",
                config.zone,
                f"no TPU {generation.name} known in this zone (pool {pool.name}); "
                f"known: {', '.join(generation.zones)}; add a newer zone to park:extraTpuZones",
            )
        )
    version = gke_version_tuple(config.cluster.version)
    floor = gke_version_tuple(generation.min_gke_version)
    if version is not None and floor is not None and version < floor:
        problems.append(
            ConfigProblem(
                "park:cluster.version",
                config.cluster.version,
                f"TPU {generation.name} needs GKE ≥ {generation.min_gke_version}",
            )
        )
    return problems


def check_location(config: StackConfig) -> list[ConfigProblem]:
    problems = []
    if not config.zone.startswith(config.region + "-"):
        problems.append(
            ConfigProblem("park:zone", config.zone, f"must be a zone of gcp:region {config.region}")
        )
    if gke_version_tuple(config.cluster.version) is None:
        problems.append(
            ConfigProblem(
                "park:cluster.version",
                config.cluster.version,
                "not a GKE version; use e.g. 1.31.2-gke.1115000 or 1.32",
            )
        )
    return problems


def check_pools(config: StackConfig) -> list[ConfigProblem]:
    """Every TPU and GPU pool; names are unique across both kinds (node pools share a cluster)."""
    problems: list[ConfigProblem] = []
    names = [p.name for p in config.tpu_pools] + [p.name for p in config.gpu_pools]
    pools: list[tuple[str, TpuPoolConfig | GpuPoolConfig]] = [
        *((f"park:tpuPools[{i}]", p) for i, p in enumerate(config.tpu_pools)),
        *((f"park:gpuPools[{i}]", p) for i, p in enumerate(config.gpu_pools)),
    ]
    for prefix, pool in pools:
        if names.count(pool.name) > 1:
            problems.append(
                ConfigProblem(f"{prefix}.name", pool.name, "duplicate pool name; names are unique")
            )
        if isinstance(pool, TpuPoolConfig):
            problems += tpu_pool_problems(prefix, pool)
            problems += _zone_and_version(config, pool)
        else:
            problems += gpu_pool_problems(prefix, pool)
    return problems


def gpu_pool_problems(prefix: str, pool: GpuPoolConfig) -> list[ConfigProblem]:
    problems = []
    if not POOL_NAME_RE.match(pool.name):
        problems.append(
            ConfigProblem(f"{prefix}.name", pool.name, "must be a lowercase DNS-style name")
        )
    if pool.capacity == "queued":
        problems.append(
            ConfigProblem(
                f"{prefix}.capacity", pool.capacity, "queued GPU pools are not supported yet"
            )
        )
    problems += capacity_problems(prefix, pool.capacity, pool.reservation, pool.autoscaling)
    return problems
