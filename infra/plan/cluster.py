"""The GKE Standard cluster and its node service account, as plain arguments.

The component (infra/components/cluster.py) adds what only exists at run time: the network
it joins and the node service account's e-mail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from infra import webhooks
from infra.plan import kueue
from infra.plan.node_pools import CLOUD_PLATFORM_SCOPE
from infra.plan.operator import helm_releases
from infra.resolve import StackPlan
from infra.webhooks import ControlPlanePort

# What nodes need to run, log and report metrics; nothing else (no default compute SA).
NODE_ROLES = (
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
    "roles/stackdriver.resourceMetadata.writer",
    "roles/autoscaling.metricsWriter",
)


# A training stack's cluster: GKE upgrades neither the nodes nor the minor version on its own
# until the cluster's minor version reaches its end of support (exclusion scope
# NO_MINOR_OR_NODE_UPGRADES: only control-plane patches, which evict no pod), so a node upgrade
# never drains the CPU pool under a Ray head nor a TPU slice mid-run. Declarative, so a second
# `up` plans nothing: a fixed start (never now()) and `end_time_behavior` instead of an end
# time, which GKE computes and moves with each minor upgrade; the provider (pulumi-gcp 10.2.0,
# terraform-provider-google 7.x flattenMaintenancePolicy) reads no end_time back for such an
# exclusion. It reads a policy back only when it has a window (else nothing, a diff at every
# `up`), hence the recurring window: weekends, when what the exclusion lets through (control-
# plane patches) may run. Times in UTC "Z" form, as GKE returns them (any other form diffs).
MAINTENANCE_EXCLUSION = "park-gke-training-runs"
MAINTENANCE_POLICY: dict[str, Any] = {
    "recurring_window": {
        "start_time": "2026-01-03T00:00:00Z",
        "end_time": "2026-01-05T00:00:00Z",
        "recurrence": "FREQ=WEEKLY;BYDAY=SA",
    },
    "maintenance_exclusions": [
        {
            "exclusion_name": MAINTENANCE_EXCLUSION,
            "start_time": "2026-01-01T00:00:00Z",
            "exclusion_options": {
                "scope": "NO_MINOR_OR_NODE_UPGRADES",
                "end_time_behavior": "UNTIL_END_OF_SUPPORT",
            },
        }
    ],
}


@dataclass(frozen=True)
class ClusterPlan:
    name: str  # the GKE cluster's name
    project: str
    node_service_account_id: str
    node_roles: tuple[str, ...]
    args: dict[str, Any]  # container.Cluster arguments, except network, subnetwork, node SA
    dns_endpoint: bool  # the kubeconfig (and so `pulumi up` in CI) uses the DNS endpoint


def cluster(plan: StackPlan) -> ClusterPlan:
    spec = plan.spec
    cfg = spec.cluster
    ray_operator: dict[str, Any] = {"enabled": spec.kuberay.install == "addon"}
    if ray_operator["enabled"]:
        ray_operator |= {
            "ray_cluster_logging_config": {"enabled": spec.kuberay.logging},
            "ray_cluster_monitoring_config": {"enabled": spec.kuberay.monitoring},
        }
    authorized = cfg.master_authorized_networks
    args: dict[str, Any] = {
        "name": plan.names.cluster,
        "location": spec.zone,
        # The default pool is replaced by our own pools; it runs as our SA while it exists.
        "remove_default_node_pool": True,
        "initial_node_count": 1,
        "node_config": {"oauth_scopes": [CLOUD_PLATFORM_SCOPE]},
        # A pin is sent as the cluster's *initial* version (pulumi-gcp/terraform: Cluster.
        # initialClusterVersion, never read back); unset, the channel's default is used and the
        # channel upgrades the cluster. infra/rules/pools.py checks a pin against the channel.
        "min_master_version": cfg.version,
        "release_channel": {"channel": cfg.release_channel},
        "deletion_protection": cfg.deletion_protection,
        "datapath_provider": "ADVANCED_DATAPATH",  # Dataplane V2 enforces NetworkPolicy
        "ip_allocation_policy": {
            "cluster_secondary_range_name": spec.network.pods_range_name,
            "services_secondary_range_name": spec.network.services_range_name,
        },
        "workload_identity_config": {"workload_pool": plan.names.workload_pool},
        "private_cluster_config": {
            "enable_private_nodes": cfg.private_nodes,
            "enable_private_endpoint": cfg.private_endpoint,
            "master_ipv4_cidr_block": spec.network.master_cidr,
        },
        "master_authorized_networks_config": (
            {"cidr_blocks": [{"cidr_block": n.cidr, "display_name": n.name} for n in authorized]}
            if authorized or cfg.private_endpoint
            else None
        ),
        "addons_config": {
            "gcs_fuse_csi_driver_config": {"enabled": True},
            "ray_operator_configs": [ray_operator],
        },
        "monitoring_config": {
            "managed_prometheus": {"enabled": True},
            "enable_components": ["SYSTEM_COMPONENTS"],
        },
        "logging_config": {"enable_components": ["SYSTEM_COMPONENTS", "WORKLOADS"]},
        # The Gateway controller serves the IAP-protected Ray dashboard (opt-in only).
        "gateway_api_config": (
            {"channel": "CHANNEL_STANDARD"} if spec.observability.expose_dashboard else None
        ),
        "enable_shielded_nodes": True,
        # Posture BASIC only: the API marks vulnerabilityMode deprecated ("Vulnerability scanning
        # is no longer supported", container.v1 discovery rev 20261027), so it is not sent.
        "security_posture_config": {"mode": "BASIC"},
    }
    if plan.training is not None or plan.rl is not None:
        args["maintenance_policy"] = MAINTENANCE_POLICY
    if cfg.dns_endpoint:
        # A DNS name for the control plane that IAM guards (container.clusters.connect), reachable
        # from outside the VPC without opening masterAuthorizedNetworks: how CI runners and
        # laptops reach a private cluster. masterAuthorizedNetworks keep guarding the IP endpoint.
        args["control_plane_endpoints_config"] = {
            "dns_endpoint_config": {"allow_external_traffic": True}
        }
    return ClusterPlan(
        name=plan.names.cluster,
        project=spec.project,
        node_service_account_id=plan.names.node_service_account_id,
        node_roles=NODE_ROLES,
        args=args,
        dns_endpoint=cfg.dns_endpoint,
    )


def control_plane_ports(plan: StackPlan) -> tuple[ControlPlanePort, ...]:
    """The ports the control plane calls on the nodes for what the stack installs in the
    cluster: its Helm releases (KubeRay's charts, cert-manager, Kueue). GKE's Ray add-on is
    hosted by GKE and adds none."""
    releases = helm_releases(plan.spec.kuberay, plan.multi_host)
    queue = kueue.helm_release(plan)
    installed = [r.name for r in [*releases, *([queue] if queue else [])]]
    return tuple(p for name in installed for p in webhooks.ports_of(name))


def webhook_firewall(
    cluster_name: str, master_cidr: str, private_nodes: bool, ports: Sequence[tuple[int, str]]
) -> dict[str, Any] | None:
    """compute.Firewall arguments (all but the network and the nodes' service account) that let
    the control plane reach `ports` ((port, the component listening)) on the nodes, less those
    GKE's own rule admits (443, 10250). None when none is left, or when the nodes are public:
    the rule admits the control-plane range of a private cluster (its masterIpv4CidrBlock)."""
    admitted = webhooks.gke_admitted()
    ports = [(port, component) for port, component in ports if port not in admitted]
    if not ports or not private_nodes:
        return None
    numbers = sorted({port for port, _ in ports})
    by_component = sorted({component for _, component in ports if component}) or ["its add-ons"]
    return {
        "name": f"{cluster_name}-webhooks",
        "description": (
            f"park-gke: the GKE control plane of {cluster_name} reaches the webhooks and APIs "
            f"of {', '.join(by_component)} on the nodes (tcp {', '.join(map(str, numbers))})"
        ),
        "direction": "INGRESS",
        "priority": 1000,
        "source_ranges": [master_cidr],
        "allows": [{"protocol": "tcp", "ports": [str(p) for p in numbers]}],
    }


def kubeconfig(name: str, endpoint: str, ca_certificate: str | None) -> str:
    """A kubeconfig that authenticates with gke-gcloud-auth-plugin (no static credentials).

    The DNS endpoint (`<uid>.<region>.gke.goog`) serves a publicly trusted certificate, so it
    carries no CA (as `gcloud container clusters get-credentials --dns-endpoint` writes it)."""
    authority = f"\n    certificate-authority-data: {ca_certificate}" if ca_certificate else ""
    return f"""apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: https://{endpoint}{authority}
contexts:
- name: {name}
  context: {{cluster: {name}, user: {name}}}
current-context: {name}
users:
- name: {name}
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: gke-gcloud-auth-plugin
      provideClusterInfo: true
      installHint: Install gke-gcloud-auth-plugin (gcloud components install gke-gcloud-auth-plugin)
"""
