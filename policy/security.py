"""Security rules: identities without keys, private nodes, a private bucket, least-privilege
workload roles, no public Ray endpoint without the stack's flag, no secret in plain text."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from functools import wraps
from typing import Any

import yaml
from pulumi_policy import (
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    StackValidationArgs,
)

from infra.names import EXPOSE_DASHBOARD_ANNOTATION, EXPOSE_SERVE_ANNOTATION
from infra.rules.security import Exposure, open_to_everyone, posture_verdict
from infra.schema import secrets
from infra.schema.safe import load_yaml
from infra.tools.manifests.pods import containers, hardening_problems
from policy._props import get, is_true, items, mapping, stack_of, strings
from policy.kuberay import kind_of, templates
from policy.tpu import NODE_POOL

CLUSTER = "gcp:container/cluster:Cluster"
BUCKET = "gcp:storage/bucket:Bucket"
BUCKET_IAM = (
    "gcp:storage/bucketIAMMember:BucketIAMMember",
    "gcp:storage/bucketIAMBinding:BucketIAMBinding",
)
SA_KEY = "gcp:serviceaccount/key:Key"
GCP_PROVIDER = "pulumi:providers:gcp"
WORKLOAD_IDENTITY_USER = "roles/iam.workloadIdentityUser"
PUBLIC_MEMBERS = ("allUsers", "allAuthenticatedUsers")
# What a workload may do in its own bucket: read, create, or both, and read the bucket's own
# metadata (legacyBucketReader: storage.buckets.get and objects.list, which pyarrow's create_dir
# and so Ray Train's storage need on a fresh bucket). Not admin, not IAM.
BUCKET_OBJECT_ROLES = (
    "roles/storage.objectViewer",
    "roles/storage.objectCreator",
    "roles/storage.objectUser",
    "roles/storage.legacyBucketReader",
)
_DEFAULT_COMPUTE_SA = re.compile(r"^\d+-compute@developer\.gserviceaccount\.com$")
_INTERNAL_LB = "networking.gke.io/load-balancer-type"


def is_iam_grant(resource_type: str) -> bool:
    """IAM member / binding / policy resources of any GCP service."""
    leaf = resource_type.rsplit(":", 1)[-1].lower()
    return resource_type.startswith("gcp:") and any(
        leaf.endswith(s) for s in ("iammember", "iambinding", "iampolicy")
    )


def members_of(props: Mapping[str, Any]) -> list[str]:
    found = [props["member"]] if isinstance(props.get("member"), str) else []
    found += [m for m in items(props.get("members")) if isinstance(m, str)]
    policy_data = props.get("policyData")
    if isinstance(policy_data, str):
        found += re.findall(r'"((?:allUsers|allAuthenticatedUsers|[a-zA-Z]+:[^"]+))"', policy_data)
    return found


def prod_like(args_urn: str, config: Mapping[str, Any], override: bool | None) -> bool:
    """Explicit override, else the policy's `prodLike` config, else "the stack is prod*"."""
    if override is not None:
        return override
    if isinstance(config.get("prodLike"), bool):
        return bool(config["prodLike"])
    return stack_of(args_urn).startswith("prod")


# ---------------------------------------------------------------------------------------------
# Identity


def gke_workload_identity(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """Pods get Google credentials through Workload Identity only: the cluster has a workload
    pool and every node pool serves the GKE metadata server (never the node's identity)."""
    if args.resource_type == CLUSTER:
        pool = get(args.props, "workloadIdentityConfig.workloadPool")
        if not (isinstance(pool, str) and pool.endswith(".svc.id.goog")):
            report_violation(
                f"cluster {args.name}: set workloadIdentityConfig.workloadPool to "
                f"'<project>.svc.id.goog' (got {pool!r})",
                None,
            )
    if args.resource_type == NODE_POOL:
        mode = get(args.props, "nodeConfig.workloadMetadataConfig.mode")
        if mode != "GKE_METADATA":
            report_violation(
                f"node pool {args.name}: nodeConfig.workloadMetadataConfig.mode is {mode!r}; "
                "set GKE_METADATA so pods cannot read the node's credentials",
                None,
            )


def no_service_account_keys(
    args: ResourceValidationArgs, report_violation: ReportViolation
) -> None:
    """Keys are long-lived secrets that leak; Workload Identity (and OIDC in CI) replace them."""
    if args.resource_type == SA_KEY:
        report_violation(
            f"{args.name}: service-account keys are not allowed; use Workload Identity for "
            "pods and Workload Identity Federation (OIDC) for CI",
            None,
        )
    if args.resource_type == GCP_PROVIDER:
        for key in ("credentials", "accessToken"):
            if args.props.get(key):
                report_violation(
                    f"provider {args.name}: '{key}' holds a static credential; let the provider "
                    "use Application Default Credentials (OIDC in CI)",
                    None,
                )


def node_sa_not_default(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """Nodes run as a minimal service account; the default compute SA holds project Editor."""
    if args.resource_type not in (CLUSTER, NODE_POOL):
        return
    account = get(args.props, "nodeConfig.serviceAccount")
    if not account or account == "default" or _DEFAULT_COMPUTE_SA.match(str(account)):
        report_violation(
            f"{args.name}: nodeConfig.serviceAccount is {account or 'unset'!r}; nodes must run "
            "as a dedicated, minimal service account, not the default compute one",
            None,
        )


# ---------------------------------------------------------------------------------------------
# Network


Judge = Callable[..., None]  # judge(exposure, what, strict=False): report what posture refuses


def _posture_policy(
    check: Callable[[ResourceValidationArgs, ReportViolation, Judge], None],
) -> Callable[..., None]:
    """A policy judging exposures as `park validate` does (infra.rules.security.posture_verdict),
    by the stack's production marker and acknowledgements (policy/rules.py binds them)."""

    @wraps(check)
    def policy(
        args: ResourceValidationArgs,
        report_violation: ReportViolation,
        *,
        production: bool | None = None,
        acknowledged: frozenset[str] = frozenset(),
    ) -> None:
        def judge(exposure: Exposure, what: str, *, strict: bool = False) -> None:
            prod = prod_like(args.urn, args.get_config(), production) or strict
            verdict = posture_verdict(exposure, what, production=prod, acknowledged=acknowledged)
            if verdict.refused:
                report_violation(f"{args.name}: {verdict.message}", None)

        check(args, report_violation, judge)

    return policy


@_posture_policy
def gke_private_nodes(
    args: ResourceValidationArgs, report_violation: ReportViolation, judge: Judge
) -> None:
    """Nodes without public IPs; the control plane not open to the whole internet (refused
    on production stacks unless acknowledged; a range of everyone refused on every stack)."""
    if args.resource_type not in (NODE_POOL, CLUSTER):
        return
    if args.resource_type == NODE_POOL:
        if get(args.props, "networkConfig.enablePrivateNodes") is False:
            judge("nodes", "node pool: networkConfig.enablePrivateNodes is false (public IPs)")
        return
    if not is_true(get(args.props, "privateClusterConfig.enablePrivateNodes")):
        judge(
            "nodes",
            "cluster: nodes get public IPs (set privateClusterConfig.enablePrivateNodes true)",
        )
    blocks = list(items(get(args.props, "masterAuthorizedNetworksConfig.cidrBlocks")))
    cidrs = [str(get(b, "cidrBlock")) for b in blocks]
    if open_to_everyone(cidrs):  # judged together, as `park validate` does
        judge(
            "control-plane",
            f"cluster: master authorized networks {', '.join(cidrs)} open the control plane "
            "to everyone",
            strict=True,
        )
    elif not blocks and not is_true(get(args.props, "privateClusterConfig.enablePrivateEndpoint")):
        judge(
            "control-plane",
            "cluster: no master authorized networks and no private endpoint: the control "
            "plane's public IP accepts connections from the whole internet",
        )


# ---------------------------------------------------------------------------------------------
# Storage and IAM


def bucket_uniform_access(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """IAM only (no per-object ACLs to audit) and public access prevented at the bucket."""
    if args.resource_type != BUCKET:
        return
    if not is_true(args.props.get("uniformBucketLevelAccess")):
        report_violation(f"bucket {args.name}: set uniformBucketLevelAccess true", None)
    if args.props.get("publicAccessPrevention") != "enforced":
        report_violation(
            f"bucket {args.name}: set publicAccessPrevention 'enforced' (got "
            f"{args.props.get('publicAccessPrevention')!r})",
            None,
        )


def no_public_iam_members(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """Nothing in this stack is granted to allUsers or allAuthenticatedUsers."""
    if not is_iam_grant(args.resource_type):
        return
    for member in members_of(args.props):
        if member in PUBLIC_MEMBERS:
            report_violation(
                f"{args.name}: grants {args.props.get('role', 'a role')!r} to {member}; public "
                "members are not allowed",
                None,
            )


def workload_service_accounts(resources: list[PolicyResource]) -> set[str]:
    """Emails of the Google service accounts that Kubernetes service accounts impersonate."""
    emails = set()
    for r in resources:
        if is_iam_grant(r.resource_type) and r.props.get("role") == WORKLOAD_IDENTITY_USER:
            account = str(r.props.get("serviceAccountId", ""))
            emails.add(account.rsplit("/", 1)[-1])
    return {e for e in emails if "@" in e}


def workload_roles_bucket_scoped(
    args: StackValidationArgs, report_violation: ReportViolation
) -> None:
    """The identity Ray pods run as holds object roles on this stack's buckets and nothing
    else: no project-wide role, no grant on another bucket, no admin or IAM role."""
    workload = {f"serviceAccount:{e}" for e in workload_service_accounts(args.resources)}
    if not workload:
        return
    buckets = {str(r.props.get("name")) for r in args.resources if r.resource_type == BUCKET}
    for r in args.resources:
        if not is_iam_grant(r.resource_type) or r.props.get("role") == WORKLOAD_IDENTITY_USER:
            continue
        granted = workload & set(members_of(r.props))
        if not granted:
            continue
        role = r.props.get("role")
        who = ", ".join(sorted(granted))
        if r.resource_type not in BUCKET_IAM:
            report_violation(
                f"{r.name}: {who} gets {role!r} on a {r.resource_type.rsplit(':', 1)[-1]}; the "
                "workload identity may only hold object roles on the stack's bucket",
                r.urn,
            )
        elif r.props.get("bucket") not in buckets:
            report_violation(
                f"{r.name}: {who} gets {role!r} on bucket {r.props.get('bucket')!r}, which this "
                f"stack does not create ({', '.join(sorted(buckets)) or 'none'})",
                r.urn,
            )
        elif role not in BUCKET_OBJECT_ROLES:
            report_violation(
                f"{r.name}: {who} gets {role!r}; allowed: {', '.join(BUCKET_OBJECT_ROLES)}",
                r.urn,
            )


# ---------------------------------------------------------------------------------------------
# Exposure


def _public_service(spec: Mapping[str, Any], metadata: Mapping[str, Any]) -> bool:
    kind = spec.get("type", "ClusterIP")
    internal = mapping(metadata.get("annotations")).get(_INTERNAL_LB) == "Internal"
    return kind == "NodePort" or (kind == "LoadBalancer" and not internal)


def _flagged(metadata: Mapping[str, Any], *annotations: str) -> bool:
    return any(is_true(mapping(metadata.get("annotations")).get(a)) for a in annotations)


@_posture_policy
def ray_not_public(
    args: ResourceValidationArgs, report_violation: ReportViolation, judge: Judge
) -> None:
    """The Ray dashboard runs jobs for whoever reaches it, and serve answers anyone: neither
    leaves the cluster unless a stack flag says so (park:serving.exposePublicly,
    park:observability.exposeDashboard), which the program records as an annotation; a
    flagged public serve endpoint is still refused on a production stack unless acknowledged
    (infra.rules.security.posture_verdict, as `park validate`)."""
    kind = kind_of(args.resource_type)
    props = args.props
    metadata = mapping(props.get("metadata"))
    spec = mapping(props.get("spec"))
    flags = (EXPOSE_SERVE_ANNOTATION, EXPOSE_DASHBOARD_ANNOTATION)
    if kind == "RayService":
        serve = mapping(spec.get("serveService"))
        public = _public_service(mapping(serve.get("spec")), mapping(serve.get("metadata")))
        if public and _flagged(metadata, EXPOSE_SERVE_ANNOTATION):
            judge("serving", "RayService: serveService is public (park:serving.exposePublicly)")
        if public and not _flagged(metadata, EXPOSE_SERVE_ANNOTATION):
            report_violation(
                f"{args.name}: serveService is {get(serve, 'spec.type')}, reachable from outside "
                f"the cluster, without the {EXPOSE_SERVE_ANNOTATION} flag "
                "(park:serving.exposePublicly)",
                None,
            )
    if kind in ("RayService", "RayJob", "RayCluster"):
        for ref in templates(args.resource_type, props):
            service_type = ref.group_spec.get("serviceType") if ref.role == "head" else None
            if service_type in ("LoadBalancer", "NodePort") and not _flagged(
                metadata, EXPOSE_DASHBOARD_ANNOTATION
            ):
                report_violation(
                    f"{args.name}: the Ray head Service (dashboard, GCS, client) is "
                    f"{service_type}; keep it ClusterIP (park:observability.exposeDashboard puts "
                    "the dashboard behind IAP instead)",
                    None,
                )
    if kind == "Service" and _public_service(spec, metadata) and not _flagged(metadata, *flags):
        report_violation(
            f"{args.name}: Service of type {spec.get('type')} is reachable from outside the "
            f"cluster without {EXPOSE_SERVE_ANNOTATION} / {EXPOSE_DASHBOARD_ANNOTATION}",
            None,
        )
    if kind in ("Ingress", "Gateway") and not _flagged(metadata, *flags):
        report_violation(
            f"{args.name}: an {kind} exposes the cluster without {EXPOSE_SERVE_ANNOTATION} / "
            f"{EXPOSE_DASHBOARD_ANNOTATION} (set by the stack's exposure flags)",
            None,
        )


# ---------------------------------------------------------------------------------------------
# Lifecycle and secrets


def deletion_protection_prod(
    args: ResourceValidationArgs,
    report_violation: ReportViolation,
    *,
    prod: bool | None = None,
) -> None:
    """On prod-like stacks a stray `pulumi destroy` or replace must not take the cluster or
    the checkpoints with it."""
    if args.resource_type not in (CLUSTER, BUCKET):
        return
    if not prod_like(args.urn, args.get_config(), prod):
        return
    if args.resource_type == CLUSTER and args.props.get("deletionProtection") is False:
        report_violation(f"cluster {args.name}: deletionProtection must be true on prod", None)
    if args.resource_type == BUCKET and is_true(args.props.get("forceDestroy")):
        report_violation(
            f"bucket {args.name}: forceDestroy would delete every checkpoint and model on "
            "destroy; false on prod",
            None,
        )


def _env_vars(node: Any, where: str) -> Iterator[tuple[str, str, Any]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "env_vars" and isinstance(value, Mapping):
                for name, literal in value.items():
                    yield f"{where}.env_vars", str(name), literal
            else:
                yield from _env_vars(value, f"{where}.{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _env_vars(item, f"{where}[{i}]")


def _embedded_env(props: Mapping[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """(where, name, value) of env_vars inside Ray's YAML strings (runtime env, serve config)."""
    spec = mapping(props.get("spec"))
    for key in ("runtimeEnvYAML", "serveConfigV2"):
        text = spec.get(key)
        if not isinstance(text, str):
            continue
        try:
            document = load_yaml(text)  # bounded: a hand-made resource may hold a bomb
        except yaml.YAMLError:
            continue
        yield from _env_vars(document, f"spec.{key}")


def no_plaintext_secrets(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """Secrets reach pods only from Kubernetes Secrets fed by Pulumi secrets: no credential
    in a container env literal, a Ray runtime env, or any other input in plain text (which
    would sit unencrypted in the state file, the custom resource and the preview)."""
    if args.resource_type == "kubernetes:core/v1:Secret":
        return  # its data is the one place a secret belongs (a Pulumi secret, see tests)
    for ref in templates(args.resource_type, args.props):
        for container in containers(ref.template):
            for env in items(container.get("env")):
                name, value = str(get(env, "name", "")), get(env, "value")
                if value and secrets.secret_named(name):
                    report_violation(
                        f"{args.name}: {ref.path} container {container.get('name')} sets "
                        f"{name} as a literal; mount it from a Secret (valueFrom or a file)",
                        None,
                    )
    for where, name, value in _embedded_env(args.props):
        if value and secrets.secret_named(name):
            report_violation(
                f"{args.name}: {where} sets {name} in plain text; Ray runtime envs are stored "
                "in the custom resource, readable by anyone who can read it",
                None,
            )
    for path, text in strings(args.props):
        what = secrets.credential_kind(text)  # the one detector park validate uses too
        if what is not None:
            report_violation(
                f"{args.name}: {path or 'value'} contains {what} in plain text; set it with "
                "`pulumi config set --secret` and pass it through a Kubernetes Secret",
                None,
            )


def pod_hardening(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    """Every container of a Ray or workload pod: CPU and memory requests and limits, not
    privileged, no privilege escalation, non-root (pod or container level); no hostPath volume
    (infra.tools.manifests.pods.hardening_problems, which `park validate --manifests` runs too)."""
    for ref in templates(args.resource_type, args.props):
        for problem in hardening_problems(ref.template):
            report_violation(f"{args.name}: {ref.path} {problem}", None)
