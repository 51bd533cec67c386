"""The node pools: the CPU pool for Ray heads and system pods, TPU slice pools (one GKE node
pool per slice, parented to their config pool) and GPU pools."""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NotRequired, Self, TypedDict, TypeVar

import pulumi
from pulumi_gcp.compute import ResourcePolicy
from pulumi_gcp.container import NodePool

from infra.components._args import CapacityRungArgs, TpuPoolRefArgs
from infra.components._base import (
    PART_STACK,
    Component,
    derived_hint,
    name_problems,
    site_values,
    stack_values,
)
from infra.components._cluster_base import with_cluster
from infra.components._handles import ClusterRef
from infra.components._naming import claim, declare_pool, renamed
from infra.components._types import CapacityArg, TpuMachineTypeArg, TpuTopologyArg
from infra.names import ROLE_LABEL
from infra.plan import node_pools
from infra.plan.node_pools import NodePoolPlan
from infra.resolve import PoolPlan, StackPlan
from infra.schema.models import CapacityRung

_Args = TypeVar("_Args")
_GKE_NODE_POOL = re.compile(r"^[a-z](?:[-a-z0-9]{0,38}[a-z0-9])?$")


def _node_pool_name_problem(name: str) -> str | None:
    if _GKE_NODE_POOL.match(name):
        return None
    return "a GKE node pool name: 1-40 lowercase letters, digits and '-', starting with a letter"


def pool_ref(pool: PoolPlan) -> TpuPoolRefArgs:
    """What a RayTrainingJob, LlmService or Kueue takes as a TPU pool: TpuSlicePool.pool_ref."""
    spec = pool.spec
    ref = TpuPoolRefArgs(
        name=spec.name,
        machine_type=spec.machine_type,
        topology=spec.topology,
        slices=spec.slices,
        capacity=spec.capacity,
    )
    if spec.reservation:
        ref["reservation"] = spec.reservation
    if spec.ladder:
        ref["ladder"] = [_rung_args(rung) for rung in spec.ladder]
        del ref["capacity"]
    return ref


def _rung_args(rung: CapacityRung) -> CapacityRungArgs:
    args = CapacityRungArgs(capacity=rung.capacity)
    if rung.reservation:
        args["reservation"] = rung.reservation
    if rung.max_run_duration:
        args["max_run_duration"] = rung.max_run_duration
    return args


@dataclass(frozen=True)
class PoolCluster:
    """The cluster a pool's GKE node pools join, beside their plan: what a Cluster or
    ExistingCluster hands on."""

    cluster: pulumi.Input[str]  # its name, or its id (projects/<p>/locations/<zone>/clusters/<n>)
    node_service_account: pulumi.Input[str]
    project: str | None = None  # None: the provider's, or the one in the cluster's id

    @classmethod
    def of_args(cls, args: Mapping[str, Any]) -> "PoolCluster":
        return cls(args["cluster"], args["node_service_account"], args.get("project") or None)


class _Pool(Component):
    """What the three pools share: a Cluster or ExistingCluster given as `cluster` unpacked
    into their arguments, their one-pool stack, and the GKE node pools they make."""

    def checked(self, args: _Args, typed: type) -> _Args:
        """The cluster handle unpacked, checked strictly, `name` defaulted."""
        name = self._component_name
        given: Any = super().checked(with_cluster(self._component, name, args), typed)
        missing = [f for f in ("location", "node_service_account") if given.get(f) is None]
        if missing:
            unless = "required (in Python, unless `cluster` is the Cluster or ExistingCluster)"
            self.refuse([f"args.{f}: {unless}" for f in missing])
        self._derived = () if "name" in given else ("name",)
        given = {"name": name, **given}
        # GKE's node pool names: 1-40 characters, RFC 1035 (a TPU pool's slices add -s<i>)
        wrong = name_problems(given, {"name": _node_pool_name_problem})
        if wrong:
            self.refuse([w + derived_hint("name", name) if self._derived else w for w in wrong])
        return given

    def pool_spec(self, args: Mapping[str, Any], typed: type, *but: str) -> dict[str, Any]:
        """The pool's own arguments (not the cluster's, nor `but`): its entry in a stack file,
        whose fields its arguments are named after."""
        shared = _PoolArgs.__annotations__
        own = [f for f in typed.__annotations__ if f not in shared and f not in but]
        return stack_values(args, *own)

    def pool_plan(
        self, args: Mapping[str, Any], fields: list[tuple[str, str]], **keys: object
    ) -> StackPlan:
        """The stack plan of the pool's config `keys` (the stack program's, in it)."""
        values = {
            # the project: the cluster's, when given
            **site_values(args.get("project") or "project", args["location"]),
            **keys,
        }
        return self.plan(values, fields, stack=PART_STACK, derived=self._derived)

    def gke_node_pool(
        self,
        resource_name: str,
        plan: NodePoolPlan,
        joins: PoolCluster,
        gke_name: str | None = None,
    ) -> NodePool:
        """One GKE node pool, logical name `resource_name` (from the component's), in the
        cluster's project when known (the cluster's id carries it anyway)."""
        gke_name = gke_name or plan.name
        cluster = joins.cluster
        key = (cluster if isinstance(cluster, str) else id(cluster),)
        self.refuse_taken("name", gke_name, [claim(self.owner, f"node pool {gke_name}", key)])
        pool_args = dict(plan.args)
        pool_args["node_config"] = {
            **pool_args["node_config"],
            "service_account": joins.node_service_account,
        }
        if joins.project:
            pool_args["project"] = joins.project
        return NodePool(
            resource_name,
            name=gke_name,
            cluster=cluster,
            **pool_args,
            opts=renamed(self.child_options(), resource_name, self.legacy(plan.name)),
        )


class _PoolArgs(TypedDict):
    """What every pool takes: the cluster it joins (a base: its subclasses' schema
    descriptions come from here, park_gke.provider.schema)."""

    cluster: ClusterRef
    """The cluster: Cluster.cluster_id or ExistingCluster.cluster_id (projects/<p>/locations/
    <zone>/clusters/<name>), or a name in `project`; in Python only, the Cluster or
    ExistingCluster itself, which also gives project, location and node_service_account."""
    # Required in the provider schema (park_gke.provider.required_everywhere): only Python may
    # leave them out, by passing the cluster object above.
    location: NotRequired[str]
    """The cluster's zone. Required (in Python only, it may come from the cluster object)."""
    node_service_account: NotRequired[pulumi.Input[str]]
    """The nodes' service account e-mail (Cluster.node_service_account). Required (in Python
    only, it may come from the cluster object)."""
    project: NotRequired[str]
    """The cluster's GCP project (default: the provider's, or the one in the cluster's id)."""


class CpuPoolArgs(_PoolArgs):
    """The pool Ray heads, KubeRay's submitters and system pods run on."""

    disk_size_gb: NotRequired[int]
    """Boot disk, GB; unset: what its pods need (`park validate`)."""
    name: NotRequired[str]
    """The GKE node pool's name (default: the component's name)."""
    machine_type: NotRequired[str]
    """Machine type. Default: e2-standard-8."""
    min_nodes: NotRequired[int]
    """Autoscaling minimum. Default: 1."""
    max_nodes: NotRequired[int]
    """Autoscaling maximum. Default: 3."""


class TpuSlicePoolArgs(_PoolArgs):
    """`slices` TPU slices of one (machine type, topology): one GKE node pool per slice."""

    disk_size_gb: NotRequired[int]
    """Boot disk, GB; unset: what its pods need (`park validate`)."""
    name: NotRequired[str]
    """The pool's name (default: the component's name); its node pools are <name>-s<i> and
    its nodes carry the label park-gke/pool=<name>."""
    machine_type: TpuMachineTypeArg
    """ct6e-standard-1t, -4t or -8t."""
    topology: TpuTopologyArg
    """Slice topology the machine type offers (e.g. 2x4, 4x4)."""
    slices: NotRequired[int]
    """Number of slices (node pools). Default: 1."""
    capacity: NotRequired[CapacityArg]
    """on-demand, spot, reservation, flex-start or queued. Default: on-demand."""
    reservation: NotRequired[str]
    """Reservation name (capacity `reservation` only)."""
    autoscaling: NotRequired[bool]
    """Scale each slice between 0 and its hosts. Default: true."""
    max_run_duration: NotRequired[str]
    """flex-start: longest a node lives, e.g. `86400s`."""
    ladder: NotRequired[list[CapacityRungArgs]]
    """Capacity tried in order (instead of `capacity`): one node pool per rung and slice; Kueue
    admits each job on the first rung with room."""
    extra_zones: NotRequired[list[str]]
    """Zones to accept beyond the catalog's known zones of the TPU generation."""


class GpuPoolArgs(_PoolArgs):
    """A GPU pool beside the TPU pools, on the same control plane; scales to 0 while idle."""

    disk_size_gb: NotRequired[int]
    """Boot disk, GB (at least 15). Default: 200."""
    name: NotRequired[str]
    """The pool's name (default: the component's name)."""
    machine_type: str
    """e.g. a3-highgpu-8g."""
    accelerator_type: str
    """e.g. nvidia-h100-80gb."""
    accelerator_count: NotRequired[int]
    """GPUs per node. Default: 8."""
    nodes: NotRequired[int]
    """Maximum nodes (0 while idle). Default: 1."""
    capacity: NotRequired[CapacityArg]
    """on-demand, spot, reservation or flex-start. Default: on-demand."""
    reservation: NotRequired[str]
    """Reservation name (capacity `reservation` only)."""
    autoscaling: NotRequired[bool]
    """Scale between 0 and `nodes`. Default: true."""


class _OnePool(_Pool):
    """A pool of one GKE node pool (CpuPool, GpuPool)."""

    # of_plan's GKE name: the component's (True), else its plan's
    _NAMED_BY_COMPONENT = False

    @classmethod
    def of_plan(
        cls,
        name: str,
        pool: NodePoolPlan,
        joins: PoolCluster,
        opts: pulumi.ResourceOptions | None = None,
    ) -> Self:
        """The stack program's: a pool of its plan (infra.plan.node_pools.cpu_pool,
        gpu_pool)."""
        self = cls.planned(name, opts)
        self._build(pool, joins, name if cls._NAMED_BY_COMPONENT else None)
        return self

    def _build(self, pool: NodePoolPlan, joins: PoolCluster, gke_name: str | None = None) -> None:
        self.node_pool = self.gke_node_pool(self._component_name, pool, joins, gke_name)
        self.node_pool_name = self.node_pool.name
        self.register()


class CpuPool(_OnePool):
    """The pool Ray heads, submitters and system pods run on."""

    node_pool_name: pulumi.Output[str]
    """The GKE node pool (what in-cluster resources wait for)."""
    node_selector: pulumi.Output[dict[str, str]]
    """The label its nodes carry: a workload's head_node_selector, to run the Ray head here."""

    _NAMED_BY_COMPONENT = True

    def __init__(self, name: str, args: CpuPoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(name, opts)
        args = self.checked(args, CpuPoolArgs)
        spec = self.pool_spec(args, CpuPoolArgs, "name")  # the stack's CPU pool has no name
        plan = self.pool_plan(args, [("park:cpuPool.", "")], **{"park:cpuPool": spec})
        # The boot disk is the argument: the stack program's is the one its disk plan sized.
        pool = node_pools.cpu_pool(plan.spec.cpu_pool, args["location"], args.get("disk_size_gb"))
        self._build(pool, PoolCluster.of_args(args), args["name"])

    def _build(self, pool: NodePoolPlan, joins: PoolCluster, gke_name: str | None = None) -> None:
        self.selector = {ROLE_LABEL: pool.args["node_config"]["labels"][ROLE_LABEL]}
        self.node_selector = pulumi.Output.from_input(self.selector)
        super()._build(pool, joins, gke_name)

    def as_argument(self, field: str) -> dict[str, str] | None:
        """Given as a workload's head_node_selector: the label its nodes carry."""
        return dict(self.selector) if field == "head_node_selector" else None


class TpuSlicePool(_Pool):
    """One TPU pool: `slices` node pools of the slice's hosts each, scaling from 0."""

    chips: pulumi.Output[int]
    """TPU chips of every slice."""
    hosts: pulumi.Output[int]
    """TPU hosts (nodes) of every slice."""
    node_pool_names: pulumi.Output[list[str]]
    """One GKE node pool per slice."""
    pool_ref: pulumi.Output[TpuPoolRefArgs]
    """The pool's reference: what a RayTrainingJob, LlmService or Kueue takes as its pool."""

    def __init__(
        self, name: str, args: TpuSlicePoolArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(name, opts)
        args = self.checked(args, TpuSlicePoolArgs)
        spec = self.pool_spec(args, TpuSlicePoolArgs, "extra_zones")  # a stack key of its own
        zones = {"park:extraTpuZones": list(args["extra_zones"])} if args.get("extra_zones") else {}
        fields = [
            ("park:tpuPools[0].", ""),
            ("park:zone", "location"),
            ("park:extraTpuZones", "extra_zones"),
        ]
        plan = self.pool_plan(args, fields, **{"park:tpuPools": [spec]}, **zones)
        (pool,) = plan.tpu_pools
        slices = node_pools.tpu_slice_pools(pool, args["location"], args.get("disk_size_gb"))
        self._build(pool, slices, PoolCluster.of_args(args))

    @classmethod
    def of_plan(
        cls,
        name: str,
        pool: PoolPlan,
        slices: Sequence[NodePoolPlan],
        joins: PoolCluster,
        opts: pulumi.ResourceOptions | None = None,
    ) -> "TpuSlicePool":
        """The stack program's: a resolved TPU pool of its plan and its slices' GKE node
        pools (infra.plan.node_pools.tpu_slice_pools)."""
        self = cls.planned(name, opts)
        self._build(pool, slices, joins)
        return self

    def _build(self, pool: PoolPlan, slices: Sequence[NodePoolPlan], joins: PoolCluster) -> None:
        name = self._component_name
        slices = self._placed(pool, slices, joins)
        self.node_pools = [
            self.gke_node_pool(f"{name}{f'-{p.rung}' if p.rung else ''}-s{p.slice_index}", p, joins)
            for p in slices
        ]
        self.pool = pool
        # What a RayTrainingJob or LlmService on this pool takes as its `pool` argument.
        self.ref = pool_ref(pool)
        declare_pool(dict(self.ref))
        self.chips = pulumi.Output.from_input(pool.total_chips)
        self.hosts = pulumi.Output.from_input(pool.total_hosts)
        self.node_pool_names = pulumi.Output.all(*(p.name for p in self.node_pools))
        self.pool_ref = pulumi.Output.from_input(self.ref)
        self.register(
            machine_type=pool.slice.machine_type, topology=pool.slice.topology, slices=pool.slices
        )

    def _placed(
        self, pool: PoolPlan, slices: Sequence[NodePoolPlan], joins: PoolCluster
    ) -> list[NodePoolPlan]:
        """The slices, each naming the pool's workload policy where its generation places
        multi-host slices so (TPU7x): one ResourcePolicy per pool, i.e. per (region, topology)."""
        wanted = next((p.workload_policy for p in slices if p.workload_policy), None)
        if wanted is None:
            return list(slices)
        policy_name = pulumi.Output.from_input(joins.cluster).apply(
            lambda cluster: node_pools.workload_policy_name(
                str(cluster), pool.name, pool.slice.topology
            )
        )
        self.workload_policy = ResourcePolicy(
            f"{self._component_name}-placement",
            name=policy_name,
            **({"project": joins.project} if joins.project else {}),
            **wanted,
            opts=self.child_options(),
        )
        placed = []
        for plan in slices:
            placement = {**plan.args["placement_policy"], "policy_name": self.workload_policy.name}
            placed.append(replace(plan, args={**plan.args, "placement_policy": placement}))
        return placed

    def as_argument(self, field: str) -> dict[str, Any] | None:
        """Given as a workload's `pool`: its reference (name, machine type, topology, ...)."""
        return dict(self.ref) if field == "pool" else None


class GpuPool(_OnePool):
    """A GPU pool beside the TPU pools."""

    node_pool_name: pulumi.Output[str]
    """The GKE node pool."""

    def __init__(self, name: str, args: GpuPoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(name, opts)
        args = self.checked(args, GpuPoolArgs)
        spec = self.pool_spec(args, GpuPoolArgs)
        plan = self.pool_plan(args, [("park:gpuPools[0].", "")], **{"park:gpuPools": [spec]})
        (gpu,) = plan.gpu_pools
        self._build(node_pools.gpu_pool(gpu.spec, args["location"]), PoolCluster.of_args(args))
