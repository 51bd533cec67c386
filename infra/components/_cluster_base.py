"""A cluster the node pools and the in-cluster components attach to: what a Cluster (created
here) and an ExistingCluster (looked up) both hand on, declared once.

Pulumi's analyzer publishes the outputs a component class and its bases annotate, so each
output below is in both components' schema, with its description (park_gke.provider reads it
from the base that declares it).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from infra.components._base import Component, ComponentArgsError, bad_value


@dataclass(frozen=True)
class ClusterHandle:
    """What a Cluster or ExistingCluster hands a node pool given it as `cluster`."""

    cluster_id: pulumi.Input[str]  # projects/<project>/locations/<location>/clusters/<name>
    project: str
    location: str
    node_service_account: pulumi.Input[str]


def with_cluster(component: str, name: str, args: Any) -> Any:
    """A pool's args with a Cluster/ExistingCluster given as `cluster` replaced by its id, and
    project, location and node service account taken from it unless given."""
    given = args.get("cluster") if isinstance(args, Mapping) else None
    handle = getattr(given, "handle", None) if isinstance(given, pulumi.Resource) else None
    if not isinstance(handle, ClusterHandle):
        return args
    if args.get("location") not in (None, handle.location):
        refused = bad_value("location", args["location"], f"the cluster is in {handle.location}")
        raise ComponentArgsError(component, name, [refused])
    return {
        "project": handle.project,
        "location": handle.location,
        "node_service_account": handle.node_service_account,
        **{k: v for k, v in args.items() if v is not None},
        "cluster": handle.cluster_id,
    }


class ClusterComponent(Component):
    """A Cluster or ExistingCluster: the outputs the node pools and the in-cluster components
    read from either, and the handle a node pool given it as `cluster` unpacks."""

    name: pulumi.Output[str]
    """The GKE cluster's name."""
    endpoint: pulumi.Output[str]
    """Its control plane's IP endpoint."""
    kubeconfig: pulumi.Output[str]
    """A kubeconfig (secret) for the in-cluster components: gke-gcloud-auth-plugin's, on the
    cluster's DNS endpoint when it has one, else on its IP endpoint (an ExistingCluster's: the
    one given, if any)."""
    node_service_account: pulumi.Output[str]
    """The e-mail of the service account the node pools run as (a pool given the cluster as
    `cluster` takes it)."""
    cluster_id: pulumi.Output[str]
    """projects/<project>/locations/<location>/clusters/<name>: a node pool's `cluster`, which
    then looks in the cluster's project whatever the provider's default project is."""
    project: pulumi.Output[str]
    """The cluster's GCP project."""
    location: pulumi.Output[str]
    """The cluster's zone."""

    def hand_on(
        self,
        project: str,
        location: str,
        name: pulumi.Output[str],
        endpoint: pulumi.Output[str],
        kubeconfig: pulumi.Output[str],
        node_service_account: pulumi.Output[str],
    ) -> None:
        """The outputs above (the kubeconfig kept secret: it may carry a credential), and the
        handle a pool unpacks."""
        self.name = name
        self.endpoint = endpoint
        self.kubeconfig = pulumi.Output.secret(kubeconfig)
        self.node_service_account = node_service_account
        self.cluster_id = name.apply(
            lambda n: f"projects/{project}/locations/{location}/clusters/{n}"
        )
        self.project = pulumi.Output.from_input(project)
        self.location = pulumi.Output.from_input(location)
        self.handle = ClusterHandle(self.cluster_id, project, location, node_service_account)

    def as_argument(self, field: str) -> pulumi.Output[str] | None:
        """Given as another component's `cluster` (Storage waits for it): its id."""
        return self.cluster_id if field == "cluster" else None
