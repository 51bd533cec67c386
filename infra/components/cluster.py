"""The GKE Standard cluster, its minimal node service account, and the CPU pool."""

from __future__ import annotations

import pulumi
from pulumi_gcp.container import Cluster as GkeCluster
from pulumi_gcp.container import NodePool
from pulumi_gcp.projects import IAMMember
from pulumi_gcp.serviceaccount import Account

from infra.config import StackConfig
from infra.plan.node_pools import NodePoolPlan

# What nodes need to run, log and report metrics; nothing else (no default compute SA).
NODE_ROLES = (
    "roles/logging.logWriter",
    "roles/monitoring.metricWriter",
    "roles/monitoring.viewer",
    "roles/stackdriver.resourceMetadata.writer",
    "roles/autoscaling.metricsWriter",
)


def kubeconfig(name: str, endpoint: str, ca_certificate: str) -> str:
    """A kubeconfig that authenticates with gke-gcloud-auth-plugin (no static credentials)."""
    return f"""apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: https://{endpoint}
    certificate-authority-data: {ca_certificate}
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


class Cluster(pulumi.ComponentResource):
    name: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    node_service_account: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        config: StackConfig,
        network_name: pulumi.Input[str],
        subnetwork_name: pulumi.Input[str],
        cpu_pool: NodePoolPlan,
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("park:gke:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cfg = config.cluster

        node_sa = Account(
            f"{name}-nodes",
            account_id=f"{cfg.name}-nodes"[:30],
            display_name=f"GKE nodes of {cfg.name} (park-gke)",
            opts=child,
        )
        member = node_sa.email.apply(lambda email: f"serviceAccount:{email}")
        for role in NODE_ROLES:
            IAMMember(
                f"{name}-nodes-{role.split('/')[1].replace('.', '-')}",
                project=config.project,
                role=role,
                member=member,
                opts=child,
            )

        ray_operator = {"enabled": config.kuberay.install == "addon"}
        if ray_operator["enabled"]:
            ray_operator |= {
                "ray_cluster_logging_config": {"enabled": config.kuberay.logging},
                "ray_cluster_monitoring_config": {"enabled": config.kuberay.monitoring},
            }
        authorized = cfg.master_authorized_networks
        cluster = GkeCluster(
            name,
            name=cfg.name,
            location=config.zone,
            network=network_name,
            subnetwork=subnetwork_name,
            # The default pool is replaced by our own pools; it runs as our SA while it exists.
            remove_default_node_pool=True,
            initial_node_count=1,
            node_config={
                "service_account": node_sa.email,
                "oauth_scopes": cpu_pool.args["node_config"]["oauth_scopes"],
            },
            min_master_version=cfg.version,
            release_channel={"channel": cfg.release_channel},
            deletion_protection=cfg.deletion_protection,
            datapath_provider="ADVANCED_DATAPATH",  # Dataplane V2 enforces NetworkPolicy
            ip_allocation_policy={
                "cluster_secondary_range_name": config.network.pods_range_name,
                "services_secondary_range_name": config.network.services_range_name,
            },
            workload_identity_config={"workload_pool": f"{config.project}.svc.id.goog"},
            private_cluster_config={
                "enable_private_nodes": cfg.private_nodes,
                "enable_private_endpoint": cfg.private_endpoint,
                "master_ipv4_cidr_block": config.network.master_cidr,
            },
            master_authorized_networks_config=(
                {
                    "cidr_blocks": [
                        {"cidr_block": n.cidr, "display_name": n.name} for n in authorized
                    ]
                }
                if authorized or cfg.private_endpoint
                else None
            ),
            addons_config={
                "gcs_fuse_csi_driver_config": {"enabled": True},
                "ray_operator_configs": [ray_operator],
            },
            monitoring_config={
                "managed_prometheus": {"enabled": True},
                "enable_components": ["SYSTEM_COMPONENTS"],
            },
            logging_config={"enable_components": ["SYSTEM_COMPONENTS", "WORKLOADS"]},
            # The Gateway controller serves the IAP-protected Ray dashboard (opt-in only).
            gateway_api_config=(
                {"channel": "CHANNEL_STANDARD"} if config.observability.expose_dashboard else None
            ),
            enable_shielded_nodes=True,
            security_posture_config={"mode": "BASIC", "vulnerability_mode": "VULNERABILITY_BASIC"},
            opts=child,
        )
        cpu_args = dict(cpu_pool.args)
        cpu_args["node_config"] = {**cpu_args["node_config"], "service_account": node_sa.email}
        NodePool(
            f"{name}-{cpu_pool.name}",
            name=cpu_pool.name,
            cluster=cluster.name,
            **cpu_args,
            opts=pulumi.ResourceOptions(parent=self),
        )

        self.name = cluster.name
        self.endpoint = cluster.endpoint
        self.node_service_account = node_sa.email
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(
                cluster.name, cluster.endpoint, cluster.master_auth.cluster_ca_certificate
            ).apply(lambda a: kubeconfig(a[0], a[1], a[2] or ""))
        )
        self._cluster = cluster
        self.register_outputs(
            {
                "name": self.name,
                "endpoint": self.endpoint,
                "kubeconfig": self.kubeconfig,
                "node_service_account": self.node_service_account,
            }
        )

    @property
    def resource(self) -> GkeCluster:
        return self._cluster
