"""The bucket for checkpoints and models, the image registry, and the workload identity: a
Google service account that holds only bucket-scoped roles, bound to the Ray pods' Kubernetes
service account through Workload Identity. No service-account keys exist anywhere."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.resolve import StackPlan

# The workload identity's roles on the bucket, and nothing beyond it. objectUser: read, write,
# list, delete objects. legacyBucketReader adds the one call objectUser lacks: the bucket's
# metadata (storage.buckets.get), which pyarrow's create_dir reads on a bucket with no folder
# marker yet and Ray Train's storage calls create_dir on its storage path: without it the first
# run on a fresh bucket fails with 403 (GKE's Ray-on-TPU sample grants the same role for it).
# Which calls each workload makes is recorded in infra/data/bucket_ledger.yaml (infra.storage_iam).
BUCKET_ROLES = ("roles/storage.objectUser", "roles/storage.legacyBucketReader")
REGISTRY_READER_ROLE = "roles/artifactregistry.reader"
WORKLOAD_IDENTITY_ROLE = "roles/iam.workloadIdentityUser"


@dataclass(frozen=True)
class StoragePlan:
    bucket: dict[str, Any]  # storage.Bucket arguments
    registry: dict[str, Any]  # artifactregistry.Repository arguments
    create_registry: bool  # false: the repository exists already (shared by several stacks)
    registry_url: str
    workload_account: dict[str, Any]  # serviceaccount.Account arguments
    bucket_roles: tuple[str, ...]
    workload_identity_member: str  # the Ray pods' principal: PROJECT.svc.id.goog[ns/ksa]


def storage(plan: StackPlan) -> StoragePlan:
    spec, names = plan.spec, plan.names
    return StoragePlan(
        bucket={
            "name": names.bucket,
            "location": (spec.storage.location or spec.region).upper(),
            "uniform_bucket_level_access": True,
            "public_access_prevention": "enforced",
            "versioning": {"enabled": spec.storage.versioning},
            "force_destroy": spec.storage.force_destroy,
            "hierarchical_namespace": {"enabled": False},
        },
        registry={
            "repository_id": names.registry_repository,
            "location": spec.region,
            "format": "DOCKER",
            "description": "park-gke workload images",
        },
        create_registry=spec.registry.create,
        registry_url=names.registry_url,
        workload_account={
            "account_id": names.workload_service_account_id,
            "display_name": "park-gke Ray workloads (Workload Identity)",
        },
        bucket_roles=BUCKET_ROLES,
        workload_identity_member=names.workload_identity_member,
    )
