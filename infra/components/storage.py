"""The bucket, the image registry and the workload identity (infra/plan/storage.py)."""

from __future__ import annotations

import pulumi
from pulumi_gcp.artifactregistry import Repository, RepositoryIamMember
from pulumi_gcp.serviceaccount import Account
from pulumi_gcp.serviceaccount import IAMMember as ServiceAccountIAMMember
from pulumi_gcp.storage import Bucket, BucketIAMMember

from infra.plan.storage import REGISTRY_READER_ROLE, WORKLOAD_IDENTITY_ROLE, StoragePlan


class Storage(pulumi.ComponentResource):
    bucket: pulumi.Output[str]
    registry_url: pulumi.Output[str]
    workload_service_account: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        plan: StoragePlan,
        node_service_account: pulumi.Input[str],
        workload_identity_pool: list[pulumi.Resource],
        opts: pulumi.ResourceOptions | None = None,
    ):
        """`workload_identity_pool`: what creates the project's Workload Identity pool (the
        cluster): a binding to PROJECT.svc.id.goog[ns/ksa] made before it exists fails with
        400 "Identity Pool does not exist" on a project that never had a WI cluster."""
        super().__init__("park:gcp:Storage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        bucket = Bucket(f"{name}-bucket", **plan.bucket, opts=child)
        repository: pulumi.Input[str] = plan.registry["repository_id"]
        if plan.create_registry:
            repository = Repository(f"{name}-registry", **plan.registry, opts=child).name
        RepositoryIamMember(
            f"{name}-registry-nodes-read",
            repository=repository,
            location=plan.registry["location"],
            role=REGISTRY_READER_ROLE,
            member=pulumi.Output.from_input(node_service_account).apply(
                lambda e: f"serviceAccount:{e}"
            ),
            opts=child,
        )
        gsa = Account(f"{name}-workload", **plan.workload_account, opts=child)
        member = gsa.email.apply(lambda e: f"serviceAccount:{e}")
        for role in plan.bucket_roles:
            BucketIAMMember(
                f"{name}-workload-{role.split('.')[-1]}",
                bucket=bucket.name,
                role=role,
                member=member,
                opts=child,
            )
        ServiceAccountIAMMember(
            f"{name}-workload-identity",
            service_account_id=gsa.name,
            role=WORKLOAD_IDENTITY_ROLE,
            member=plan.workload_identity_member,
            opts=pulumi.ResourceOptions(parent=self, depends_on=workload_identity_pool),
        )
        self.bucket = bucket.name
        self.registry_url = pulumi.Output.from_input(plan.registry_url)
        self.workload_service_account = gsa.email
        self.register_outputs(
            {
                "bucket": self.bucket,
                "registry_url": self.registry_url,
                "workload_service_account": self.workload_service_account,
            }
        )
