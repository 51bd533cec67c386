"""VPC, subnet with pod/service ranges, and Cloud NAT for private nodes' egress."""

from typing import NotRequired, TypedDict

import pulumi

from infra.components._base import Component, site_values, stack_of, stack_values
from infra.components._naming import claim
from infra.plan.network import NetworkPlan, network


class NetworkArgs(TypedDict):
    """A VPC for a GKE cluster with TPU slice pools, or an existing network by name."""

    project: str
    """The GCP project."""
    region: str
    """Region of the subnet, router and NAT."""
    stack: NotRequired[str]
    """Names derive from it (park-<stack>-vpc, ...); default: the Pulumi stack's name."""
    existing_network: NotRequired[str]
    """Use this network instead of creating a VPC."""
    existing_subnetwork: NotRequired[str]
    """Its subnet, carrying the pods/services ranges."""
    subnet_cidr: NotRequired[str]
    """Node range of the new subnet. Default: 10.10.0.0/20."""
    pods_cidr: NotRequired[str]
    """Secondary range for pods. Default: 10.16.0.0/14."""
    services_cidr: NotRequired[str]
    """Secondary range for services. Default: 10.20.0.0/20."""
    pods_range_name: NotRequired[str]
    """Name of the pods secondary range. Default: pods."""
    services_range_name: NotRequired[str]
    """Name of the services secondary range. Default: services."""


# The arguments that are park:network's fields of the same name.
NETWORK_FIELDS = (
    "existing_network",
    "existing_subnetwork",
    "subnet_cidr",
    "pods_cidr",
    "services_cidr",
    "pods_range_name",
    "services_range_name",
)


class Network(Component):
    """The VPC, its subnet with the pods and services ranges, and Cloud NAT for private nodes."""

    network_name: pulumi.Output[str]
    """The network the cluster joins."""
    subnetwork_name: pulumi.Output[str]
    """Its subnet."""

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(name, opts)
        args = self.checked(args, NetworkArgs)
        stack = stack_of(args)
        values = {
            **site_values(args["project"], f"{args['region']}-b"),
            "park:network": stack_values(args, *NETWORK_FIELDS),
        }
        plan = network(self.plan(values, [("park:network.", ""), ("gcp:", "")], stack=stack))
        self._build(plan, args["project"], stack)

    @classmethod
    def of_plan(
        cls,
        name: str,
        plan: NetworkPlan,
        project: str,
        stack: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> "Network":
        """The stack program's: its plan's network (infra.plan.network)."""
        self = cls.planned(name, opts)
        self._build(plan, project, stack)
        return self

    def _build(self, plan: NetworkPlan, project: str, stack: str) -> None:
        name = self._component_name
        if plan.existing_network:
            self.network_name = pulumi.Output.from_input(plan.existing_network)
            self.subnetwork_name = pulumi.Output.from_input(
                plan.existing_subnetwork or plan.existing_network
            )
        else:
            from pulumi_gcp.compute import Network as GcpNetwork
            from pulumi_gcp.compute import Router, RouterNat, Subnetwork

            taken = claim(self.owner, f"network {plan.vpc['name']}", (project,))
            self.refuse_taken("stack", stack, [taken])
            child = self.child_options()
            vpc = GcpNetwork(f"{name}-vpc", project=project, **plan.vpc, opts=child)
            subnet = Subnetwork(
                f"{name}-subnet", project=project, network=vpc.id, **plan.subnet, opts=child
            )
            router = Router(
                f"{name}-router", project=project, network=vpc.id, **plan.router, opts=child
            )
            RouterNat(f"{name}-nat", project=project, router=router.name, **plan.nat, opts=child)
            self.network_name = vpc.name
            self.subnetwork_name = subnet.name
        self.register()
