"""TPU slice pools and GPU pools: one GKE node pool per planned pool, parented to its group."""

from __future__ import annotations

import pulumi
from pulumi_gcp.container import NodePool

from infra.config import TpuPoolConfig
from infra.plan.node_pools import NodePoolPlan


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


class TpuSlicePool(pulumi.ComponentResource):
    """One config TPU pool: `slices` node pools of `hosts` nodes each."""

    chips: pulumi.Output[int]
    hosts: pulumi.Output[int]

    def __init__(
        self,
        pool: TpuPoolConfig,
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
        tpu = pool.slice
        self.chips = pulumi.Output.from_input(tpu.chips * pool.slices)
        self.hosts = pulumi.Output.from_input(tpu.hosts * pool.slices)
        self.register_outputs(
            {
                "chips": self.chips,
                "hosts": self.hosts,
                "machine_type": pool.machine_type,
                "topology": tpu.topology,
                "slices": pool.slices,
            }
        )


class GpuPool(pulumi.ComponentResource):
    def __init__(
        self,
        plan: NodePoolPlan,
        cluster_name: pulumi.Input[str],
        service_account: pulumi.Input[str],
        depends_on: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("park:gke:GpuPool", plan.name, None, opts)
        self.node_pool = _node_pool(plan, cluster_name, service_account, self, depends_on)
        self.register_outputs({"name": self.node_pool.name})
