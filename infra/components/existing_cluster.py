"""A GKE cluster park-gke did not create: looked up by name and location, checked, and handed
on (its id with project and location, kubeconfig, node service account) to the pools, KubeRay
and the workloads: give a pool the ExistingCluster itself as `cluster`."""

from typing import NotRequired, TypedDict

import pulumi

from infra.components._cluster_base import ClusterComponent
from infra.components._naming import cluster_pool_problems
from infra.components._types import KubeRayInstallArg
from infra.plan import existing_cluster
from infra.plan.cluster import kubeconfig as kubeconfig_for


class ExistingClusterArgs(TypedDict):
    """An existing GKE Standard cluster to add TPU slice pools, KubeRay and Ray workloads to."""

    project: str
    """The cluster's GCP project."""
    location: str
    """The cluster's zone (TPU slice pools are zonal)."""
    name: str
    """The GKE cluster's name."""
    kuberay_install: NotRequired[KubeRayInstallArg]
    """`addon` (GKE Ray Operator add-on, with the TPU webhook) or `helm`. Default: addon."""
    node_service_account: NotRequired[pulumi.Input[str]]
    """The e-mail the new node pools run as (default: the cluster's own node service account)."""
    kubeconfig: NotRequired[pulumi.Input[str]]
    """A kubeconfig to reach it (default: one for gke-gcloud-auth-plugin, on the cluster's DNS
    endpoint when it takes outside traffic, else its IP endpoint)."""


class ExistingCluster(ClusterComponent):
    """An existing cluster, looked up during preview: a cluster without Workload Identity, the
    GCS FUSE driver, the Ray add-on (for kuberay_install addon) or a version TPU v6e needs
    fails the preview, naming the gcloud command that fixes it."""

    version: pulumi.Output[str]
    """The control plane's current version."""
    ray_operator_addon: pulumi.Output[bool]
    """Whether GKE's Ray Operator add-on is enabled."""

    def __init__(
        self, name: str, args: ExistingClusterArgs, opts: pulumi.ResourceOptions | None = None
    ):
        super().__init__(name, opts)
        args = self.checked(args, ExistingClusterArgs)
        install = self.kuberay_install(args)
        from pulumi_gcp.container import get_cluster_output

        given_sa = args.get("node_service_account")
        lookup = get_cluster_output(
            name=args["name"],
            location=args["location"],
            project=args["project"],
            opts=pulumi.InvokeOutputOptions(parent=self),
        )

        def checked(result: object) -> existing_cluster.ClusterFacts:
            facts = existing_cluster.facts_of(result)
            found = existing_cluster.problems(
                facts,
                project=args["project"],
                kuberay_install=install,
                node_service_account=None if given_sa is None else "given",
            )
            # the workloads' pools no TpuSlicePool of the program declares: they must be here
            found += cluster_pool_problems(list(facts.park_pools))
            if found:
                # Raised during preview: every output below (and so every pool, Helm release
                # and workload that uses them) fails with it, before anything is created.
                self.refuse([f"cluster {args['name']!r} in {args['location']}: {p}" for p in found])
            for warning in existing_cluster.warnings(facts):
                pulumi.log.warn(f"cluster {args['name']!r}: {warning}", resource=self)
            return facts

        facts = lookup.apply(checked)
        self.version = facts.apply(lambda f: f.version)
        self.ray_operator_addon = facts.apply(lambda f: f.ray_operator_addon)
        if given_sa is not None:
            node_sa = pulumi.Output.all(facts, given_sa).apply(lambda a: a[1])
        else:
            node_sa = facts.apply(lambda f: f.node_service_account or "")
        if args.get("kubeconfig") is not None:
            config = pulumi.Output.all(facts, args["kubeconfig"]).apply(lambda a: a[1])
        else:
            config = facts.apply(
                lambda f: (
                    kubeconfig_for(f.name, f.dns_endpoint, None)
                    if f.dns_endpoint
                    else kubeconfig_for(f.name, f.endpoint, f.ca_certificate)
                )
            )
        self.hand_on(
            args["project"],
            args["location"],
            name=facts.apply(lambda f: f.name),
            endpoint=facts.apply(lambda f: f.endpoint),
            kubeconfig=config,
            node_service_account=node_sa,
        )
        self.register()
