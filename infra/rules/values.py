"""Stack values checked as what they are (host names, Secret names, OAuth client ids, IAM
members, bucket paths, image and model references, project and region names), and the counts
GKE allows. The stack's exposure (posture) is judged in infra/rules/security.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Literal

from infra import catalog, model_facts
from infra.rules import grammar
from infra.rules.capacity import rung_keys
from infra.schema.errors import ConfigProblem
from infra.schema.models import MAX_TPU_SLICES, RL_SOURCE, TRAINING_SOURCE, StackConfig

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
    """Every model, data set and image the stack hands to pods: training's, serving's, RL's."""
    training = spec.training
    for field, kind in (("model", "model"), ("tokenizer", "model"), ("data", "data")):
        value = getattr(training, field)
        if isinstance(value, str):
            yield f"park:training.{field}", value, kind  # type: ignore[misc]
    for key, image in (("training", training.image), ("serving", spec.serving.image)):
        if image:
            yield f"park:{key}.image", image, "image"
    rl = spec.rl
    if rl.enabled:
        for field, kind in (("model", "model"), ("data", "data")):
            value = getattr(rl, field)
            if value:
                yield f"park:rl.{field}", value, kind  # type: ignore[misc]
        if rl.image:
            yield "park:rl.image", rl.image, "image"
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
        (
            "park:rl.dataSplit",
            spec.rl.data_split if spec.rl.enabled else None,
            grammar.split_problem,
        ),
    ]
    if spec.kuberay.install == "helm":
        version = _matches(_CHART_VERSION, "a Helm chart version, e.g. 1.7.0")
        checks.append(("park:kuberay.version", spec.kuberay.version, version))
    for i, zone in enumerate(spec.extra_tpu_zones):
        checks.append((f"park:extraTpuZones[{i}]", zone, _zone))
    for i, tpu in enumerate(spec.tpu_pools):
        checks += [
            (f"{at}.reservation", rung.reservation, grammar.reservation_problem)
            for at, rung in rung_keys(f"park:tpuPools[{i}]", tpu)
        ]
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
