"""Rules for names, network ranges, lifecycle, Kueue and observability: what GCP or Kubernetes
would reject at `pulumi up`, or a guardrail of the policy pack (policy/) caught before anything
runs."""

from __future__ import annotations

import ipaddress
import re

from infra.names import HF_TOKEN_DIR, RFC1035_NAME, StackNames
from infra.rules import grammar
from infra.schema.errors import ConfigProblem
from infra.schema.models import StackConfig
from infra.versions import KUEUE_VERSION

_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_CLUSTER_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_CLUSTER_NAME_RULE = (
    "a GKE cluster name: lowercase letters, digits and '-', starts with a letter, ≤ 40 chars"
)
_REPOSITORY_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_REPOSITORY_RULE = (
    "an Artifact Registry repository id: lowercase letters, digits and '-', starts with a letter"
)
# Where every Ray pod already mounts something (infra/plan/ray/pods.py; the service-account
# token of a pod that mounts one): the bucket may not be laid over, under or on any of them.
_POD_MOUNTS = ("/tmp", "/dev/shm", HF_TOKEN_DIR, "/var/run/secrets/kubernetes.io/serviceaccount")
# What the image and the runtime need as they are: the bucket may not be there or below.
_SYSTEM_FOLDERS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/opt/conda", "/proc", "/root",
    "/run", "/sbin", "/sys", "/usr", "/var/lib", "/var/run",
)  # fmt: skip


def _mount_overlap(mount: str) -> str | None:
    """The bucket's mount laid over, under or on a folder the pod needs as it is."""
    hit = [m for m in _POD_MOUNTS if grammar.under(mount, m) or grammar.under(m, mount)]
    hit += [f for f in _SYSTEM_FOLDERS if grammar.under(mount, f)]
    if hit:
        return (
            f"would be laid over {hit[0]} (the pods mount {', '.join(_POD_MOUNTS)} already; "
            f"the image needs {', '.join(_SYSTEM_FOLDERS)}): mount the bucket elsewhere, e.g. "
            "/data"
        )
    return None


def _cidr(key: str, value: str, problems: list[ConfigProblem]) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(value)
    except ValueError as err:
        problems.append(ConfigProblem(key, value, f"not an IPv4 CIDR range: {err}"))
        return None


_STACK_NAME = re.compile(r"^[a-z0-9](?:[-a-z0-9]{0,48}[a-z0-9])?$")


def check_names(config: StackConfig, stack_names: StackNames) -> list[ConfigProblem]:
    """Names GKE, GCS, Artifact Registry and Kubernetes accept."""
    problems = []
    if not _STACK_NAME.match(config.stack):
        # every cloud name derives from it: said once, not once per derived name
        problems.append(
            ConfigProblem(
                "stack",
                config.stack,
                "the stack's name: cloud names derive from it (park-<stack>-...), so at most "
                "50 lowercase letters, digits and '-', starting and ending with a letter or digit",
            )
        )
    if not _DNS_LABEL_RE.match(config.namespace) or config.namespace.startswith("kube-"):
        problems.append(
            ConfigProblem(
                "park:namespace",
                config.namespace,
                "a Kubernetes namespace: lowercase letters, digits and '-', ≤ 63 chars, not kube-*",
            )
        )

    def named(key: str, name: str, given: bool, wrong: str, derivation: str) -> None:
        """A problem with a name `key` sets (`given`), or else derives from the stack's name
        (and project): then it is the stack name's, said under "stack" with how it derived (a
        package user never wrote the key)."""
        if given:
            problems.append(ConfigProblem(key, name, wrong))
        else:
            problems.append(ConfigProblem("stack", config.stack, f"{wrong} ({derivation})"))

    cluster, bucket = stack_names.cluster, stack_names.bucket
    if not _CLUSTER_NAME_RE.match(cluster):
        given = config.cluster.name is not None
        named("park:cluster.name", cluster, given, _CLUSTER_NAME_RULE, f"park-<stack>: {cluster}")
    wrong = grammar.bucket_problem(bucket)
    if wrong:
        given = config.storage.bucket is not None
        named(
            "park:storage.bucket",
            bucket,
            given,
            wrong,
            f"the bucket derived from the project and stack: {bucket}",
        )
    mount = config.storage.mount_path
    wrong = grammar.mount_path_problem(mount) or _mount_overlap(mount)
    if wrong:
        problems.append(ConfigProblem("park:storage.mountPath", mount, wrong))
    repository = stack_names.registry_repository
    if not _REPOSITORY_RE.match(repository):
        given = config.registry.repository is not None
        named("park:registry.repository", repository, given, _REPOSITORY_RULE, "park-<stack>")
    derived = {
        "network": stack_names.network,
        "subnetwork": stack_names.subnetwork,
        "router": stack_names.router,
        "NAT": stack_names.nat,
        "dashboard address": stack_names.dashboard,
    }
    for what, name in derived.items():
        if not RFC1035_NAME.match(name):
            problems.append(
                ConfigProblem(
                    "stack",
                    config.stack,
                    f"the stack's {what} name {name!r} (park-<stack>-...) is not a valid GCP "
                    "name: ≤ 63 lowercase letters, digits and '-'; use a shorter stack name",
                )
            )
    for i, zone in enumerate(config.extra_tpu_zones):
        if not zone.startswith(config.region + "-"):
            problems.append(
                ConfigProblem(
                    f"park:extraTpuZones[{i}]",
                    zone,
                    f"must be a zone of gcp:region {config.region}",
                )
            )
    if config.cpu_pool.min_nodes > config.cpu_pool.max_nodes:
        problems.append(
            ConfigProblem(
                "park:cpuPool.minNodes",
                config.cpu_pool.min_nodes,
                f"must not exceed park:cpuPool.maxNodes ({config.cpu_pool.max_nodes})",
            )
        )
    if config.kuberay.tpu_webhook_chart and config.kuberay.install != "helm":
        problems.append(
            ConfigProblem(
                "park:kuberay.tpuWebhookChart",
                config.kuberay.tpu_webhook_chart,
                "only used with install: helm (GKE's Ray add-on brings its own TPU webhook)",
            )
        )
    if problems and problems[0].key == "stack":  # the stack's name itself: said once
        problems = [problems[0], *(p for p in problems[1:] if p.key != "stack")]
    return problems


def check_ranges(config: StackConfig) -> list[ConfigProblem]:
    """Valid, non-overlapping ranges; the control plane not open to the whole internet."""
    problems: list[ConfigProblem] = []
    net = config.network
    if net.existing_subnetwork and not net.existing_network:
        problems.append(
            ConfigProblem(
                "park:network.existingSubnetwork",
                net.existing_subnetwork,
                "needs park:network.existingNetwork (the network it belongs to)",
            )
        )
    fields = {"masterCidr": net.master_cidr}
    if not net.existing_network:  # an existing network brings its own subnet ranges
        fields |= {
            "subnetCidr": net.subnet_cidr,
            "podsCidr": net.pods_cidr,
            "servicesCidr": net.services_cidr,
        }
    ranges = {}
    for name, value in fields.items():
        parsed = _cidr(f"park:network.{name}", value, problems)
        if parsed is not None:
            ranges[name] = parsed
    master = ranges.get("masterCidr")
    if master is not None and master.prefixlen != 28:
        problems.append(
            ConfigProblem("park:network.masterCidr", net.master_cidr, "GKE needs a /28 range")
        )
    names = list(ranges)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            if ranges[first].overlaps(ranges[second]):
                problems.append(
                    ConfigProblem(
                        f"park:network.{second}",
                        str(ranges[second]),
                        f"overlaps park:network.{first} ({ranges[first]})",
                    )
                )
    for i, authorized in enumerate(config.cluster.master_authorized_networks):
        # A range open to everyone is a posture rule (infra/rules/security.py).
        _cidr(f"park:cluster.masterAuthorizedNetworks[{i}].cidr", authorized.cidr, problems)
    return problems


def check_lifecycle(config: StackConfig) -> list[ConfigProblem]:
    """Prod-like stacks (park:policy.prodLike, default: the stack is prod*) keep the cluster
    and the bucket through a stray destroy, unless their policy makes that rule advisory."""
    policy = config.policy
    if not policy.is_prod_like(config.stack):
        return []
    if policy.level("deletion-protection-prod") != "mandatory":
        return []
    why = (
        f"stack {config.stack} is prod-like; set park:policy.enforcement."
        "deletion-protection-prod to advisory to allow it"
    )
    problems = []
    if not config.cluster.deletion_protection:
        problems.append(
            ConfigProblem("park:cluster.deletionProtection", False, f"must be true: {why}")
        )
    if config.storage.force_destroy:
        problems.append(
            ConfigProblem(
                "park:storage.forceDestroy",
                True,
                f"would delete every checkpoint and model on destroy: {why}",
            )
        )
    return problems


_CHART_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")


def check_kueue(config: StackConfig) -> list[ConfigProblem]:
    """Kueue comes from its Helm chart only when a pool is queued (DWS); the chart version
    has no leading 'v'."""
    queued = any(len(p.rungs()) > 1 or p.rungs()[0].capacity == "queued" for p in config.tpu_pools)
    if queued and not _CHART_VERSION_RE.match(config.kueue.version):
        return [
            ConfigProblem(
                "park:kueue.version",
                config.kueue.version,
                f"a Kueue Helm chart version, e.g. {KUEUE_VERSION} (no leading 'v')",
            )
        ]
    return []


# The project id the shipped stacks carry (stacks/Pulumi.*.yaml) until a user sets theirs.
PLACEHOLDER_PROJECT = "my-gcp-project"


def project_warnings(config: StackConfig) -> list[ConfigProblem]:
    """A stack still naming the shipped placeholder project renders and validates (nothing
    offline can tell a real project id from it), but `pulumi up` would fail on its first API
    call, and the bucket's default name derives from it: say so before anyone reads "valid"."""
    if config.project != PLACEHOLDER_PROJECT:
        return []
    return [
        ConfigProblem(
            "gcp:project",
            config.project,
            "the shipped placeholder, not a project: `pulumi up` fails on its first API call, "
            "and the names derived from it (the bucket's) are placeholders too; set yours "
            "(pulumi config set gcp:project <id>) before `pulumi up`",
        )
    ]


def observability_warnings(config: StackConfig) -> list[ConfigProblem]:
    """The IAP backend policy reads the OAuth client's secret from a Secret in the namespace
    `pulumi up` creates: given as park:iapOauthClientSecret, the program creates it in order;
    without it, someone must, after the first `up` and before IAP can let anyone in."""
    obs = config.observability
    if not obs.expose_dashboard or config.iap_oauth_client_secret is not None:
        return []
    return [
        ConfigProblem(
            "park:iapOauthClientSecret",
            None,
            f"not set: IAP reads the OAuth client's secret from Secret {obs.iap_oauth_secret} "
            f"in namespace {config.namespace}, which `pulumi up` creates only from this key "
            "(pulumi config set --secret park:iapOauthClientSecret <value>); unset, create "
            "that Secret (key `key`) after the first `up`",
        )
    ]


def check_observability(config: StackConfig) -> list[ConfigProblem]:
    """The dashboard leaves the cluster only behind IAP, and only with all that IAP needs."""
    obs = config.observability
    problems: list[ConfigProblem] = []
    # Each member's syntax: infra/rules/values.py (check_values).
    if not obs.expose_dashboard:
        return problems
    why = "needed when park:observability.exposeDashboard is true"
    if not obs.iap_members:
        problems.append(
            ConfigProblem(
                "park:observability.iapMembers",
                obs.iap_members,
                f"{why}: who IAP lets in (e.g. group:ml@example.com); without it nobody could",
            )
        )
    required = {
        "dashboardDomain": (obs.dashboard_domain, "the host name the certificate is issued for"),
        "iapOauthClientId": (obs.iap_oauth_client_id, "the OAuth client IAP signs users in with"),
        "iapOauthSecret": (obs.iap_oauth_secret, "the Secret holding that client's secret"),
    }
    for key, (value, what) in required.items():
        if not value:
            problems.append(ConfigProblem(f"park:observability.{key}", value, f"{why}: {what}"))
    if not config.serving.enabled:
        problems.append(
            ConfigProblem(
                "park:observability.exposeDashboard",
                True,
                "the exposed dashboard is the RayService's (park:serving.enabled is false); a "
                "training job's dashboard is reached with kubectl port-forward",
            )
        )
    return problems
