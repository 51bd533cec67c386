"""Security rules of a stack: values checked as what they are, exposure (posture), and counts.

Posture is decided here once, for both gates: `park validate` / `pulumi preview` run these
rules on the spec, and the policy pack (policy/security.py) calls `posture_verdict` on the
resources it sees, with the same production marker and acknowledgements. On a production stack
(park:policy.prodLike, default: a prod* stack name; or deletion protection set explicitly), a
control plane open to the internet, public nodes and a public serving endpoint are refused
unless park:policy.acknowledgePublic names them; elsewhere they are warnings.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from infra import catalog
from infra.spec.errors import ConfigProblem
from infra.spec.models import ClusterConfig, PolicyConfig, StackConfig

Exposure = Literal["control-plane", "nodes", "serving"]
EXPOSURES: tuple[Exposure, ...] = ("control-plane", "nodes", "serving")
# GKE Standard: 15,000 nodes per cluster; 1,000 nodes per node pool and zone.
MAX_CLUSTER_NODES = 15_000
MAX_POOL_NODES = 1_000

_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
DNS_NAME = re.compile(rf"^(?=.{{1,253}}$)(?:{_DNS_LABEL}\.)+[a-z]{{2,63}}$")  # a public host
DNS1123_SUBDOMAIN = re.compile(rf"^(?=.{{1,253}}$){_DNS_LABEL}(?:\.{_DNS_LABEL})*$")
OAUTH_CLIENT_ID = re.compile(r"^[0-9]{1,30}-[a-z0-9]{1,64}\.apps\.googleusercontent\.com$")
IAP_MEMBER = re.compile(
    r"^(?:(?:user|group|serviceAccount):[A-Za-z0-9._%+\-]{1,64}@(?:[a-z0-9-]+\.)+[a-z]{2,63}"
    r"|domain:(?:[a-z0-9-]+\.)+[a-z]{2,63})$"
)
GCS_BUCKET = re.compile(r"^[a-z0-9][-a-z0-9_.]{1,61}[a-z0-9]$")
# Characters a path, id or URI of this stack never needs: controls, whitespace, quotes.
_UNSAFE_IN_REFERENCE = re.compile(r"[\x00-\x20\x7f-\x9f\"'`\\]")


@dataclass(frozen=True)
class Verdict:
    refused: bool
    message: str


def production(spec: StackConfig) -> bool:
    """A stack held to production posture: marked prod-like, or asking for deletion
    protection itself (the default does not count: it is a safety default, not a statement)."""
    return production_of(spec.policy, spec.cluster, spec.stack)


def production_of(policy: PolicyConfig, cluster: ClusterConfig, stack: str) -> bool:
    """`production` from the two sections it reads (the policy pack has no whole spec)."""
    explicit = "deletion_protection" in cluster.model_fields_set
    return policy.is_prod_like(stack) or (explicit and cluster.deletion_protection)


def posture_verdict(
    exposure: Exposure, what: str, *, production: bool, acknowledged: frozenset[str]
) -> Verdict:
    """Refused on production unless acknowledged; a warning elsewhere (and when acknowledged)."""
    ack = f"park:policy.acknowledgePublic: [{exposure}]"
    if production and exposure not in acknowledged:
        return Verdict(
            True,
            f"{what}, on a production stack; close it, or say it is meant with {ack}",
        )
    if exposure in acknowledged:
        return Verdict(False, f"{what} (acknowledged by park:policy.acknowledgePublic)")
    return Verdict(False, f"{what}; a production stack would refuse it unless {ack}")


def exposures(spec: StackConfig) -> Iterator[tuple[Exposure, str, str]]:
    """(exposure, config key, what is open) of a spec. A range of everyone (0.0.0.0/0) is
    held to production posture on every stack (the policy pack always refused it)."""
    cluster = spec.cluster
    networks = cluster.master_authorized_networks
    everyone = [
        i for i, n in enumerate(networks) if _prefix(n.cidr) == 0
    ]  # an invalid CIDR is check_ranges' problem
    if everyone:
        yield (
            "control-plane",
            f"park:cluster.masterAuthorizedNetworks[{everyone[0]}].cidr",
            "opens the control plane to the whole internet",
        )
    elif not networks and not cluster.private_endpoint:
        yield (
            "control-plane",
            "park:cluster.masterAuthorizedNetworks",
            "empty without park:cluster.privateEndpoint: the control plane's public IP "
            "accepts connections from the whole internet",
        )
    if not cluster.private_nodes:
        yield "nodes", "park:cluster.privateNodes", "nodes get public IP addresses"
    if spec.serving.enabled and spec.serving.expose_publicly:
        yield (
            "serving",
            "park:serving.exposePublicly",
            "the OpenAI endpoint gets a public load balancer, unauthenticated",
        )


def _prefix(cidr: str) -> int | None:
    try:
        return ipaddress.ip_network(cidr, strict=False).prefixlen
    except ValueError:
        return None


def check_posture(spec: StackConfig) -> tuple[list[ConfigProblem], list[ConfigProblem]]:
    """(problems, warnings) of the stack's exposure."""
    problems: list[ConfigProblem] = []
    warnings: list[ConfigProblem] = []
    acknowledged = frozenset(spec.policy.acknowledge_public)
    prod = production(spec)
    for exposure, key, what in exposures(spec):
        strict = prod or key.endswith(".cidr")
        verdict = posture_verdict(exposure, what, production=strict, acknowledged=acknowledged)
        value = _value_at(spec, key)
        (problems if verdict.refused else warnings).append(
            ConfigProblem(key, value, verdict.message)
        )
    return problems, warnings


def _value_at(spec: StackConfig, key: str) -> object:
    if key.endswith(".cidr"):
        index = int(key.split("[")[1].split("]")[0])
        return spec.cluster.master_authorized_networks[index].cidr
    return {
        "park:cluster.masterAuthorizedNetworks": [],
        "park:cluster.privateNodes": spec.cluster.private_nodes,
        "park:serving.exposePublicly": spec.serving.expose_publicly,
    }.get(key)


# ---- values as what they are ------------------------------------------------------------------


def check_values(spec: StackConfig) -> list[ConfigProblem]:
    """Host names, Secret names, OAuth client ids, IAM members, bucket paths and references,
    each checked for its own syntax: they end up in IAM conditions, Gateway routes, YAML and
    command lines, so nothing else may get through."""
    problems: list[ConfigProblem] = []
    obs = spec.observability
    checks = [
        (
            "park:observability.dashboardDomain",
            obs.dashboard_domain,
            DNS_NAME,
            "a DNS host name (lowercase labels of letters, digits and '-', dot-separated, "
            "e.g. ray.example.com)",
        ),
        (
            "park:observability.iapOauthSecret",
            obs.iap_oauth_secret,
            DNS1123_SUBDOMAIN,
            "the *name* of a Kubernetes Secret (DNS-1123: lowercase letters, digits, '-' and "
            "'.'), never the client secret itself",
        ),
        (
            "park:observability.iapOauthClientId",
            obs.iap_oauth_client_id,
            OAUTH_CLIENT_ID,
            "an OAuth client id: <number>-<id>.apps.googleusercontent.com",
        ),
    ]
    for key, value, pattern, what in checks:
        if value is not None and not pattern.match(value):
            problems.append(ConfigProblem(key, value, f"not {what}"))
    for i, member in enumerate(obs.iap_members):
        if not IAP_MEMBER.match(member):
            problems.append(
                ConfigProblem(
                    f"park:observability.iapMembers[{i}]",
                    member,
                    "an IAM member: user:, group: or serviceAccount: and an email address, or "
                    "domain: and a domain name",
                )
            )
    for key, value in _references(spec):
        if _UNSAFE_IN_REFERENCE.search(value):
            problems.append(
                ConfigProblem(
                    key, value, "holds whitespace, quotes, backslashes or control characters"
                )
            )
        elif value.startswith("gs://"):
            bucket = value.removeprefix("gs://").split("/", 1)[0]
            if not GCS_BUCKET.match(bucket):
                problems.append(ConfigProblem(key, value, "not a bucket path: gs://BUCKET[/PATH]"))
    return problems


def _references(spec: StackConfig) -> Iterator[tuple[str, str]]:
    """Every path, model id, URI and image the stack hands to pods."""
    training = spec.training
    for field in ("model", "tokenizer", "data", "image"):
        value = getattr(training, field)
        if isinstance(value, str):
            yield f"park:training.{field}", value
    if spec.serving.image:
        yield "park:serving.image", spec.serving.image
    for i, model in enumerate(spec.serving.models):
        yield f"park:serving.models[{i}].source", model.source
        if model.base_model:
            yield f"park:serving.models[{i}].baseModel", model.base_model
    yield "park:storage.mountPath", spec.storage.mount_path


# ---- counts ----------------------------------------------------------------------------------


def check_counts(spec: StackConfig) -> list[ConfigProblem]:
    """Counts GKE can hold: nodes per cluster and per pool (a million slices is a typo)."""
    problems = []
    total = 0
    for i, pool in enumerate(spec.tpu_pools):
        try:
            hosts = catalog.lookup(pool.machine_type, pool.topology).hosts
        except (KeyError, ValueError):
            continue  # pools.check_pools names the unknown shape
        nodes = pool.slices * hosts
        total += nodes
        if nodes > MAX_CLUSTER_NODES:
            problems.append(
                ConfigProblem(
                    f"park:tpuPools[{i}].slices",
                    pool.slices,
                    f"{nodes} TPU hosts: GKE holds at most {MAX_CLUSTER_NODES} nodes per "
                    f"cluster; allowed: 1..{MAX_CLUSTER_NODES // hosts}",
                )
            )
    for i, gpu in enumerate(spec.gpu_pools):
        total += gpu.nodes
        if gpu.nodes > MAX_POOL_NODES:
            problems.append(
                ConfigProblem(
                    f"park:gpuPools[{i}].nodes",
                    gpu.nodes,
                    f"GKE holds at most {MAX_POOL_NODES} nodes per node pool and zone",
                )
            )
    if spec.cpu_pool.max_nodes > MAX_POOL_NODES:
        problems.append(
            ConfigProblem(
                "park:cpuPool.maxNodes",
                spec.cpu_pool.max_nodes,
                f"GKE holds at most {MAX_POOL_NODES} nodes per node pool and zone",
            )
        )
    if total > MAX_CLUSTER_NODES and not problems:
        problems.append(
            ConfigProblem(
                "park:tpuPools",
                total,
                f"{total} nodes in all: GKE holds at most {MAX_CLUSTER_NODES} per cluster",
            )
        )
    return problems
