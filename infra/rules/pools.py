"""Rules for the zone, the GKE version and the node pools: what GKE would reject at `pulumi up`.

Each rule reads the spec and the TPU catalog; pool-level rules take one pool (and a config-key
prefix), so a component given the same arguments outside a stack checks them the same way.
"""

from __future__ import annotations

import re

from infra import catalog, gke
from infra.rules import capacity
from infra.rules.capacity import capacity_problems
from infra.schema.errors import ConfigProblem
from infra.schema.models import GpuPoolConfig, StackConfig, TpuPoolConfig

POOL_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,28}[a-z0-9])?$")


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
    return problems + capacity.tpu_capacity_problems(prefix, pool)


def _zone(config: StackConfig, pool: TpuPoolConfig) -> list[ConfigProblem]:
    """The stack's zone must offer the pool's TPU generation."""
    machine = catalog.MACHINE_TYPES.get(pool.machine_type)
    if machine is None:
        return []
    generation = catalog.GENERATIONS[machine.generation]
    zones = (*generation.zones, *config.extra_tpu_zones)
    if config.zone in zones:
        return []
    return [
        ConfigProblem(
            "park:zone",
            config.zone,
            f"no TPU {generation.name} known in this zone (pool {pool.name}); "
            f"known: {', '.join(generation.zones)}; add a newer zone to park:extraTpuZones",
        )
    ]


def _feature_minimums(config: StackConfig) -> list[tuple[str, gke.GkeVersion, str]]:
    """(what, minimum version, source) for every GKE feature the stack uses."""
    needs: list[tuple[str, gke.GkeVersion, str]] = []
    for pool in config.tpu_pools:
        machine = catalog.MACHINE_TYPES.get(pool.machine_type)
        if machine is not None:
            generation = catalog.GENERATIONS[machine.generation]
            floor = gke.parse(generation.min_gke_version)
            assert floor is not None
            needs.append((f"TPU {generation.name} (pool {pool.name})", floor, "the TPU catalog"))
        for rung in pool.rungs():
            feature = {"flex-start": "flex-start-tpu", "queued": "queued-provisioning-tpu"}.get(
                rung.capacity
            )
            if feature:
                version, source = gke.minimum(feature)
                needs.append((f"{rung.capacity} TPU capacity (pool {pool.name})", version, source))
    if config.kuberay.install == "addon":
        version, source = gke.minimum("ray-operator-addon")
        needs.append(("GKE's Ray Operator add-on", version, source))
    return needs


def check_version(config: StackConfig) -> list[ConfigProblem]:
    """A pinned version must be one the channel still offers and new enough for every feature
    the stack uses; unpinned, the channel's default must be (it is, as of infra/data/gke.yaml)."""
    channel = gke.channel(config.cluster.release_channel)
    pinned = config.cluster.version
    key = "park:cluster.version"
    if pinned is None:
        version, what = channel.default, f"channel {channel.name}'s default {channel.default}"
    else:
        parsed = gke.parse(pinned)
        if parsed is None:
            return [
                ConfigProblem(
                    key,
                    pinned,
                    "not a GKE version; use a minor such as 1.35 (its newest patch), an exact "
                    "version such as 1.35.8-gke.1036000, or leave it unset to follow the channel",
                )
            ]
        if not parsed.satisfies(channel.oldest_minor):
            return [
                ConfigProblem(
                    key,
                    pinned,
                    f"older than release channel {channel.name} offers (oldest minor "
                    f"{channel.oldest_minor}, default {channel.default} as read "
                    f"{gke.read_date()}): GKE would refuse it as the initial version; pin "
                    f"{channel.default.major}.{channel.default.minor} or leave it unset",
                )
            ]
        version, what = parsed, pinned
    problems = []
    for feature, floor, source in _feature_minimums(config):
        if not version.satisfies(floor):
            problems.append(
                ConfigProblem(key, pinned, f"{what}: {feature} needs GKE ≥ {floor} ({source})")
            )
    return problems


def version_warnings(config: StackConfig) -> list[ConfigProblem]:
    """An exact patch is retired by GKE within weeks: a later create (a second stack, a
    rebuilt cluster) would fail with it, so say so before the first `pulumi up`."""
    pinned = config.cluster.version
    parsed = gke.parse(pinned) if pinned else None
    if pinned is None or parsed is None or not parsed.exact:
        return []
    return [
        ConfigProblem(
            "park:cluster.version",
            pinned,
            "an exact patch: GKE offers each patch for a few weeks only, and the provider sends "
            f"it as the initial version; pin the minor ({parsed.major}.{parsed.minor}) or leave "
            "it unset unless you need this patch",
        )
    ]


def check_location(config: StackConfig) -> list[ConfigProblem]:
    if config.zone.startswith(config.region + "-"):
        return []
    return [
        ConfigProblem("park:zone", config.zone, f"must be a zone of gcp:region {config.region}")
    ]


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
            problems += _zone(config, pool)
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
