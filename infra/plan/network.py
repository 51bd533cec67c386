"""The VPC, its subnet with the pods and services ranges, and Cloud NAT for private nodes'
egress; or nothing, when the stack names an existing network."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.resolve import StackPlan


@dataclass(frozen=True)
class NetworkPlan:
    existing_network: str | None  # use this network (and subnetwork) instead of creating one
    existing_subnetwork: str | None
    vpc: dict[str, Any]  # compute.Network arguments
    subnet: dict[str, Any]  # compute.Subnetwork arguments, except the network
    router: dict[str, Any]  # compute.Router arguments, except the network
    nat: dict[str, Any]  # compute.RouterNat arguments, except the router


def network(plan: StackPlan) -> NetworkPlan:
    net, names, region = plan.spec.network, plan.names, plan.spec.region
    return NetworkPlan(
        existing_network=net.existing_network,
        existing_subnetwork=net.existing_subnetwork or net.existing_network,
        vpc={"name": names.network, "auto_create_subnetworks": False, "routing_mode": "REGIONAL"},
        subnet={
            "name": names.subnetwork,
            "region": region,
            "ip_cidr_range": net.subnet_cidr,
            "private_ip_google_access": True,
            "secondary_ip_ranges": [
                {"range_name": net.pods_range_name, "ip_cidr_range": net.pods_cidr},
                {"range_name": net.services_range_name, "ip_cidr_range": net.services_cidr},
            ],
            "log_config": {"aggregation_interval": "INTERVAL_5_SEC", "flow_sampling": 0.5},
        },
        router={"name": names.router, "region": region},
        nat={
            "name": names.nat,
            "region": region,
            "nat_ip_allocate_option": "AUTO_ONLY",
            "source_subnetwork_ip_ranges_to_nat": "ALL_SUBNETWORKS_ALL_IP_RANGES",
            "log_config": {"enable": True, "filter": "ERRORS_ONLY"},
        },
    )
