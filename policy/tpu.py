"""TPU node pool rules: what GKE would reject at `pulumi up`, or accept and waste, caught at
preview. Every TPU fact comes from infra.catalog, keyed on (machine type, topology)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import ReportViolation, ResourceValidationArgs

from infra import catalog
from policy._props import as_int, fmt, get, is_true, is_zone, items, mapping

NODE_POOL = "gcp:container/nodePool:NodePool"
RESERVATION_KEY = "compute.googleapis.com/reservation-name"


def is_tpu_machine(machine_type: Any) -> bool:
    """Cloud TPU VMs, known to the catalog or not: ct* (v4 to v6e) or a family a catalog
    generation names (tpu7x-*)."""
    if not isinstance(machine_type, str):
        return False
    families = {"ct", *(f"{g.machine_type_prefix}-" for g in catalog.GENERATIONS.values())}
    return machine_type in catalog.MACHINE_TYPES or machine_type.startswith(tuple(families))


def single_host_topology(machine_type: str) -> str | None:
    """The topology GKE labels a pool with no `tpuTopology`: the machine type's one-host slice."""
    machine = catalog.MACHINE_TYPES.get(machine_type)
    if machine is None:
        return None
    for topology in machine.topologies:
        if catalog.lookup(machine_type, topology).hosts == 1:
            return topology
    return None


def pool_slice(props: Mapping[str, Any]) -> catalog.TpuSlice:
    """The slice a TPU node pool forms; raises CatalogError naming what is allowed."""
    machine_type = str(get(props, "nodeConfig.machineType", ""))
    topology = get(props, "placementPolicy.tpuTopology")
    if not topology:
        topology = single_host_topology(machine_type)
        if topology is None:
            return catalog.lookup(machine_type, "")  # raises: unknown machine type
    return catalog.lookup(machine_type, str(topology))


def _tpu_pool(args: ResourceValidationArgs) -> bool:
    return args.resource_type == NODE_POOL and is_tpu_machine(
        get(args.props, "nodeConfig.machineType")
    )


def tpu_pool_shape(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """A multi-host slice is atomic: its pool holds 0 or all of its hosts, and GKE checks the
    per-zone maximum against the slice size. Node counts must agree with the catalog."""
    if not _tpu_pool(args):
        return
    props = args.props
    try:
        tpu = pool_slice(props)
    except catalog.CatalogError as err:
        report_violation(f"node pool {args.name}: {err}", None)
        return
    if not tpu.multi_host:
        return  # every node is a whole slice: any count is valid
    where = f"node pool {args.name} ({tpu.machine_type} {tpu.topology}, {tpu.hosts} hosts)"
    allowed = f"0 or {tpu.hosts}"
    for key in ("nodeCount", "initialNodeCount"):
        count = props.get(key)
        if count is not None and as_int(count) not in (0, tpu.hosts):
            report_violation(f"{where}: {key} is {fmt(count)}; allowed: {allowed}", None)
    autoscaling = mapping(props.get("autoscaling"))
    if not autoscaling:
        return
    if autoscaling.get("maxNodeCount") is None:
        report_violation(
            f"{where}: set autoscaling.maxNodeCount (per zone) to {tpu.hosts}; GKE checks the "
            "per-zone maximum against the slice size, totalMaxNodeCount alone is rejected",
            None,
        )
    elif as_int(autoscaling["maxNodeCount"]) != tpu.hosts:
        report_violation(
            f"{where}: autoscaling.maxNodeCount is {fmt(autoscaling['maxNodeCount'])}; a slice "
            f"pool scales between 0 and exactly {tpu.hosts} (one pool per slice)",
            None,
        )
    minimum = autoscaling.get("minNodeCount")
    if minimum is not None and as_int(minimum) not in (0, tpu.hosts):
        report_violation(
            f"{where}: autoscaling.minNodeCount is {fmt(minimum)}; allowed: {allowed}", None
        )


def tpu_topology_multi_host_only(
    args: ResourceValidationArgs, report_violation: ReportViolation
) -> None:
    """`placementPolicy.tpuTopology` only on multi-host pools (GKE rejects it on single-host
    ones), and a multi-host slice placed as its generation says: COMPACT, or a workload policy
    (`policyName`, with `type` empty: GKE refuses COMPACT there and never stores a type)."""
    if not _tpu_pool(args):
        return
    topology = get(args.props, "placementPolicy.tpuTopology")
    if not topology:
        return
    machine_type = str(get(args.props, "nodeConfig.machineType"))
    try:
        tpu = catalog.lookup(machine_type, str(topology))
    except catalog.CatalogError:
        return  # tpu-pool-shape reports it
    if not tpu.multi_host:
        report_violation(
            f"node pool {args.name}: {topology} on {machine_type} is a single-host slice; GKE "
            "rejects placementPolicy.tpuTopology on single-host pools: remove it",
            None,
        )
        return
    kind = get(args.props, "placementPolicy.type") or ""
    policy = get(args.props, "placementPolicy.policyName")
    where = f"node pool {args.name}: a multi-host {tpu.generation.name} slice ({topology})"
    if tpu.workload_policy and (kind or not policy):
        report_violation(
            f"{where} is placed by a workload policy: placementPolicy.policyName set and "
            f"placementPolicy.type empty; got type {kind!r}, policyName {policy!r}",
            None,
        )
    elif not tpu.workload_policy and kind != "COMPACT":
        report_violation(f"{where} needs placementPolicy.type COMPACT, not {kind!r}", None)


def tpu_compact_single_zone(
    args: ResourceValidationArgs, report_violation: ReportViolation
) -> None:
    """COMPACT placement puts every host on one network fabric: one zone."""
    if args.resource_type != NODE_POOL or get(args.props, "placementPolicy.type") != "COMPACT":
        return
    zones = items(args.props.get("nodeLocations"))
    location = args.props.get("location")
    if not zones and is_zone(location):
        zones = [location]
    if len(zones) != 1:
        report_violation(
            f"node pool {args.name}: COMPACT placement needs exactly one zone; nodeLocations "
            f"is {zones or 'unset'} (location {location!r}); set nodeLocations to one zone",
            None,
        )


def pool_capacity(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """GKE's capacity preconditions: spot XOR reservation; a SPECIFIC reservation names
    exactly one; flex-start and queued provisioning start from 0 nodes, with no spot, no
    reservation and no auto-repair (a repair would be a fresh capacity request)."""
    if args.resource_type != NODE_POOL:
        return
    props = args.props
    node_config = mapping(props.get("nodeConfig"))
    spot = is_true(node_config.get("spot")) or is_true(node_config.get("preemptible"))
    affinity = mapping(node_config.get("reservationAffinity"))
    consume = affinity.get("consumeReservationType")
    name = f"node pool {args.name}"
    if consume == "SPECIFIC_RESERVATION":
        if spot:
            report_violation(f"{name}: spot and a reservation exclude each other; pick one", None)
        values = items(affinity.get("values"))
        if affinity.get("key") != RESERVATION_KEY or len(values) != 1:
            report_violation(
                f"{name}: a SPECIFIC_RESERVATION needs key {RESERVATION_KEY} and exactly one "
                f"reservation name; got key {affinity.get('key')!r}, values {values}",
                None,
            )
    kinds = [
        ("flex-start", is_true(node_config.get("flexStart"))),
        ("queued provisioning", is_true(get(props, "queuedProvisioning.enabled"))),
    ]
    for kind, enabled in kinds:
        if not enabled:
            continue
        if spot:
            report_violation(f"{name}: {kind} cannot use spot VMs", None)
        if consume != "NO_RESERVATION":
            report_violation(
                f"{name}: {kind} needs reservationAffinity.consumeReservationType "
                f"NO_RESERVATION, not {consume!r}",
                None,
            )
        autoscaling = mapping(props.get("autoscaling"))
        if not autoscaling:
            report_violation(f"{name}: {kind} needs autoscaling (the pool starts at 0)", None)
        elif as_int(autoscaling.get("minNodeCount", 0)) != 0:
            report_violation(
                f"{name}: {kind} needs autoscaling.minNodeCount 0, not "
                f"{fmt(autoscaling.get('minNodeCount'))}",
                None,
            )
        for key in ("nodeCount", "initialNodeCount"):
            if as_int(props.get(key)) not in (None, 0):
                report_violation(f"{name}: {kind} starts empty; {key} must be 0", None)
        if get(props, "management.autoRepair") is not False:
            report_violation(
                f"{name}: {kind} needs management.autoRepair false (a repair would request "
                "new capacity and lose the node's run)",
                None,
            )


def tpu_idle_scale_to_zero(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """TPU hosts bill while they are up: an idle pool should drop to 0 nodes."""
    if not _tpu_pool(args):
        return
    props = args.props
    autoscaling = mapping(props.get("autoscaling"))
    if autoscaling:
        minimum = as_int(autoscaling.get("minNodeCount", 0)) or 0
        if minimum > 0:
            report_violation(
                f"node pool {args.name}: autoscaling.minNodeCount {minimum} keeps TPU hosts "
                "(and their bill) up while idle; use 0",
                None,
            )
        return
    fixed = as_int(props.get("nodeCount", props.get("initialNodeCount"))) or 0
    if fixed > 0:
        report_violation(
            f"node pool {args.name}: a fixed {fixed} TPU node(s) stay up while idle; enable "
            "autoscaling from 0",
            None,
        )
