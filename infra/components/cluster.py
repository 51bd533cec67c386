"""The GKE Standard cluster and its minimal node service account."""

from dataclasses import dataclass
from typing import NotRequired, TypedDict

import pulumi
from pulumi_gcp.compute import Firewall
from pulumi_gcp.container import Cluster as GkeCluster
from pulumi_gcp.projects import IAMMember
from pulumi_gcp.serviceaccount import Account

from infra.components._base import bad_value, site_values, stack_of, stack_values
from infra.components._cluster_base import ClusterComponent
from infra.components._naming import claim
from infra.components._posture import ACKNOWLEDGE_FIELD
from infra.components._types import ReleaseChannelArg
from infra.names import service_account_member
from infra.plan.cluster import ClusterPlan, cluster, kubeconfig, webhook_firewall


class AuthorizedNetworkArgs(TypedDict):
    """A range allowed to reach the control plane's IP endpoint."""

    cidr: str
    """A range allowed to reach the control plane, e.g. `203.0.113.0/24` (never `0.0.0.0/0`)."""
    name: NotRequired[str]
    """A label for it. Default: authorized."""


class ControlPlanePortArgs(TypedDict):
    """A port on the nodes the control plane calls: an admission webhook or an aggregated API
    server of something installed in the cluster (the pod's port, the Service's targetPort)."""

    port: int
    """The TCP port, e.g. 9443 (Kueue's webhooks)."""
    component: NotRequired[str]
    """What listens there, named in the rule's description, e.g. kueue."""


class ClusterArgs(TypedDict):
    """A GKE Standard cluster for Ray on TPU: private nodes, Workload Identity, Dataplane V2,
    GCS FUSE, Managed Prometheus, a release channel, and a node service account of its own."""

    project: str
    """The GCP project."""
    location: str
    """The zone of the cluster (and of its TPU pools)."""
    network: pulumi.Input[str]
    """The network it joins (Network.network_name, or an existing network's name)."""
    subnetwork: pulumi.Input[str]
    """Its subnet, carrying the pods and services secondary ranges."""
    stack: NotRequired[str]
    """Names derive from it (park-<stack>-nodes, ...); default: the Pulumi stack's name."""
    name: NotRequired[str]
    """GKE cluster name (default `park-<stack>`)."""
    release_channel: NotRequired[ReleaseChannelArg]
    """RAPID, REGULAR, STABLE or EXTENDED; upgrades the cluster. Default: REGULAR."""
    version: NotRequired[str]
    """Unset: the channel's default. A pin (`1.35`) is the initial version."""
    dns_endpoint: NotRequired[bool]
    """DNS-based control-plane endpoint (IAM); the kubeconfig uses it. Default: true."""
    private_nodes: NotRequired[bool]
    """Nodes without public IPs (egress through Cloud NAT). Default: true."""
    private_endpoint: NotRequired[bool]
    """Control plane reachable only from the VPC. Default: false."""
    master_authorized_networks: NotRequired[list[AuthorizedNetworkArgs]]
    """`[{cidr, name}]` allowed to reach the control plane."""
    master_cidr: NotRequired[str]
    """/28 of the private control plane. Default: 172.16.0.0/28."""
    pods_range_name: NotRequired[str]
    """Name of the pods secondary range. Default: pods."""
    services_range_name: NotRequired[str]
    """Name of the services secondary range. Default: services."""
    deletion_protection: NotRequired[bool]
    """Refuse `pulumi destroy` of the cluster. Default: true."""
    ray_operator_addon: NotRequired[bool]
    """Enable GKE's Ray Operator add-on (KubeRay and its TPU webhook; default true)."""
    ray_logging: NotRequired[bool]
    """Ray add-on: Ray logs to Cloud Logging. Default: false."""
    ray_monitoring: NotRequired[bool]
    """Ray add-on: Ray metrics to Managed Prometheus. Default: false."""
    gateway_api: NotRequired[bool]
    """Enable the Gateway API (for the IAP dashboard)."""
    control_plane_ports: NotRequired[list[ControlPlanePortArgs]]
    """Ports the control plane must reach on private nodes for what you install in the cluster
    (webhooks, aggregated APIs). GKE's own rule admits 443 and 10250 only; the others get a
    firewall rule from the control-plane range to the nodes' service account. The stack
    program passes those of the charts it installs (Kueue: 9443, 8082)."""
    acknowledge_public: NotRequired[list[str]]
    """Exposures meant to be public (control-plane, nodes), as park:policy.acknowledgePublic: a
    production cluster (a prod* stack, or deletion_protection given) with its control plane open
    to the internet or public nodes is refused unless named here; elsewhere a warning."""


# The arguments that are park:cluster's and park:network's fields of the same name.
CLUSTER_FIELDS = (
    "release_channel",
    "version",
    "dns_endpoint",
    "private_nodes",
    "private_endpoint",
    "deletion_protection",
)
CLUSTER_NETWORK_FIELDS = ("master_cidr", "pods_range_name", "services_range_name")


# The cluster's arguments GKE answers with something else than what was sent, ignored after
# create. `nodeConfig` shapes only the default pool, which lives between create and its
# removal (remove_default_node_pool); it is sent so that pool runs as the nodes' own service
# account, not the Compute Engine default one (which an org policy may have disabled). Once it
# is gone GKE reports the *first node pool's* config as the cluster's nodeConfig (container.v1
# Cluster.nodeConfig: "For responses, ... the node configuration of the first node pool"):
# the CPU pool's machine type, labels, disk, ... against our two fields, a diff at every `up`
# that the provider may plan as a replacement of the cluster.
READ_BACK_ONLY = ("nodeConfig",)


@dataclass(frozen=True)
class ClusterSite:
    """Where a cluster stands and what reaches it: its zone, its network and subnet, whether
    it serves the Gateway API, and the node ports its control plane calls ((port, component))."""

    location: str
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str]
    gateway_api: bool
    control_plane_ports: list[tuple[int, str]]


class Cluster(ClusterComponent):
    """A GKE Standard cluster ready for TPU slice pools and KubeRay."""

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(name, opts)
        args = self.checked(args, ClusterArgs)
        authorized = [
            {"cidr": n["cidr"], **({"name": n["name"]} if n.get("name") else {})}
            for n in args.get("master_authorized_networks") or []
        ]
        addon = args.get("ray_operator_addon", True)
        values = {
            **site_values(args["project"], args["location"]),
            "park:cluster": {
                **stack_values(args, "name", *CLUSTER_FIELDS),
                **({"masterAuthorizedNetworks": authorized} if authorized else {}),
            },
            "park:network": stack_values(args, *CLUSTER_NETWORK_FIELDS),
            "park:kuberay": {
                "install": "addon" if addon else "helm",
                **({"logging": args["ray_logging"]} if "ray_logging" in args else {}),
                **({"monitoring": args["ray_monitoring"]} if "ray_monitoring" in args else {}),
            },
            # deletion_protection is the caller's choice here, whatever the stack is called
            "park:policy": {
                "enforcement": {"deletion-protection-prod": "advisory"},
                **stack_values(args, "acknowledge_public"),
            },
        }
        fields = [
            ACKNOWLEDGE_FIELD,  # posture: infra.components._posture
            ("park:cluster.", ""),
            ("park:network.", ""),
            ("park:kuberay.", "ray_"),
            ("park:zone", "location"),
            ("gcp:", ""),
        ]
        plan = cluster(self.plan(values, fields, stack=stack_of(args)))
        ports = args.get("control_plane_ports") or []
        bad_ports = [
            bad_value(f"control_plane_ports[{i}].port", p["port"], "a TCP port, 1 to 65535")
            for i, p in enumerate(ports)
            if not 1 <= p["port"] <= 65535
        ]
        if bad_ports:
            self.refuse(bad_ports)
        site = ClusterSite(
            args["location"],
            args["network"],
            args["subnetwork"],
            bool(args.get("gateway_api")),
            [(p["port"], p.get("component", "")) for p in ports],
        )
        self._build(plan, site)

    @classmethod
    def of_plan(
        cls,
        name: str,
        plan: ClusterPlan,
        site: ClusterSite,
        opts: pulumi.ResourceOptions | None = None,
    ) -> "Cluster":
        """The stack program's: its plan's cluster (infra.plan.cluster), in its network, with
        the ports of what the stack installs (infra.plan.cluster.control_plane_ports)."""
        self = cls.planned(name, opts)
        self._build(plan, site)
        return self

    def _build(self, plan: ClusterPlan, site: ClusterSite) -> None:
        name = self._component_name
        location, network = site.location, site.network
        cluster_args = dict(plan.args)
        if site.gateway_api:
            cluster_args["gateway_api_config"] = {"channel": "CHANNEL_STANDARD"}
        owner, project = self.owner, plan.project
        taken = [
            claim(owner, f"GKE cluster {plan.name}", (project, location)),
            claim(owner, f"service account {plan.node_service_account_id}", (project,)),
        ]
        self.refuse_taken("name", plan.name, taken)
        child = self.child_options()

        node_sa = Account(
            f"{name}-nodes",
            project=project,
            account_id=plan.node_service_account_id,
            display_name=f"GKE nodes of {plan.name} (park-gke)",
            opts=child,
        )
        member = node_sa.email.apply(service_account_member)
        for role in plan.node_roles:
            IAMMember(
                f"{name}-nodes-{role.split('/')[1].replace('.', '-')}",
                project=plan.project,
                role=role,
                member=member,
                opts=child,
            )
        cluster_args["node_config"] = {
            **cluster_args["node_config"],
            "service_account": node_sa.email,
        }
        resource = GkeCluster(
            name,
            project=project,
            network=network,
            subnetwork=site.subnetwork,
            **cluster_args,
            opts=pulumi.ResourceOptions.merge(
                child, pulumi.ResourceOptions(ignore_changes=list(READ_BACK_ONLY))
            ),
        )

        self._ready: list[pulumi.Resource] = [resource]
        firewall = webhook_firewall(
            plan.name,
            plan.args["private_cluster_config"]["master_ipv4_cidr_block"],
            plan.args["private_cluster_config"]["enable_private_nodes"],
            site.control_plane_ports,
        )
        if firewall is not None:
            # Named after the component, in the cluster's network, onto the nodes' service
            # account (every pool of the cluster runs as it; GKE's own rule targets a tag).
            self._ready.append(
                Firewall(
                    f"{name}-webhooks",
                    project=project,
                    network=network,
                    target_service_accounts=[node_sa.email],
                    **firewall,
                    opts=child,
                )
            )

        if plan.dns_endpoint:
            dns = resource.control_plane_endpoints_config.apply(
                lambda c: c.dns_endpoint_config.endpoint if c and c.dns_endpoint_config else ""
            )
            config = pulumi.Output.all(resource.name, dns).apply(
                lambda a: kubeconfig(a[0], a[1], None)
            )
        else:
            config = pulumi.Output.all(
                resource.name, resource.endpoint, resource.master_auth.cluster_ca_certificate
            ).apply(lambda a: kubeconfig(a[0], a[1], a[2] or ""))
        self._cluster = resource
        self.hand_on(project, location, resource.name, resource.endpoint, config, node_sa.email)
        self.register()

    @property
    def resource(self) -> GkeCluster:
        """The container.Cluster itself (what the identity pool and node pools wait for)."""
        return self._cluster

    @property
    def ready(self) -> list[pulumi.Resource]:
        """The cluster and the firewall rule to its webhooks: what in-cluster objects wait for."""
        return list(self._ready)
