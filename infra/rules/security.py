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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from infra import catalog, model_facts
from infra.rules import grammar
from infra.schema.errors import ConfigProblem
from infra.schema.models import (
    MAX_TPU_SLICES,
    RL_SOURCE,
    TRAINING_SOURCE,
    ClusterConfig,
    PolicyConfig,
    StackConfig,
)

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
    cidrs = [n.cidr for n in networks]  # an invalid CIDR is check_ranges' problem
    if open_to_everyone(cidrs):
        everyone = [i for i, c in enumerate(cidrs) if _prefix(c) == 0]
        alone = bool(everyone)
        yield (
            "control-plane",
            f"park:cluster.masterAuthorizedNetworks[{everyone[0]}].cidr"
            if alone
            else "park:cluster.masterAuthorizedNetworks",
            "opens the control plane to the whole internet"
            if alone
            else "together open the control plane to half the internet or more "
            f"({_covered(cidrs)} of the IPv4 address space)",
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


# Authorized ranges are judged together: two /1 halves are 0.0.0.0/0. Half the IPv4 address
# space or more (a /1, or ranges adding up to one) is the whole internet for a control plane.
EVERYONE_SHARE = 0.5


def _union(cidrs: list[str]) -> list[ipaddress.IPv4Network]:
    ranges = []
    for cidr in cidrs:
        try:
            ranges.append(ipaddress.IPv4Network(cidr, strict=False))
        except ValueError:
            continue
    return list(ipaddress.collapse_addresses(ranges))


def _covered(cidrs: list[str]) -> str:
    share = sum(n.num_addresses for n in _union(cidrs)) / 2**32
    return f"{share:.0%}"


def open_to_everyone(cidrs: list[str]) -> bool:
    """Whether authorized ranges together cover EVERYONE_SHARE of IPv4 or more (the policy
    pack asks the same of the rendered cluster)."""
    if any(c.strip() == "::/0" for c in cidrs):
        return True
    return sum(n.num_addresses for n in _union(cidrs)) >= EVERYONE_SHARE * 2**32


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
        strict = prod or (
            exposure == "control-plane"
            and open_to_everyone([n.cidr for n in spec.cluster.master_authorized_networks])
        )
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
        "park:cluster.masterAuthorizedNetworks": [
            n.cidr for n in spec.cluster.master_authorized_networks
        ],
        "park:cluster.privateNodes": spec.cluster.private_nodes,
        "park:serving.exposePublicly": spec.serving.expose_publicly,
    }.get(key)


def policy_warnings(spec: StackConfig) -> list[ConfigProblem]:
    """A production stack that turns a rule of the policy pack off (disabled) or down
    (advisory: reported, never blocking): valid, and said, so that it is a decision."""
    if not production(spec):
        return []
    what = {
        "disabled": "the policy pack will not check it",
        "advisory": "the policy pack reports it but no longer blocks `pulumi up`",
    }
    return [
        ConfigProblem(
            f"park:policy.enforcement.{rule}",
            level,
            f"{level} on a production stack: {what[level]}; keep it mandatory unless this "
            "stack must differ",
        )
        for rule, level in spec.policy.enforcement.items()
        if level in what
    ]


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
    problems += [ConfigProblem(k, v, m) for k, v, m in _reference_problems(spec)]
    problems += [ConfigProblem(k, v, m) for k, v, m in _name_problems(spec)]
    return problems


# What a reference may be, by where it points (infra.rules.grammar): each key and its kinds.
Kind = Literal["model", "data", "image"]


def _references(spec: StackConfig) -> Iterator[tuple[str, str, Kind]]:
    """Every model, data set and image the stack hands to pods (RL's are infra/rules/rl.py's)."""
    training = spec.training
    for field, kind in (("model", "model"), ("tokenizer", "model"), ("data", "data")):
        value = getattr(training, field)
        if isinstance(value, str):
            yield f"park:training.{field}", value, kind  # type: ignore[misc]
    for key, image in (("training", training.image), ("serving", spec.serving.image)):
        if image:
            yield f"park:{key}.image", image, "image"
    for i, model in enumerate(spec.serving.models):
        if model.source not in (TRAINING_SOURCE, RL_SOURCE):
            yield f"park:serving.models[{i}].source", model.source, "model"
        if model.base_model:
            yield f"park:serving.models[{i}].baseModel", model.base_model, "model"


def _reference_problems(spec: StackConfig) -> Iterator[tuple[str, str, str]]:
    mount = spec.storage.mount_path
    for key, value, kind in _references(spec):
        if _UNSAFE_IN_REFERENCE.search(value):
            yield key, value, "holds whitespace, quotes, backslashes or control characters"
            continue
        wrong = _reference_problem(value, kind, mount)
        if wrong:
            yield key, value, wrong


def _reference_problem(value: str, kind: Kind, mount: str) -> str | None:
    if kind == "image":
        return None if IMAGE_REFERENCE.match(value) else IMAGE_RULE
    if value.startswith("gs://"):
        return grammar.gcs_uri_problem(value)
    if value.startswith("/") and kind == "data":
        return grammar.mounted_path_problem(value, mount)
    if value.startswith("/"):
        # a model folder: the bucket's mount, or one the image holds; never climbing out
        return grammar.path_problem(value)
    if kind == "data":
        if value == "synthetic" or value.startswith(model_facts.BUILTIN_PREFIX):
            return None  # the trainer's own (its rules name the ones it has)
        if value.startswith(grammar.HF_DATA_PREFIX):
            return grammar.hf_dataset_problem(value)
        return (
            "synthetic, park:facts, hf:NAME[:CONFIG], gs://BUCKET/PATH or a path inside the "
            f"bucket's mount ({mount}/...)"
        )
    if value.startswith(model_facts.BUILTIN_PREFIX):
        return None  # the facts lookup names the built-ins
    if "://" in value or value.startswith((".", "~")):
        return f"a hub id (org/name), gs://BUCKET/PATH or a path inside the mount ({mount}/...)"
    if model_facts.is_hub_id(value) or "/" not in value:
        return grammar.hf_repo_problem(value)
    return f"a hub id (org/name), gs://BUCKET/PATH or a path inside the mount ({mount}/...)"


# A container image reference (github.com/distribution/reference, the grammar registries and
# the kubelet parse): [domain[:port]/]path[:tag][@digest].
_ALNUM = r"[a-z0-9]+"
_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
IMAGE_REFERENCE = re.compile(
    rf"^(?:{_DOMAIN}(?:\.{_DOMAIN})*(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
IMAGE_RULE = (
    "an image reference: [registry[:port]/]path[:tag][@sha256:digest], lowercase path "
    "components (e.g. us-east5-docker.pkg.dev/my-project/park/park-workloads:0.1.0)"
)
_MODEL_ID = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,95}(?:/[A-Za-z0-9][A-Za-z0-9._:\-]{0,95})?$"
)
_REGION = re.compile(r"^[a-z]+-[a-z]+[0-9]{1,2}$")
_PROJECT = re.compile(r"^(?:[a-z0-9][a-z0-9.-]{0,62}:)?[a-z](?:[a-z0-9-]{0,28}[a-z0-9])?$")
_CHART_VERSION = re.compile(r"^v?[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")
_NETWORK_PATH = re.compile(
    r"^(?:(?:https://www\.googleapis\.com/compute/v1/)?"
    r"projects/[a-z0-9.:-]+/(?:global|regions/[a-z0-9-]+)/(?:networks|subnetworks)/)?"
    r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$"
)


def _name_problems(spec: StackConfig) -> Iterator[tuple[str, str, str]]:
    """Names GCP or GKE reads as names, each by its own grammar (infra.rules.grammar)."""
    checks: list[tuple[str, str | None, Callable[[str], str | None]]] = [
        ("gcp:project", spec.project, _matches(_PROJECT, "a GCP project id")),
        ("gcp:region", spec.region, _matches(_REGION, "a GCP region, e.g. us-east5")),
        ("park:zone", spec.zone, _zone),
        ("park:cpuPool.machineType", spec.cpu_pool.machine_type, grammar.machine_type_problem),
        ("park:network.podsRangeName", spec.network.pods_range_name, grammar.gce_name_problem),
        (
            "park:network.servicesRangeName",
            spec.network.services_range_name,
            grammar.gce_name_problem,
        ),
        (
            "park:network.existingNetwork",
            spec.network.existing_network,
            _matches(_NETWORK_PATH, "a network's name (or projects/P/global/networks/NAME)"),
        ),
        (
            "park:network.existingSubnetwork",
            spec.network.existing_subnetwork,
            _matches(_NETWORK_PATH, "a subnetwork's name (or its projects/... path)"),
        ),
        ("park:training.dataSplit", spec.training.data_split, grammar.split_problem),
    ]
    if spec.kuberay.install == "helm":
        version = _matches(_CHART_VERSION, "a Helm chart version, e.g. 1.7.0")
        checks.append(("park:kuberay.version", spec.kuberay.version, version))
    for i, zone in enumerate(spec.extra_tpu_zones):
        checks.append((f"park:extraTpuZones[{i}]", zone, _zone))
    for i, tpu in enumerate(spec.tpu_pools):
        checks.append(
            (f"park:tpuPools[{i}].reservation", tpu.reservation, grammar.reservation_problem)
        )
    for i, gpu in enumerate(spec.gpu_pools):
        checks += [
            (f"park:gpuPools[{i}].machineType", gpu.machine_type, grammar.machine_type_problem),
            (
                f"park:gpuPools[{i}].acceleratorType",
                gpu.accelerator_type,
                grammar.accelerator_type_problem,
            ),
            (f"park:gpuPools[{i}].reservation", gpu.reservation, grammar.reservation_problem),
        ]
    model_id = _matches(
        _MODEL_ID, "a model id: [org/]name of ASCII letters, digits, '.', '_', ':' and '-'"
    )
    for i, model in enumerate(spec.serving.models):
        checks.append((f"park:serving.models[{i}].name", model.name, model_id))
    for key, value, check in checks:
        wrong = check(value) if value is not None else None
        if wrong:
            yield key, value, wrong  # type: ignore[misc]


def _matches(pattern: re.Pattern[str], what: str) -> Callable[[str], str | None]:
    return lambda value: None if pattern.match(value) and ".." not in value else f"not {what}"


def _zone(value: str) -> str | None:
    region, _, letter = value.rpartition("-")
    if _REGION.match(region) and re.fullmatch(r"[a-z][a-z0-9]{0,7}", letter):
        return None
    return "not a GCP zone, e.g. us-east5-b"


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
    slices = sum(pool.slices for pool in spec.tpu_pools)
    if slices > MAX_TPU_SLICES:
        problems.append(
            ConfigProblem(
                "park:tpuPools",
                slices,
                f"{slices} TPU slices in all: park plans at most {MAX_TPU_SLICES} per stack "
                "(each slice is a GKE node pool); split the stack",
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
