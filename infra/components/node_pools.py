"""The node pools: the CPU pool for Ray heads and system pods, TPU slice pools (one GKE node
pool per slice, parented to their config pool) and GPU pools."""

from __future__ import annotations

import pulumi
from pulumi_gcp.container import NodePool

from infra.plan.node_pools import NodePoolPlan
from infra.resolve import PoolPlan


def _node_pool(
    plan: NodePoolPlan,
    cluster_name: pulumi.Input[str],
    service_account: pulumi.Input[str],
    parent: pulumi.Resource,
    depends_on: list[pulumi.Resource],
) -> NodePool:
    args = dict(plan.args)
    args["node_config"] = {**args["node_config"], "service_account": service_account}
    return NodePool(
        plan.name,
        name=plan.name,
        cluster=cluster_name,
        **args,
        opts=pulumi.ResourceOptions(parent=parent, depends_on=depends_on),
    )


class _OneNodePool(pulumi.ComponentResource):
    """A component holding one planned node pool (the CPU pool, a GPU pool)."""

    TYPE = ""

    def __init__(
        self,
        plan: NodePoolPlan,
        cluster_name: pulumi.Input[str],
        service_account: pulumi.Input[str],
        depends_on: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__(self.TYPE, plan.name, None, opts)
        self.node_pool = _node_pool(plan, cluster_name, service_account, self, depends_on)
        self.register_outputs({"name": self.node_pool.name})


class CpuPool(_OneNodePool):
    """The pool Ray heads, submitters and system pods run on."""

    TYPE = "park:gke:CpuPool"


class TpuSlicePool(pulumi.ComponentResource):
    """One config TPU pool: `slices` node pools of `hosts` nodes each."""

    chips: pulumi.Output[int]
    hosts: pulumi.Output[int]

    def __init__(
        self,
        pool: PoolPlan,
        plans: list[NodePoolPlan],
        cluster_name: pulumi.Input[str],
        service_account: pulumi.Input[str],
        depends_on: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("park:gke:TpuSlicePool", pool.name, None, opts)
        self.node_pools = [
            _node_pool(p, cluster_name, service_account, self, depends_on) for p in plans
        ]
        self.chips = pulumi.Output.from_input(pool.total_chips)
        self.hosts = pulumi.Output.from_input(pool.total_hosts)
        self.register_outputs(
            {
                "chips": self.chips,
                "hosts": self.hosts,
                "machine_type": pool.slice.machine_type,
                "topology": pool.slice.topology,
                "slices": pool.slices,
            }
        )


class GpuPool(_OneNodePool):
    """A GPU pool beside the TPU pools, on the same control plane."""

    TYPE = "park:gke:GpuPool"
