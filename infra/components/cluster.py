"""The GKE Standard cluster and its minimal node service account."""

from __future__ import annotations

import pulumi
from pulumi_gcp.container import Cluster as GkeCluster
from pulumi_gcp.projects import IAMMember
from pulumi_gcp.serviceaccount import Account

from infra.plan.cluster import ClusterPlan, kubeconfig


class Cluster(pulumi.ComponentResource):
    name: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    node_service_account: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        plan: ClusterPlan,
        network_name: pulumi.Input[str],
        subnetwork_name: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("park:gke:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        node_sa = Account(
            f"{name}-nodes",
            account_id=plan.node_service_account_id,
            display_name=f"GKE nodes of {plan.name} (park-gke)",
            opts=child,
        )
        member = node_sa.email.apply(lambda email: f"serviceAccount:{email}")
        for role in plan.node_roles:
            IAMMember(
                f"{name}-nodes-{role.split('/')[1].replace('.', '-')}",
                project=plan.project,
                role=role,
                member=member,
                opts=child,
            )
        args = dict(plan.args)
        args["node_config"] = {**args["node_config"], "service_account": node_sa.email}
        cluster = GkeCluster(
            name, network=network_name, subnetwork=subnetwork_name, **args, opts=child
        )

        self.name = cluster.name
        self.endpoint = cluster.endpoint
        self.node_service_account = node_sa.email
        if plan.dns_endpoint:
            dns = cluster.control_plane_endpoints_config.apply(
                lambda c: c.dns_endpoint_config.endpoint if c and c.dns_endpoint_config else ""
            )
            config = pulumi.Output.all(cluster.name, dns).apply(
                lambda a: kubeconfig(a[0], a[1], None)
            )
        else:
            config = pulumi.Output.all(
                cluster.name, cluster.endpoint, cluster.master_auth.cluster_ca_certificate
            ).apply(lambda a: kubeconfig(a[0], a[1], a[2] or ""))
        self.kubeconfig = pulumi.Output.secret(config)
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
