"""VPC, subnet with pod/service ranges, and Cloud NAT for private nodes' egress."""

from __future__ import annotations

import pulumi
from pulumi_gcp.compute import Network as GcpNetwork
from pulumi_gcp.compute import Router, RouterNat, Subnetwork

from infra.config import StackConfig


class Network(pulumi.ComponentResource):
    network_name: pulumi.Output[str]
    subnetwork_name: pulumi.Output[str]

    def __init__(self, name: str, config: StackConfig, opts: pulumi.ResourceOptions | None = None):
        super().__init__("park:gcp:Network", name, None, opts)
        net = config.network
        child = pulumi.ResourceOptions(parent=self)
        if net.existing_network:
            # An existing network by name: its subnet must already carry the two ranges.
            self.network_name = pulumi.Output.from_input(net.existing_network)
            self.subnetwork_name = pulumi.Output.from_input(
                net.existing_subnetwork or net.existing_network
            )
        else:
            vpc = GcpNetwork(
                f"{name}-vpc",
                name=f"{config.cluster.name}-vpc",
                auto_create_subnetworks=False,
                routing_mode="REGIONAL",
                opts=child,
            )
            subnet = Subnetwork(
                f"{name}-subnet",
                name=f"{config.cluster.name}-nodes",
                region=config.region,
                network=vpc.id,
                ip_cidr_range=net.subnet_cidr,
                private_ip_google_access=True,
                secondary_ip_ranges=[
                    {"range_name": net.pods_range_name, "ip_cidr_range": net.pods_cidr},
                    {"range_name": net.services_range_name, "ip_cidr_range": net.services_cidr},
                ],
                log_config={"aggregation_interval": "INTERVAL_5_SEC", "flow_sampling": 0.5},
                opts=child,
            )
            router = Router(
                f"{name}-router",
                name=f"{config.cluster.name}-router",
                region=config.region,
                network=vpc.id,
                opts=child,
            )
            RouterNat(
                f"{name}-nat",
                name=f"{config.cluster.name}-nat",
                router=router.name,
                region=config.region,
                nat_ip_allocate_option="AUTO_ONLY",
                source_subnetwork_ip_ranges_to_nat="ALL_SUBNETWORKS_ALL_IP_RANGES",
                log_config={"enable": True, "filter": "ERRORS_ONLY"},
                opts=child,
            )
            self.network_name = vpc.name
            self.subnetwork_name = subnet.name
        self.register_outputs(
            {"network_name": self.network_name, "subnetwork_name": self.subnetwork_name}
        )
