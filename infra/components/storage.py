"""The bucket for checkpoints and models, the image registry, and the workload identity:
a Google service account that holds only bucket-scoped roles and is bound to the Kubernetes
service account through Workload Identity. No service-account keys exist anywhere."""

from __future__ import annotations

import pulumi
from pulumi_gcp.artifactregistry import Repository, RepositoryIamMember
from pulumi_gcp.serviceaccount import Account
from pulumi_gcp.serviceaccount import IAMMember as ServiceAccountIAMMember
from pulumi_gcp.storage import Bucket, BucketIAMMember

from infra.config import StackConfig
from infra.plan.ray import WORKLOAD_KSA

BUCKET_ROLES = ("roles/storage.objectUser",)  # read, write, list, delete objects of this bucket


class Storage(pulumi.ComponentResource):
    bucket: pulumi.Output[str]
    registry_url: pulumi.Output[str]
    workload_service_account: pulumi.Output[str]

    def __init__(
        self,
        name: str,
        config: StackConfig,
        node_service_account: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ):
        super().__init__("park:gcp:Storage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        storage = config.storage

        bucket = Bucket(
            f"{name}-bucket",
            name=config.bucket_name,
            location=(storage.location or config.region).upper(),
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            versioning={"enabled": storage.versioning},
            force_destroy=storage.force_destroy,
            hierarchical_namespace={"enabled": False},
            opts=child,
        )
        registry = Repository(
            f"{name}-registry",
            repository_id=config.registry.repository,
            location=config.region,
            format="DOCKER",
            description="park-gke workload images",
            opts=child,
        )
        RepositoryIamMember(
            f"{name}-registry-nodes-read",
            repository=registry.name,
            location=config.region,
            role="roles/artifactregistry.reader",
            member=pulumi.Output.from_input(node_service_account).apply(
                lambda e: f"serviceAccount:{e}"
            ),
            opts=child,
        )
        gsa = Account(
            f"{name}-workload",
            account_id="park-workload",
            display_name="park-gke Ray workloads (Workload Identity)",
            opts=child,
        )
        member = gsa.email.apply(lambda e: f"serviceAccount:{e}")
        for role in BUCKET_ROLES:
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
            role="roles/iam.workloadIdentityUser",
            member=f"serviceAccount:{config.project}.svc.id.goog[{config.namespace}/{WORKLOAD_KSA}]",
            opts=child,
        )
        self.bucket = bucket.name
        self.registry_url = pulumi.Output.from_input(config.registry_url)
        self.workload_service_account = gsa.email
        self.register_outputs(
            {
                "bucket": self.bucket,
                "registry_url": self.registry_url,
                "workload_service_account": self.workload_service_account,
            }
        )
