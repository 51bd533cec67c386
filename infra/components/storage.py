"""The bucket, the image registry and the workload identity (infra/plan/storage.py)."""

from typing import NotRequired, TypedDict

import pulumi
from pulumi_gcp.artifactregistry import Repository, RepositoryIamMember
from pulumi_gcp.serviceaccount import Account
from pulumi_gcp.serviceaccount import IAMMember as ServiceAccountIAMMember
from pulumi_gcp.storage import Bucket, BucketIAMMember

from infra.components._base import Component, site_values, stack_of, stack_values
from infra.components._handles import ClusterRef
from infra.components._naming import claim
from infra.names import service_account_member
from infra.plan.storage import (
    REGISTRY_READER_ROLE,
    WORKLOAD_IDENTITY_ROLE,
    StoragePlan,
    storage,
)


class StorageArgs(TypedDict):
    """A bucket for checkpoints and models, an image registry, and a workload service account
    holding roles on that bucket only, bound to the Ray pods' KSA through Workload Identity."""

    project: str
    """The GCP project."""
    region: str
    """Region of the registry (and the bucket, unless bucket_location)."""
    node_service_account: pulumi.Input[str]
    """The nodes' service account e-mail: it may pull images from the registry."""
    cluster: NotRequired[ClusterRef]
    """A cluster with Workload Identity in this project (its name or id; in Python, the Cluster
    or ExistingCluster itself): the binding waits for it, because the project's identity pool
    exists only once such a cluster does."""
    stack: NotRequired[str]
    """Names derive from it (park-<stack>-workload, ...); default: the Pulumi stack's name."""
    namespace: NotRequired[str]
    """Kubernetes namespace of the Ray workloads. Default: park."""
    bucket: NotRequired[str]
    """Bucket name (default `<project>-<stack>-park`)."""
    bucket_location: NotRequired[str]
    """Bucket location (default: the region)."""
    versioning: NotRequired[bool]
    """Object versioning. Default: true."""
    force_destroy: NotRequired[bool]
    """Let `pulumi destroy` delete a non-empty bucket. Default: false."""
    repository: NotRequired[str]
    """Repository id (default `park-<stack>`)."""
    create_repository: NotRequired[bool]
    """`false`: use an existing repository, e.g. one stacks share. Default: true."""


class Storage(Component):
    """Bucket, registry and workload identity of one stack."""

    bucket: pulumi.Output[str]
    """The bucket's name."""
    registry_url: pulumi.Output[str]
    """Where the workload images go: <region>-docker.pkg.dev/<project>/<repository>."""
    workload_service_account: pulumi.Output[str]
    """The e-mail of the Google service account the Ray pods act as."""

    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(name, opts)
        args = self.checked(args, StorageArgs)
        values = {
            **site_values(args["project"], f"{args['region']}-b"),
            "park:storage": {
                **stack_values(args, "bucket", "versioning", "force_destroy"),
                **({"location": args["bucket_location"]} if args.get("bucket_location") else {}),
            },
            "park:registry": {
                **stack_values(args, "repository"),
                **({"create": args["create_repository"]} if "create_repository" in args else {}),
            },
            "park:policy": {"enforcement": {"deletion-protection-prod": "advisory"}},
        }
        if args.get("namespace"):
            values["park:namespace"] = args["namespace"]
        fields = [("park:storage.", ""), ("park:registry.", ""), ("park:namespace", "namespace")]
        stack = stack_of(args)
        plan = storage(self.plan(values, fields, stack=stack))
        self._build(plan, args["project"], stack, args["node_service_account"], args.get("cluster"))

    @classmethod
    def of_plan(
        cls,
        name: str,
        plan: StoragePlan,
        project: str,
        stack: str,
        node_service_account: pulumi.Input[str],
        cluster: pulumi.Input[str] | None,
        opts: pulumi.ResourceOptions | None = None,
    ) -> "Storage":
        """The stack program's: its plan's bucket, registry and identity (infra.plan.storage)."""
        self = cls.planned(name, opts)
        self._build(plan, project, stack, node_service_account, cluster)
        return self

    def _build(
        self,
        plan: StoragePlan,
        project: str,
        stack: str,
        node_service_account: pulumi.Input[str],
        cluster: pulumi.Input[str] | None,
    ) -> None:
        name, owner = self._component_name, self.owner
        taken = [
            claim(owner, f"bucket {plan.bucket['name']}", ()),
            claim(owner, f"service account {plan.workload_account['account_id']}", (project,)),
        ]
        if plan.create_registry:
            repository_id = plan.registry["repository_id"]
            where = (project, plan.registry["location"])
            taken.append(claim(owner, f"registry repository {repository_id}", where))
        self.refuse_taken("stack", stack, taken)
        child = self.child_options()

        bucket = Bucket(f"{name}-bucket", project=project, **plan.bucket, opts=child)
        repository: pulumi.Input[str] = plan.registry["repository_id"]
        # What an image push needs and nothing more (not the bucket's Workload Identity
        # binding, which waits for the cluster): the build starts with the cluster.
        self.registry_ready: list[pulumi.Resource] = []
        if plan.create_registry:
            created = Repository(f"{name}-registry", project=project, **plan.registry, opts=child)
            repository = created.name
            self.registry_ready.append(created)
        nodes_read = RepositoryIamMember(
            f"{name}-registry-nodes-read",
            project=project,
            repository=repository,
            location=plan.registry["location"],
            role=REGISTRY_READER_ROLE,
            member=pulumi.Output.from_input(node_service_account).apply(service_account_member),
            opts=child,
        )
        self.registry_ready.append(nodes_read)
        gsa = Account(f"{name}-workload", project=project, **plan.workload_account, opts=child)
        member = gsa.email.apply(service_account_member)
        for role in plan.bucket_roles:
            BucketIAMMember(
                f"{name}-workload-{role.split('.')[-1]}",
                bucket=bucket.name,
                role=role,
                member=member,
                opts=child,
            )
        # The binding needs the project's Workload Identity pool: it waits for the cluster.
        after_cluster = [cluster] if cluster is not None else []
        ServiceAccountIAMMember(
            f"{name}-workload-identity",
            service_account_id=gsa.name,
            role=WORKLOAD_IDENTITY_ROLE,
            member=pulumi.Output.all(plan.workload_identity_member, *after_cluster).apply(
                lambda values: values[0]
            ),
            opts=child,
        )
        self._bucket = plan.bucket["name"]
        self.bucket = bucket.name
        self.registry_url = pulumi.Output.from_input(plan.registry_url)
        self.workload_service_account = gsa.email
        self.register()

    def as_argument(self, field: str) -> str | None:
        """Given as a workload's `bucket`: the bucket's name."""
        return self._bucket if field == "bucket" else None
