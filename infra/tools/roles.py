"""The IAM roles CI's two identities need, derived from what each stack declares.

`park-deploy` runs `pulumi up`: for every resource type a stack's render registers, the
predefined role that may create, update and delete it (DEPLOY_ROLES; a type no row covers
fails the test that renders every shipped stack, so a new kind of resource cannot ship without
its role). `park-preview` runs `pulumi preview`: reading is enough (PREVIEW_ROLES). The
Kubernetes provider previews with a server-side dry run, which needs `patch`; without it,
pulumi-kubernetes falls back to a client-side diff (pulumi-kubernetes PR 2419, issue 3067), so
read access inside the cluster suffices.

README's role list and setup script are generated from `deploy_roles` over the shipped stacks
(infra/tools/docs.py), never written by hand.
"""

from __future__ import annotations

from collections.abc import Iterable

# (resource type prefix, roles that create it), most specific first.
DEPLOY_ROLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("gcp:projects/service:", ("roles/serviceusage.serviceUsageAdmin",)),
    ("gcp:projects/iAMMember:", ("roles/resourcemanager.projectIamAdmin",)),
    # firewall rules and SSL certificates are outside compute.networkAdmin
    ("gcp:compute/firewall:", ("roles/compute.securityAdmin",)),
    ("gcp:compute/managedSslCertificate:", ("roles/compute.loadBalancerAdmin",)),
    # TPU7x workload policies: compute.resourcePolicies.* is in instanceAdmin.v1, not in
    # networkAdmin (infra/data/compute_roles.yaml)
    ("gcp:compute/resourcePolicy:", ("roles/compute.instanceAdmin.v1",)),
    ("gcp:compute/", ("roles/compute.networkAdmin",)),
    # a cluster and node pools that run as a service account need actAs on it
    ("gcp:container/", ("roles/container.admin", "roles/iam.serviceAccountUser")),
    ("gcp:serviceaccount/", ("roles/iam.serviceAccountAdmin",)),
    ("gcp:storage/", ("roles/storage.admin",)),
    ("gcp:artifactregistry/", ("roles/artifactregistry.admin",)),
    ("docker-build:index:Image", ("roles/artifactregistry.writer",)),
    ("gcp:logging/", ("roles/logging.configWriter",)),
    ("gcp:monitoring/", ("roles/monitoring.editor",)),
    ("gcp:iap/", ("roles/iap.admin",)),
    # namespaces, CRDs (Helm), RBAC and custom resources inside the cluster
    ("kubernetes:", ("roles/container.admin",)),
)
# Types that create nothing in the cloud: the program's components and its providers.
NO_ROLE = ("park-gke:", "pulumi:providers:", "time:")  # time: a wait, on the deployer
PREVIEW_ROLES = ("roles/viewer", "roles/container.viewer")


class UnknownType(LookupError):
    """A resource type no row of DEPLOY_ROLES covers."""


def roles_of_type(type_token: str) -> tuple[str, ...]:
    if type_token.startswith(NO_ROLE):
        return ()
    for prefix, roles in DEPLOY_ROLES:
        if type_token.startswith(prefix):
            return roles
    raise UnknownType(f"{type_token}: which role creates it? (infra/tools/roles.py)")


def deploy_roles(types: Iterable[str]) -> tuple[str, ...]:
    """The roles that let `pulumi up` create every resource type given, sorted."""
    return tuple(sorted({role for t in types for role in roles_of_type(t)}))
