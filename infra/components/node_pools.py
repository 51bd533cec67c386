"""The node pools: the CPU pool for Ray heads and system pods, TPU slice pools (one GKE node
pool per slice, parented to their config pool) and GPU pools."""

from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

import pulumi
from pulumi_gcp.container import NodePool

from infra.components._base import (
    TYPE_PREFIX,
    ComponentArgsError,
    checked_args,
    checked_plan,
    child_options,
    plain,
    region_of,
    with_cluster,
)
from infra.components._naming import claim, renamed
from infra.names import ROLE_LABEL
from infra.plan import node_pools
from infra.plan.node_pools import NodePoolPlan


def _node_pool(
    owner: str,
    resource_name: str,
    plan: NodePoolPlan,
    args: Mapping[str, Any],
    opts: pulumi.ResourceOptions,
    gke_name: str | None = None,
) -> NodePool:
    """One GKE node pool, logical name `resource_name` (from the component's), in the cluster's
    project when known (the cluster's id carries it anyway)."""
    gke_name = gke_name or plan.name
    cluster = args["cluster"]
    taken = claim(
        owner, f"node pool {gke_name}", (cluster if isinstance(cluster, str) else id(cluster),)
    )
    if taken:
        component, name = owner.split(" ", 1)
        raise ComponentArgsError(component, name.strip("'"), [f"args.name = {gke_name!r}: {taken}"])
    pool_args = dict(plan.args)
    pool_args["node_config"] = {
        **pool_args["node_config"],
        "service_account": args["node_service_account"],
    }
    if args.get("project"):
        pool_args["project"] = args["project"]
    return NodePool(
        resource_name,
        name=gke_name,
        cluster=args["cluster"],
        **pool_args,
        opts=renamed(opts, resource_name, plan.name),
    )


# Each pool's arguments repeat the fields every pool has rather than inherit them: Pulumi's
# schema analyzer reads a field's description only from the class that declares it.


class CpuPoolArgs(TypedDict):
    """The pool Ray heads, KubeRay's submitters and system pods run on."""

    cluster: pulumi.Input[str]
    """The cluster: Cluster.cluster_id or ExistingCluster.cluster_id (projects/<p>/locations/
    <zone>/clusters/<name>), or a name in `project`; in Python, the Cluster or ExistingCluster
    itself, which also gives project, location and node_service_account."""
    location: NotRequired[str]
    """The cluster's zone (required unless the cluster component is given)."""
    node_service_account: NotRequired[pulumi.Input[str]]
    """The nodes' service account e-mail (Cluster.node_service_account; required unless the
    cluster component is given)."""
    project: NotRequired[str]
    """The cluster's GCP project (default: the provider's, or the one in the cluster's id)."""
    disk_size_gb: NotRequired[int]
    """Boot disk size, at least 15."""
    name: NotRequired[str]
    """The GKE node pool's name (default: the component's name)."""
    machine_type: NotRequired[str]
    """Machine type (default e2-standard-8)."""
    min_nodes: NotRequired[int]
    """Autoscaling minimum (default 1)."""
    max_nodes: NotRequired[int]
    """Autoscaling maximum (default 3)."""


class TpuSlicePoolArgs(TypedDict):
    """`slices` TPU slices of one (machine type, topology): one GKE node pool per slice."""

    cluster: pulumi.Input[str]
    """The cluster: Cluster.cluster_id or ExistingCluster.cluster_id (projects/<p>/locations/
    <zone>/clusters/<name>), or a name in `project`; in Python, the Cluster or ExistingCluster
    itself, which also gives project, location and node_service_account."""
    location: NotRequired[str]
    """The cluster's zone (required unless the cluster component is given)."""
    node_service_account: NotRequired[pulumi.Input[str]]
    """The nodes' service account e-mail (Cluster.node_service_account; required unless the
    cluster component is given)."""
    project: NotRequired[str]
    """The cluster's GCP project (default: the provider's, or the one in the cluster's id)."""
    disk_size_gb: NotRequired[int]
    """Boot disk size, at least 15."""
    name: NotRequired[str]
    """The pool's name (default: the component's name); its node pools are <name>-s<i> and
    its nodes carry the label park-gke/pool=<name>."""
    machine_type: str
    """ct6e-standard-1t, -4t or -8t."""
    topology: str
    """A topology the machine type offers, e.g. 2x4, 4x4."""
    slices: NotRequired[int]
    """Number of slices (default 1)."""
    capacity: NotRequired[str]
    """on-demand (default), spot, reservation, flex-start or queued."""
    reservation: NotRequired[str]
    """Reservation name (capacity reservation only)."""
    autoscaling: NotRequired[bool]
    """Scale each slice between 0 and its hosts (default true)."""
    max_run_duration: NotRequired[str]
    """flex-start: longest a node lives, e.g. 86400s."""
    extra_zones: NotRequired[list[str]]
    """Zones to accept beyond the catalog's known zones of the generation."""


class GpuPoolArgs(TypedDict):
    """A GPU pool beside the TPU pools, on the same control plane; scales to 0 while idle."""

    cluster: pulumi.Input[str]
    """The cluster: Cluster.cluster_id or ExistingCluster.cluster_id (projects/<p>/locations/
    <zone>/clusters/<name>), or a name in `project`; in Python, the Cluster or ExistingCluster
    itself, which also gives project, location and node_service_account."""
    location: NotRequired[str]
    """The cluster's zone (required unless the cluster component is given)."""
    node_service_account: NotRequired[pulumi.Input[str]]
    """The nodes' service account e-mail (Cluster.node_service_account; required unless the
    cluster component is given)."""
    project: NotRequired[str]
    """The cluster's GCP project (default: the provider's, or the one in the cluster's id)."""
    disk_size_gb: NotRequired[int]
    """Boot disk size, at least 15."""
    name: NotRequired[str]
    """The pool's name (default: the component's name)."""
    machine_type: str
    """e.g. a3-highgpu-8g."""
    accelerator_type: str
    """e.g. nvidia-h100-80gb."""
    accelerator_count: NotRequired[int]
    """GPUs per node (default 8)."""
    nodes: NotRequired[int]
    """Maximum nodes (default 1)."""
    capacity: NotRequired[str]
    """on-demand (default), spot, reservation or flex-start."""
    reservation: NotRequired[str]
    """Reservation name (capacity reservation only)."""
    autoscaling: NotRequired[bool]
    """Scale between 0 and nodes (default true)."""


def _checked(component: str, name: str, args: Any, typed: Any) -> dict[str, Any]:
    """The pool's args: the cluster handle unpacked, checked strictly, `name` defaulted."""
    checked = checked_args(component, name, with_cluster(component, name, args), typed)
    missing = [f for f in ("location", "node_service_account") if checked.get(f) is None]
    if missing:
        problems = [
            f"args.{f}: required unless `cluster` is a Cluster or ExistingCluster" for f in missing
        ]
        raise ComponentArgsError(component, name, problems)
    return {"name": name, **checked}


def _values(args: Mapping[str, Any], **keys: object) -> dict[str, object]:
    return {
        "gcp:project": args.get("project") or "project",  # the cluster's, when given
        "gcp:region": region_of(args["location"]),
        "park:zone": args["location"],
        **keys,
    }


class CpuPool(pulumi.ComponentResource):
    """The pool Ray heads, submitters and system pods run on."""

    node_pool_name: pulumi.Output[str]
    """The GKE node pool (what in-cluster resources wait for)."""
    node_selector: pulumi.Output[dict[str, str]]
    """The label its nodes carry: a workload's head_node_selector, to run the Ray head here."""

    def __init__(self, name: str, args: CpuPoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TYPE_PREFIX + "CpuPool", name, None, opts)
        args = _checked(  # type: ignore[assignment]
            "CpuPool", name, args, CpuPoolArgs
        )
        spec = plain(args, "machine_type", "min_nodes", "max_nodes", "disk_size_gb")
        plan = checked_plan(
            "CpuPool",
            name,
            _values(args, **{"park:cpuPool": spec}),
            [("park:cpuPool.", "")],
            stack=name,
        )
        # The boot disk is the argument: the stack program's is the one its disk plan sized.
        pool = node_pools.cpu_pool(plan.spec.cpu_pool, args["location"], args.get("disk_size_gb"))
        self.node_pool = _node_pool(
            f"CpuPool {name!r}", name, pool, args, child_options(self, opts), args["name"]
        )
        self.selector = {ROLE_LABEL: pool.args["node_config"]["labels"][ROLE_LABEL]}
        self.node_pool_name = self.node_pool.name
        self.node_selector = pulumi.Output.from_input(self.selector)
        self.register_outputs(
            {"node_pool_name": self.node_pool_name, "node_selector": self.node_selector}
        )

    def as_argument(self, field: str) -> dict[str, str] | None:
        """Given as a workload's head_node_selector: the label its nodes carry."""
        return dict(self.selector) if field == "head_node_selector" else None


class TpuSlicePool(pulumi.ComponentResource):
    """One TPU pool: `slices` node pools of the slice's hosts each, scaling from 0."""

    chips: pulumi.Output[int]
    """TPU chips of every slice."""
    hosts: pulumi.Output[int]
    """TPU hosts (nodes) of every slice."""
    node_pool_names: pulumi.Output[list[str]]
    """One GKE node pool per slice."""

    def __init__(
        self, name: str, args: TpuSlicePoolArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(TYPE_PREFIX + "TpuSlicePool", name, None, opts)
        args = _checked(  # type: ignore[assignment]
            "TpuSlicePool", name, args, TpuSlicePoolArgs
        )
        spec = plain(
            args,
            "name",
            "machine_type",
            "topology",
            "slices",
            "capacity",
            "reservation",
            "autoscaling",
            "max_run_duration",
            "disk_size_gb",
        )
        values = _values(args, **{"park:tpuPools": [spec]})
        if args.get("extra_zones"):
            values["park:extraTpuZones"] = list(args["extra_zones"])
        fields = [
            ("park:tpuPools[0].", ""),
            ("park:zone", "location"),
            ("park:extraTpuZones", "extra_zones"),
        ]
        plan = checked_plan("TpuSlicePool", name, values, fields, stack=name)
        pool = next(p for p in plan.tpu_pools if p.name == args["name"])
        child = child_options(self, opts)
        owner = f"TpuSlicePool {name!r}"
        self.node_pools = [
            _node_pool(owner, f"{name}-s{p.slice_index}", p, args, child)
            for p in node_pools.tpu_slice_pools(pool, args["location"], args.get("disk_size_gb"))
        ]
        self.plan = pool
        # What a RayTrainingJob or LlmService on this pool takes as its `pool` argument.
        self.ref = {
            "name": pool.spec.name,
            "machine_type": pool.spec.machine_type,
            "topology": pool.spec.topology,
            "slices": pool.spec.slices,
            "capacity": pool.spec.capacity,
            **({"reservation": pool.spec.reservation} if pool.spec.reservation else {}),
        }
        self.chips = pulumi.Output.from_input(pool.total_chips)
        self.hosts = pulumi.Output.from_input(pool.total_hosts)
        self.node_pool_names = pulumi.Output.all(*(p.name for p in self.node_pools))
        self.register_outputs(
            {
                "chips": self.chips,
                "hosts": self.hosts,
                "node_pool_names": self.node_pool_names,
                "machine_type": pool.slice.machine_type,
                "topology": pool.slice.topology,
                "slices": pool.slices,
            }
        )

    def as_argument(self, field: str) -> dict[str, Any] | None:
        """Given as a workload's `pool`: its reference (name, machine type, topology, ...)."""
        return dict(self.ref) if field == "pool" else None


class GpuPool(pulumi.ComponentResource):
    """A GPU pool beside the TPU pools."""

    node_pool_name: pulumi.Output[str]
    """The GKE node pool."""

    def __init__(self, name: str, args: GpuPoolArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(TYPE_PREFIX + "GpuPool", name, None, opts)
        args = _checked(  # type: ignore[assignment]
            "GpuPool", name, args, GpuPoolArgs
        )
        spec = plain(
            args,
            "name",
            "machine_type",
            "accelerator_type",
            "accelerator_count",
            "nodes",
            "capacity",
            "reservation",
            "autoscaling",
            "disk_size_gb",
        )
        fields = [("park:gpuPools[0].", "")]
        plan = checked_plan(
            "GpuPool", name, _values(args, **{"park:gpuPools": [spec]}), fields, stack=name
        )
        gpu = next(g for g in plan.gpu_pools if g.spec.name == args["name"])
        self.node_pool = _node_pool(
            f"GpuPool {name!r}",
            name,
            node_pools.gpu_pool(gpu.spec, args["location"]),
            args,
            child_options(self, opts),
        )
        self.node_pool_name = self.node_pool.name
        self.register_outputs({"node_pool_name": self.node_pool_name})
