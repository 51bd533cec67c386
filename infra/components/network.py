"""VPC, subnet with pod/service ranges, and Cloud NAT for private nodes' egress."""

from __future__ import annotations

import pulumi

from infra.plan.network import NetworkPlan


class Network(pulumi.ComponentResource):
    network_name: pulumi.Output[str]
    subnetwork_name: pulumi.Output[str]

    def __init__(self, name: str, plan: NetworkPlan, opts: pulumi.ResourceOptions | None = None):
        super().__init__("park:gcp:Network", name, None, opts)
        if plan.existing_network:
            # An existing network by name: its subnet must already carry the two ranges.
            self.network_name = pulumi.Output.from_input(plan.existing_network)
            self.subnetwork_name = pulumi.Output.from_input(
                plan.existing_subnetwork or plan.existing_network
            )
        else:
            from pulumi_gcp.compute import Network as GcpNetwork
            from pulumi_gcp.compute import Router, RouterNat, Subnetwork

            child = pulumi.ResourceOptions(parent=self)
            vpc = GcpNetwork(f"{name}-vpc", **plan.vpc, opts=child)
            subnet = Subnetwork(f"{name}-subnet", network=vpc.id, **plan.subnet, opts=child)
            router = Router(f"{name}-router", network=vpc.id, **plan.router, opts=child)
            RouterNat(f"{name}-nat", router=router.name, **plan.nat, opts=child)
            self.network_name = vpc.name
            self.subnetwork_name = subnet.name
        self.register_outputs(
            {"network_name": self.network_name, "subnetwork_name": self.subnetwork_name}
        )
