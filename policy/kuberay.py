"""KubeRay rules: RayJobs release their TPUs, TPU worker groups match a slice the stack
creates, and nothing asks for a TPU without tolerating the TPU taint."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pulumi_policy import (
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    StackValidationArgs,
)

from infra import catalog
from infra.names import GKE_NODE_POOL_LABEL, POOL_LABEL
from infra.tools.manifests import tpu_groups
from infra.tools.manifests.pods import PodTemplate, workload_pod_templates
from infra.tools.manifests.tpu_groups import template_chips, tolerates_tpu
from policy._props import as_int, get, is_true, mapping
from policy.tpu import NODE_POOL, is_tpu_machine, pool_slice


def kind_of(resource_type: str) -> str:
    """``kubernetes:ray.io/v1:RayJob`` → ``RayJob``; "" for non-Kubernetes types."""
    if not resource_type.startswith("kubernetes:"):
        return ""
    return resource_type.rsplit(":", 1)[-1]


def templates(resource_type: str, props: Mapping[str, Any]) -> Iterator[PodTemplate]:
    """Every pod template a Kubernetes resource declares (Ray's kinds and core workloads)."""
    kind = kind_of(resource_type)
    if kind:
        yield from workload_pod_templates(kind, props)


def rayjob_shutdown_after_finish(
    args: ResourceValidationArgs, report_violation: ReportViolation
) -> None:
    """A RayJob that keeps its cluster after the job keeps every TPU host up, idle."""
    if kind_of(args.resource_type) != "RayJob":
        return
    spec = mapping(args.props.get("spec"))
    if spec.get("clusterSelector"):
        return  # runs on an existing cluster it does not own
    if not is_true(spec.get("shutdownAfterJobFinishes")):
        report_violation(
            f"RayJob {get(args.props, 'metadata.name', args.name)}: set "
            "spec.shutdownAfterJobFinishes: true so the Ray cluster (and its TPU slice) is "
            "deleted when the job ends",
            None,
        )


def tpu_requires_toleration(
    args: ResourceValidationArgs, report_violation: ReportViolation
) -> None:
    """TPU nodes carry google.com/tpu=present:NoSchedule; a pod asking for chips without
    tolerating it stays Pending forever."""
    for ref in templates(args.resource_type, args.props):
        if template_chips(ref.template) and not tolerates_tpu(
            get(ref.template, "spec.tolerations")
        ):
            report_violation(
                f"{args.name}: {ref.path} requests {catalog.TPU_RESOURCE} but does not "
                f"tolerate the taint {catalog.TPU_TAINT_KEY}={catalog.TPU_TAINT_VALUE}:"
                f"{catalog.TPU_TAINT_EFFECT}; add a toleration with operator Exists",
                None,
            )


def ray_tpu_worker_shape(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """A TPU worker group is one Ray pod per host: `google.com/tpu` = chips per host
    (requests = limits), `numOfHosts` = hosts of (machine type, topology), and node selectors
    on the accelerator and topology labels. The rules are infra/tools/manifests/tpu_groups.py's, the
    same `park validate` applies."""
    for ref in templates(args.resource_type, args.props):
        if ref.role != "worker":
            continue
        for problem in tpu_groups.group_problems(ref.group_spec):
            if problem.kind == "shape":
                report_violation(f"{args.name}: worker group {ref.group}: {problem.message}", None)


@dataclass(frozen=True)
class _Pool:
    name: str
    owner: str  # the config pool it belongs to (park-gke/pool), else its own name
    labels: dict[str, str]
    hosts: int
    slices: int  # how many slices the pool can hold at its maximum size


def tpu_pools(resources: list[PolicyResource]) -> list[_Pool]:
    """Every TPU node pool of the stack with the labels its nodes will carry."""
    pools = []
    for r in resources:
        if r.resource_type != NODE_POOL:
            continue
        if not is_tpu_machine(get(r.props, "nodeConfig.machineType")):
            continue
        try:
            tpu = pool_slice(r.props)
        except catalog.CatalogError:
            continue  # tpu-pool-shape reports it
        labels = {str(k): str(v) for k, v in mapping(get(r.props, "nodeConfig.labels")).items()}
        labels |= tpu.node_labels()
        name = str(r.props.get("name") or r.name)
        labels[GKE_NODE_POOL_LABEL] = name
        if is_true(get(r.props, "nodeConfig.spot")):
            labels[catalog.SPOT_LABEL] = "true"
        autoscaling = mapping(r.props.get("autoscaling"))
        most = as_int(autoscaling.get("maxNodeCount")) if autoscaling else None
        if most is None:
            most = as_int(r.props.get("nodeCount", r.props.get("initialNodeCount"))) or 0
        owner = labels.get(POOL_LABEL, name)
        pools.append(_Pool(name, owner, labels, tpu.hosts, most // tpu.hosts))
    return pools


def ray_workers_target_tpu_pools(
    args: StackValidationArgs, report_violation: ReportViolation
) -> None:
    """Each TPU worker group selects labels that some TPU node pool of this stack carries,
    with the same hosts per slice, and enough of them for its maxReplicas slices."""
    pools = tpu_pools(args.resources)
    for r in args.resources:
        for ref in templates(r.resource_type, r.props):
            if ref.role != "worker" or not template_chips(ref.template):
                continue
            selector = {
                str(k): str(v) for k, v in mapping(get(ref.template, "spec.nodeSelector")).items()
            }
            where = f"{r.name}: worker group {ref.group}"
            matching = [p for p in pools if all(p.labels.get(k) == v for k, v in selector.items())]
            if not matching:
                known = "; ".join(
                    f"{p.name}: {p.labels.get(catalog.TOPOLOGY_LABEL)}" for p in pools
                )
                report_violation(
                    f"{where}: no TPU node pool in this stack carries the labels {selector}; "
                    f"its pods would stay Pending. TPU pools: {known or 'none'}",
                    r.urn,
                )
                continue
            owners = sorted({p.owner for p in matching})
            if len(owners) > 1:
                report_violation(
                    f"{where}: its nodeSelector matches nodes of several pools "
                    f"({', '.join(owners)}); add {POOL_LABEL} so it cannot take (or scale up) "
                    "another pool's slices",
                    r.urn,
                )
            hosts = as_int(ref.group_spec.get("numOfHosts", 1)) or 1
            same_shape = [p for p in matching if p.hosts == hosts]
            if not same_shape:
                report_violation(
                    f"{where}: numOfHosts {hosts} but the pools it selects have "
                    f"{sorted({p.hosts for p in matching})} host(s) per slice",
                    r.urn,
                )
                continue
            wanted = max(
                as_int(ref.group_spec.get(key)) or 0 for key in ("replicas", "maxReplicas")
            )
            available = sum(p.slices for p in same_shape)
            if wanted > available:
                report_violation(
                    f"{where}: up to {wanted} slice(s) wanted but the matching pools "
                    f"({', '.join(p.name for p in same_shape)}) hold {available}",
                    r.urn,
                )
