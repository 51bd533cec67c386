"""The Google APIs a stack calls, enabled by the program before anything that needs them.

A new project has these switched off: the first create of a cluster, a bucket or a service
account fails with SERVICE_DISABLED until its API is on. The stack program enables each one
it needs (`gcp.projects.Service`, infra/components/project.py) first, and every other
component waits for them. `disable_on_destroy` stays off: a `pulumi destroy` of one stack must
not switch off an API another stack or team in the project relies on.

Two APIs cannot be enabled this way: Service Usage, which enables the others, and Cloud
Resource Manager, through which pulumi-gcp reads the project right after enabling each API
(terraform-provider-google #6101, #11435). README's deploy section and `park validate` name
both as the prerequisite, with the one command that enables them.

An API just enabled answers SERVICE_DISABLED for a while (the Terraform FAQ: "wait a few
minutes"; Google's own configurations sleep 60-120 s): the program waits `API_SETTLE_S` once
after enabling, and again only when the list of APIs changes, before anything uses them.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.resolve import StackPlan

# How long `up` waits after enabling the APIs, before their first use (a pulumiverse-time
# Sleep, on create only: a second `up` with the same APIs does not wait).
API_SETTLE_S = 90


@dataclass(frozen=True)
class Api:
    """One API the stack calls, and the part of the stack that calls it (for `park validate`)."""

    service: str  # e.g. container.googleapis.com
    why: str


# Which API creates each kind of GCP resource the program declares: the render cross-check
# (tests/infra/test_day_one.py) holds every declared resource to an API the plan enables.
API_OF_TYPE: tuple[tuple[str, str], ...] = (
    ("gcp:compute/", "compute.googleapis.com"),
    ("gcp:container/", "container.googleapis.com"),
    ("gcp:serviceaccount/", "iam.googleapis.com"),
    ("gcp:projects/iAMMember:", "cloudresourcemanager.googleapis.com"),
    ("gcp:projects/service:", "serviceusage.googleapis.com"),
    ("gcp:storage/", "storage.googleapis.com"),
    ("gcp:artifactregistry/", "artifactregistry.googleapis.com"),
    ("docker-build:index:Image", "artifactregistry.googleapis.com"),
    ("gcp:logging/", "logging.googleapis.com"),
    ("gcp:monitoring/", "monitoring.googleapis.com"),
    ("gcp:iap/", "iap.googleapis.com"),
)


def api_of_type(type_token: str) -> str | None:
    """The API that serves a resource type, or None for one that is not a Google resource."""
    return next((api for prefix, api in API_OF_TYPE if type_token.startswith(prefix)), None)


def apis(plan: StackPlan) -> tuple[Api, ...]:
    """The APIs the stack calls, in the order a reader meets them."""
    spec = plan.spec
    found = [
        Api("compute.googleapis.com", "network, Cloud NAT, node VMs"),
        Api("container.googleapis.com", "the GKE cluster and its node pools"),
        Api("iam.googleapis.com", "the nodes' and the workloads' service accounts"),
        # The KSA -> GSA token exchange of Workload Identity (GKE's metadata server calls it).
        Api("iamcredentials.googleapis.com", "Workload Identity tokens for the Ray pods"),
        Api("cloudresourcemanager.googleapis.com", "the nodes' project roles"),
        Api("storage.googleapis.com", "the bucket (checkpoints, staged models, exports)"),
        Api("artifactregistry.googleapis.com", "the image registry, builds and pulls"),
        # The cluster's logging_config and managed Prometheus write here from the first node.
        Api("logging.googleapis.com", "cluster and workload logs, log-based metrics"),
        Api("monitoring.googleapis.com", "managed Prometheus and the nodes' metrics"),
    ]
    if spec.observability.expose_dashboard:
        found.append(Api("iap.googleapis.com", "the IAP-protected Ray dashboard"))
    return tuple(found)
