"""Stack config: typed models of every `park:*` key, and validation that reports all problems.

Values come from Pulumi config (`pulumi config set ...`, or `stacks/Pulumi.<stack>.yaml`), or from
a stack file read offline by `park render` / `park validate`. Parsing happens in two phases:
types and enums (pydantic), then rules that need the TPU catalog or several keys at once. Every
problem names the config key, the value, and what is allowed; all of them are reported together.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, ValidationError
from pydantic.alias_generators import to_camel

from infra import catalog

RAY_VERSION = "2.60.0"  # the Ray the images and manifests pin
KUBERAY_VERSION = "1.7.0"
KUEUE_VERSION = "0.19.2"  # Helm chart oci://registry.k8s.io/kueue/charts/kueue (no "v")
IMAGE_TAG = "0.1.0"  # the workload images' tag: the package version
# Multi-slice PyTorch training: Ray 2.59.0 raised, 2.60.0 sets MEGASCALE_* (FACTS.md).
RAY_MULTISLICE_TORCH_MIN = (2, 60, 0)
# Where the pinned Ray's TPU serving maths disagrees with GKE: (generation, topology) → hosts
# Ray assumes: ray/util/tpu.py takes v6e 2x4 as one 8-chip VM unless told chips_per_vm,
# which Serve LLM does not pass.
RAY_SERVE_HOSTS_BY_TOPOLOGY = {("v6e", "2x4"): 1}

Capacity = Literal["on-demand", "spot", "reservation", "flex-start", "queued"]
SECRET_PLACEHOLDER = "[secret]"


class _Model(BaseModel):
    """camelCase keys in YAML, snake_case in Python; unknown keys are errors, not silence."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class AuthorizedNetwork(_Model):
    cidr: str
    name: str = "authorized"


class NetworkConfig(_Model):
    """A new VPC (default) or an existing network and subnetwork by name."""

    existing_network: str | None = None
    existing_subnetwork: str | None = None
    subnet_cidr: str = "10.10.0.0/20"
    pods_cidr: str = "10.16.0.0/14"
    services_cidr: str = "10.20.0.0/20"
    master_cidr: str = "172.16.0.0/28"
    pods_range_name: str = "pods"
    services_range_name: str = "services"


class ClusterConfig(_Model):
    name: str = "park"
    release_channel: Literal["RAPID", "REGULAR", "STABLE"] = "REGULAR"
    version: str = catalog.GENERATIONS["v6e"].min_gke_version
    private_nodes: bool = True
    private_endpoint: bool = False
    master_authorized_networks: list[AuthorizedNetwork] = []
    deletion_protection: bool = True


class CpuPoolConfig(_Model):
    machine_type: str = "e2-standard-8"
    min_nodes: int = Field(1, ge=0)
    max_nodes: int = Field(3, ge=1)
    disk_size_gb: int = Field(100, ge=10)


class KubeRayConfig(_Model):
    install: Literal["addon", "helm"] = "addon"
    version: str = KUBERAY_VERSION
    logging: bool = False  # GKE Ray add-on: Ray logs to Cloud Logging
    monitoring: bool = False  # GKE Ray add-on: Ray metrics to Managed Prometheus
    tpu_webhook_chart: str | None = None  # helm only: path of ai-on-gke's kuberay-tpu-webhook chart


class KueueConfig(_Model):
    """Kueue, installed by Helm only when a TPU pool has `capacity: queued` (DWS)."""

    version: str = KUEUE_VERSION


class TpuPoolConfig(_Model):
    name: str
    machine_type: str
    topology: str
    slices: int = 1
    capacity: Capacity = "on-demand"
    reservation: str | None = None
    autoscaling: bool = True
    max_run_duration: str | None = None  # flex-start only, e.g. "86400s"
    disk_size_gb: int = Field(100, ge=10)

    @property
    def slice(self) -> catalog.TpuSlice:
        return catalog.lookup(self.machine_type, self.topology)


class GpuPoolConfig(_Model):
    name: str
    machine_type: str  # e.g. a3-highgpu-8g
    accelerator_type: str  # e.g. nvidia-h100-80gb
    accelerator_count: int = Field(8, ge=1)
    nodes: int = Field(1, ge=1)  # max nodes; the pool scales to 0 while idle
    capacity: Capacity = "on-demand"
    reservation: str | None = None
    autoscaling: bool = True
    disk_size_gb: int = Field(200, ge=10)


class StorageConfig(_Model):
    bucket: str | None = None  # default: <project>-<stack>-park
    location: str | None = None  # default: the region
    versioning: bool = True
    force_destroy: bool = False
    mount_path: str = "/data"  # where pods see the bucket (GCS FUSE)


class RegistryConfig(_Model):
    repository: str = "park"


class TrainingConfig(_Model):
    enabled: bool = False
    pool: str = ""
    image: str | None = None  # default: <registry>/park-workloads:<version>
    strategy: Literal["ddp", "fsdp2"] = "fsdp2"
    model_size: Literal["tiny", "small", "gpt2-small", "gpt2-medium", "1b"] = "gpt2-small"
    steps: int = Field(1000, ge=1)
    global_batch_size: int = Field(64, ge=1)
    seq_len: int = Field(1024, ge=8)
    learning_rate: float = Field(3e-4, gt=0)
    checkpoint_every: int = Field(100, ge=1)
    num_slices: int = Field(1, ge=1)
    max_failures: int = Field(3, ge=0)
    data: str = "synthetic"  # "synthetic", a path under the bucket mount, or gs://...
    ttl_seconds_after_finished: int = Field(600, ge=0)
    active_deadline_seconds: int = Field(86400, ge=60)
    backoff_limit: int = Field(0, ge=0)
    estimated_step_seconds: float = Field(1.0, gt=0)  # for `park cost`'s run estimate


class ServedModel(_Model):
    name: str  # the OpenAI model id clients ask for
    source: str  # Hugging Face id, gs://..., or a path under the bucket mount
    tensor_parallel_size: int | None = None  # default: every chip of one slice
    max_model_len: int = Field(8192, ge=16)
    enable_expert_parallel: bool = False
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    engine_kwargs: dict[str, Any] = {}


class ServingConfig(_Model):
    enabled: bool = False
    pool: str = ""
    image: str | None = None
    engine: Literal["vllm-torchtpu", "vllm-tpu"] = "vllm-torchtpu"
    models: list[ServedModel] = []
    upgrade_strategy: Literal["NewCluster", "NewClusterWithIncrementalUpgrade", "None"] = "None"
    expose_publicly: bool = False
    hf_token: Any = None  # a Pulumi secret; never read as plain config


class PricesConfig(_Model):
    """`park:prices`: your own rates over infra/data/prices.yaml (negotiated, regional, newer)."""

    source: str | None = None  # where these figures come from; `park cost` prints it
    tpu_chip_hour: dict[Capacity, NonNegativeFloat] = {}  # USD / chip-hour by capacity type
    machine_hour: dict[str, NonNegativeFloat] = {}  # USD / node-hour by machine type (CPU, GPU)
    cluster_hour: float | None = Field(None, ge=0)  # GKE cluster management fee


class ObservabilityConfig(_Model):
    """Metrics to Managed Prometheus and how people reach the dashboards (private by default)."""

    pod_monitoring: bool = True  # PodMonitoring for Ray head and worker metrics
    tpu_metrics: bool = True  # TPU chip metrics where the webhook exposes the device plugin
    expose_dashboard: bool = False  # opt-in: the Ray dashboard behind IAP
    iap_members: list[str] = []  # who IAP lets in, e.g. "group:ml@example.com"
    dashboard_domain: str | None = None  # host name for the IAP ingress certificate
    # IAP's OAuth client: its id, and the name of a Secret in the workload namespace whose key
    # "key" holds the client secret (created out of band: the secret never enters the stack).
    iap_oauth_client_id: str | None = None
    iap_oauth_secret: str | None = None
    grafana: bool = False  # Grafana dashboards for Ray as ConfigMaps
    training_metrics: bool = True  # loss and tokens/s from the training logs (log-based metrics)
    scrape_interval: str = Field("30s", pattern=r"^[0-9]+(ms|s|m|h)$")


# The policy pack's rules (policy/rules.py asserts it has exactly these, in this order): a typo
# in a stack's park:policy.enforcement is a config error, not a level silently never applied.
PolicyRule = Literal[
    "tpu-pool-shape",
    "tpu-topology-multi-host-only",
    "tpu-compact-single-zone",
    "pool-capacity",
    "tpu-idle-scale-to-zero",
    "rayjob-shutdown-after-finish",
    "tpu-requires-toleration",
    "ray-tpu-worker-shape",
    "ray-workers-target-tpu-pools",
    "gke-workload-identity",
    "no-service-account-keys",
    "node-sa-not-default",
    "gke-private-nodes",
    "bucket-uniform-access",
    "no-public-iam-members",
    "workload-roles-bucket-scoped",
    "ray-not-public",
    "deletion-protection-prod",
    "no-plaintext-secrets",
    "pod-hardening",
]
POLICY_RULE_NAMES: tuple[str, ...] = get_args(PolicyRule)


class PolicyConfig(_Model):
    """Per-stack policy settings: rule name → mandatory | advisory | disabled."""

    enforcement: dict[PolicyRule, Literal["mandatory", "advisory", "disabled"]] = {}
    prod_like: bool | None = None  # default: the stack name starts with "prod"

    def is_prod_like(self, stack: str) -> bool:
        """Prod-like stacks keep deletion protection (config rules and the policy pack)."""
        return self.prod_like if self.prod_like is not None else stack.startswith("prod")

    def level(self, rule: PolicyRule, default: str = "mandatory") -> str:
        return self.enforcement.get(rule, default)


class StackConfig(_Model):
    """Everything one stack declares, validated."""

    project: str
    region: str
    stack: str = "dev"
    zone: str
    extra_tpu_zones: list[str] = []
    namespace: str = "park"
    network: NetworkConfig = NetworkConfig()
    cluster: ClusterConfig = ClusterConfig()
    cpu_pool: CpuPoolConfig = CpuPoolConfig()
    kuberay: KubeRayConfig = KubeRayConfig()
    kueue: KueueConfig = KueueConfig()
    tpu_pools: list[TpuPoolConfig] = []
    gpu_pools: list[GpuPoolConfig] = []
    storage: StorageConfig = StorageConfig()
    registry: RegistryConfig = RegistryConfig()
    training: TrainingConfig = TrainingConfig()
    serving: ServingConfig = ServingConfig()
    prices: PricesConfig = PricesConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    policy: PolicyConfig = PolicyConfig()

    # Derived names, so no layer invents its own.
    @property
    def bucket_name(self) -> str:
        return self.storage.bucket or f"{self.project}-{self.stack}-park"

    @property
    def registry_url(self) -> str:
        return f"{self.region}-docker.pkg.dev/{self.project}/{self.registry.repository}"

    def image_for(self, section: TrainingConfig | ServingConfig) -> str:
        """The configured image, else ours in the stack's registry: one TorchTPU image for
        training and vLLM-TorchTPU serving; a separate JAX image for the vllm-tpu engine
        (its libtpu pins conflict with torch_tpu)."""
        if section.image:
            return section.image
        name = "park-workloads"
        if isinstance(section, ServingConfig) and section.engine == "vllm-tpu":
            name = "park-serve-vllm-tpu"
        return f"{self.registry_url}/{name}:{IMAGE_TAG}"

    def tpu_pool(self, name: str) -> TpuPoolConfig:
        return next(p for p in self.tpu_pools if p.name == name)

    @property
    def any_multi_host(self) -> bool:
        return any(p.slice.multi_host for p in self.tpu_pools)

    @property
    def any_queued(self) -> bool:
        return any(p.capacity == "queued" for p in self.tpu_pools)


# ---------------------------------------------------------------------------------------------
# Errors


@dataclass(frozen=True)
class ConfigProblem:
    key: str  # e.g. "park:tpuPools[1].topology"
    value: Any
    message: str  # what is wrong and what is allowed

    def __str__(self) -> str:
        return f"{self.key} = {self.value!r}: {self.message}"


class ConfigError(ValueError):
    """All problems of one stack config, reported together."""

    def __init__(self, problems: list[ConfigProblem]):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"invalid stack config ({len(problems)} problem(s)):\n{lines}")


# Top-level model fields and the config key each comes from.
_KEY_OF_FIELD = {
    "project": "gcp:project",
    "region": "gcp:region",
    **{
        name: f"park:{to_camel(name)}"
        for name in StackConfig.model_fields
        if name not in ("project", "region", "stack")
    },
}


def config_keys() -> list[str]:
    """Every config key the program reads, e.g. "gcp:project", "park:tpuPools"."""
    return list(_KEY_OF_FIELD.values())


def _key_from_loc(loc: tuple[int | str, ...]) -> str:
    head, *rest = loc
    key = _KEY_OF_FIELD.get(str(head), f"park:{head}")
    for part in rest:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key


# ---------------------------------------------------------------------------------------------
# Loading


def parse_stack_config(
    values: Mapping[str, Any], stack: str, secret_keys: Collection[str] | None = None
) -> StackConfig:
    """Build a StackConfig from `{"gcp:project": ..., "park:tpuPools": [...]}` or raise ConfigError.

    Keys outside `gcp:` / `park:` namespaces belong to providers and are ignored here.
    With `secret_keys` (the keys stored as secrets), a credential in plain text is a problem;
    credentials never enter the StackConfig (the program reads them as Pulumi secrets).
    """
    raw: dict[str, Any] = {"stack": stack}
    problems: list[ConfigProblem] = []
    if secret_keys is not None:
        problems += secret_problems(values, secret_keys)
    values = _without_secrets(values)
    known = {v: k for k, v in _KEY_OF_FIELD.items()}
    for key, value in values.items():
        if key in known:
            raw[known[key]] = value
        elif key.startswith("park:"):
            problems.append(
                ConfigProblem(key, value, f"unknown key; allowed: {', '.join(sorted(known))}")
            )
    for required in ("project", "region", "zone"):
        if required not in raw:
            problems.append(
                ConfigProblem(_KEY_OF_FIELD[required], None, "required; set it in the stack")
            )
    if problems:
        raise ConfigError(problems)
    try:
        config = StackConfig.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(
            [ConfigProblem(_key_from_loc(e["loc"]), e.get("input"), e["msg"]) for e in err.errors()]
        ) from None
    problems = check_rules(config)
    if problems:
        raise ConfigError(problems)
    return config


# ---------------------------------------------------------------------------------------------
# Rules that need the catalog or several keys


_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:-gke\.(\d+))?$")
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,28}[a-z0-9])?$")


def gke_version_tuple(version: str) -> tuple[int, int, int, int] | None:
    """``"1.31.2-gke.1115000"`` → ``(1, 31, 2, 1115000)``; ``"1.32"`` → ``(1, 32, 0, 0)``."""
    match = _VERSION_RE.match(version)
    if not match:
        return None
    return tuple(int(g or 0) for g in match.groups())  # type: ignore[return-value]


def check_rules(config: StackConfig) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    add = problems.append

    if not config.zone.startswith(config.region + "-"):
        add(
            ConfigProblem("park:zone", config.zone, f"must be a zone of gcp:region {config.region}")
        )

    version = gke_version_tuple(config.cluster.version)
    if version is None:
        add(
            ConfigProblem(
                "park:cluster.version",
                config.cluster.version,
                "not a GKE version; use e.g. 1.31.2-gke.1115000 or 1.32",
            )
        )

    problems += _check_tpu_pools(config, version)
    problems += _check_gpu_pools(config)
    problems += _check_training(config)
    problems += _check_serving(config)
    problems += _check_platform(config)
    problems += _check_queued(config)
    problems += _check_observability(config)
    return problems


def _capacity_problems(
    prefix: str, capacity: str, reservation: str | None, autoscaling: bool
) -> list[ConfigProblem]:
    """Capacity rules shared by TPU and GPU pools (GKE's own preconditions)."""
    out = []
    if capacity == "reservation" and not reservation:
        out.append(
            ConfigProblem(
                f"{prefix}.reservation",
                reservation,
                "capacity 'reservation' needs a reservation name",
            )
        )
    if capacity != "reservation" and reservation:
        out.append(
            ConfigProblem(
                f"{prefix}.reservation",
                reservation,
                f"a reservation name is only used with capacity 'reservation', not {capacity!r}",
            )
        )
    if capacity in ("flex-start", "queued") and not autoscaling:
        out.append(
            ConfigProblem(
                f"{prefix}.autoscaling",
                autoscaling,
                f"capacity {capacity!r} needs autoscaling (the pool starts at 0 nodes)",
            )
        )
    return out


def _check_tpu_pools(
    config: StackConfig, version: tuple[int, int, int, int] | None
) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    seen: set[str] = set()
    all_names = [p.name for p in config.tpu_pools] + [p.name for p in config.gpu_pools]
    for i, pool in enumerate(config.tpu_pools):
        prefix = f"park:tpuPools[{i}]"
        if not _NAME_RE.match(pool.name):
            problems.append(
                ConfigProblem(
                    f"{prefix}.name",
                    pool.name,
                    "must be lowercase letters, digits and '-', start with a letter, ≤ 30 chars",
                )
            )
        if pool.name in seen or all_names.count(pool.name) > 1:
            problems.append(
                ConfigProblem(f"{prefix}.name", pool.name, "duplicate pool name; names are unique")
            )
        seen.add(pool.name)
        if pool.slices < 1:
            problems.append(
                ConfigProblem(f"{prefix}.slices", pool.slices, "must be a positive integer")
            )
        try:
            tpu = pool.slice
        except catalog.CatalogError as err:
            bad_key = (
                "machineType" if pool.machine_type not in catalog.MACHINE_TYPES else "topology"
            )
            value = pool.machine_type if bad_key == "machineType" else pool.topology
            problems.append(ConfigProblem(f"{prefix}.{bad_key}", value, str(err)))
            continue
        generation = tpu.generation
        zones = (*generation.zones, *config.extra_tpu_zones)
        if config.zone not in zones:
            problems.append(
                ConfigProblem(
                    "park:zone",
                    config.zone,
                    f"no TPU {generation.name} known in this zone (pool {pool.name}); "
                    f"known: {', '.join(generation.zones)}; add a newer zone to park:extraTpuZones",
                )
            )
        floor = gke_version_tuple(generation.min_gke_version)
        if version is not None and floor is not None and version < floor:
            problems.append(
                ConfigProblem(
                    "park:cluster.version",
                    config.cluster.version,
                    f"TPU {generation.name} needs GKE ≥ {generation.min_gke_version}",
                )
            )
        problems += _capacity_problems(prefix, pool.capacity, pool.reservation, pool.autoscaling)
        if pool.max_run_duration and pool.capacity != "flex-start":
            problems.append(
                ConfigProblem(
                    f"{prefix}.maxRunDuration",
                    pool.max_run_duration,
                    "only used with capacity 'flex-start'",
                )
            )
    return problems


def _check_gpu_pools(config: StackConfig) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    names = [p.name for p in config.tpu_pools] + [p.name for p in config.gpu_pools]
    for i, pool in enumerate(config.gpu_pools):
        prefix = f"park:gpuPools[{i}]"
        if not _NAME_RE.match(pool.name):
            problems.append(
                ConfigProblem(f"{prefix}.name", pool.name, "must be a lowercase DNS-style name")
            )
        if names.count(pool.name) > 1:
            problems.append(
                ConfigProblem(f"{prefix}.name", pool.name, "duplicate pool name; names are unique")
            )
        if pool.capacity == "queued":
            problems.append(
                ConfigProblem(
                    f"{prefix}.capacity", pool.capacity, "queued GPU pools are not supported yet"
                )
            )
        problems += _capacity_problems(prefix, pool.capacity, pool.reservation, pool.autoscaling)
    return problems


def _check_pool_ref(key: str, name: str, config: StackConfig) -> list[ConfigProblem]:
    names = [p.name for p in config.tpu_pools]
    if name not in names:
        return [
            ConfigProblem(
                key,
                name,
                f"must name a TPU pool of park:tpuPools; allowed: {', '.join(names) or '(none)'}",
            )
        ]
    return []


def _slice_or_none(pool: TpuPoolConfig) -> catalog.TpuSlice | None:
    try:
        return pool.slice
    except catalog.CatalogError:
        return None


def _check_training(config: StackConfig) -> list[ConfigProblem]:
    training = config.training
    if not training.enabled:
        return []
    problems = _check_pool_ref("park:training.pool", training.pool, config)
    if problems or _slice_or_none(config.tpu_pool(training.pool)) is None:
        return problems  # the pool's own problem is reported under park:tpuPools
    pool = config.tpu_pool(training.pool)
    if training.num_slices > pool.slices:
        problems.append(
            ConfigProblem(
                "park:training.numSlices",
                training.num_slices,
                f"pool {pool.name} has {pool.slices} slice(s); allowed: 1..{pool.slices}",
            )
        )
    ray = tuple(int(x) for x in RAY_VERSION.split("."))
    if training.num_slices > 1 and ray < RAY_MULTISLICE_TORCH_MIN:
        problems.append(
            ConfigProblem(
                "park:training.numSlices",
                training.num_slices,
                f"the pinned Ray {RAY_VERSION} cannot train PyTorch across slices "
                f"(needs ≥ {'.'.join(map(str, RAY_MULTISLICE_TORCH_MIN))}); use 1",
            )
        )
    workers = pool.slice.chips * training.num_slices
    if training.global_batch_size % workers:
        problems.append(
            ConfigProblem(
                "park:training.globalBatchSize",
                training.global_batch_size,
                f"must be a multiple of the {workers} workers (one per chip)",
            )
        )
    if config.serving.enabled and config.serving.pool == training.pool:
        problems.append(
            ConfigProblem(
                "park:training.pool",
                training.pool,
                "training and serving must use different pools (a slice runs one of them)",
            )
        )
    return problems


def allowed_tensor_parallel(tpu: catalog.TpuSlice) -> list[int]:
    """TP sizes vLLM on TPU accepts on one slice: divisors of the chips, whole hosts past one."""
    return [
        tp
        for tp in range(1, tpu.chips + 1)
        if tpu.chips % tp == 0 and (tp <= tpu.chips_per_host or tp % tpu.chips_per_host == 0)
    ]


def _check_serving(config: StackConfig) -> list[ConfigProblem]:
    serving = config.serving
    if not serving.enabled:
        return []
    problems = _check_pool_ref("park:serving.pool", serving.pool, config)
    if not serving.models:
        problems.append(
            ConfigProblem("park:serving.models", [], "serving is enabled but serves no model")
        )
    if problems or _slice_or_none(config.tpu_pool(serving.pool)) is None:
        return problems
    tpu = config.tpu_pool(serving.pool).slice
    ray_hosts = RAY_SERVE_HOSTS_BY_TOPOLOGY.get((tpu.generation.name, tpu.topology))
    if ray_hosts is not None and ray_hosts != tpu.hosts:
        # Ray Serve LLM sizes a slice's placement group from the topology alone.
        problems.append(
            ConfigProblem(
                "park:serving.pool",
                serving.pool,
                f"Ray {RAY_VERSION} Serve LLM assumes {tpu.topology} is {ray_hosts} host(s), but "
                f"on {tpu.machine_type} it is {tpu.hosts}: the placement group would be "
                f"misshaped; serve from a pool of another machine type or topology",
            )
        )
    allowed = allowed_tensor_parallel(tpu)
    names: set[str] = set()
    for i, model in enumerate(serving.models):
        prefix = f"park:serving.models[{i}]"
        if model.name in names:
            problems.append(ConfigProblem(f"{prefix}.name", model.name, "duplicate model name"))
        names.add(model.name)
        tp = model.tensor_parallel_size or tpu.chips
        if tp not in allowed:
            problems.append(
                ConfigProblem(
                    f"{prefix}.tensorParallelSize",
                    tp,
                    f"does not fit a {tpu.machine_type} {tpu.topology} slice ({tpu.chips} chips, "
                    f"{tpu.chips_per_host} per host); allowed: {', '.join(map(str, allowed))}",
                )
            )
        if model.min_replicas > model.max_replicas:
            problems.append(
                ConfigProblem(
                    f"{prefix}.minReplicas",
                    model.min_replicas,
                    f"must not exceed maxReplicas ({model.max_replicas})",
                )
            )
        pool = config.tpu_pool(serving.pool)
        replicas_per_slice = max(1, tpu.chips // tp)
        if model.max_replicas > pool.slices * replicas_per_slice:
            problems.append(
                ConfigProblem(
                    f"{prefix}.maxReplicas",
                    model.max_replicas,
                    f"pool {pool.name} fits at most {pool.slices * replicas_per_slice} replica(s) "
                    f"of TP {tp}",
                )
            )
        reserved = {"tensor_parallel_size", "max_model_len", "enable_expert_parallel"}
        for key in reserved & set(model.engine_kwargs):
            problems.append(
                ConfigProblem(
                    f"{prefix}.engineKwargs.{key}",
                    model.engine_kwargs[key],
                    f"set it with its own key ({to_camel(key)}), not engineKwargs",
                )
            )
    return problems


_CHART_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")


def _check_queued(config: StackConfig) -> list[ConfigProblem]:
    """`capacity: queued` (DWS through Kueue) is for jobs that run to completion; the pool-level
    rules (autoscaling from 0, no reservation) are in _capacity_problems."""
    problems: list[ConfigProblem] = []
    serving = config.serving
    queued = {p.name for p in config.tpu_pools if p.capacity == "queued"}
    if serving.enabled and serving.pool in queued:
        problems.append(
            ConfigProblem(
                "park:serving.pool",
                serving.pool,
                "a queued pool only gets nodes for an admitted job that runs to completion; "
                "serve from an on-demand, spot, reservation or flex-start pool",
            )
        )
    if config.any_queued and not _CHART_VERSION_RE.match(config.kueue.version):
        problems.append(
            ConfigProblem(
                "park:kueue.version",
                config.kueue.version,
                f"a Kueue Helm chart version, e.g. {KUEUE_VERSION} (no leading 'v')",
            )
        )
    return problems


_IAP_MEMBER_RE = re.compile(r"^(user|group|serviceAccount|domain):[^\s]+$")


def _check_observability(config: StackConfig) -> list[ConfigProblem]:
    """The dashboard leaves the cluster only behind IAP, and only with all that IAP needs."""
    obs = config.observability
    problems: list[ConfigProblem] = []
    for i, member in enumerate(obs.iap_members):
        if not _IAP_MEMBER_RE.match(member):
            problems.append(
                ConfigProblem(
                    f"park:observability.iapMembers[{i}]",
                    member,
                    "an IAM member: user:, group:, serviceAccount: or domain: followed by a name",
                )
            )
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


# ---------------------------------------------------------------------------------------------
# Secrets, names, ranges and lifecycle: what GCP or Kubernetes would reject at `pulumi up`, or a
# guardrail of the policy pack (policy/) caught before anything runs.

# Config fields that hold credentials: `pulumi config set --secret --path <key>.<field>`.
SECRET_FIELDS = {"park:serving": ("hfToken",)}
_HIDDEN = "<plain text, not shown>"


def _without_secrets(values: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(values)
    for key, fields in SECRET_FIELDS.items():
        section = out.get(key)
        if isinstance(section, Mapping):
            out[key] = {k: v for k, v in section.items() if k not in fields}
    return out


def secret_problems(values: Mapping[str, Any], secret_keys: Collection[str]) -> list[ConfigProblem]:
    """A credential is stored encrypted (a secret key, or masked as SECRET_PLACEHOLDER by the
    offline reader), never in plain text in a stack file that is committed."""
    problems = []
    for key, fields in SECRET_FIELDS.items():
        section = values.get(key)
        if not isinstance(section, Mapping) or key in secret_keys:
            continue
        for name in fields:
            value = section.get(name)
            if value not in (None, "", SECRET_PLACEHOLDER):
                problems.append(
                    ConfigProblem(
                        f"{key}.{name}",
                        _HIDDEN,
                        "a credential in plain text; store it encrypted: "
                        f"pulumi config set --secret --path '{key}.{name}' <value>",
                    )
                )
    return problems


_DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_CLUSTER_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_BUCKET_RE = re.compile(r"^[a-z0-9][-a-z0-9_.]{1,61}[a-z0-9]$")
_REPOSITORY_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# Where every Ray pod already mounts something (infra/plan/ray.py): not for the bucket.
_RESERVED_MOUNTS = ("/", "/tmp", "/dev/shm", "/var/run/secrets/huggingface")


def _cidr(key: str, value: str, problems: list[ConfigProblem]) -> ipaddress.IPv4Network | None:
    try:
        return ipaddress.IPv4Network(value)
    except ValueError as err:
        problems.append(ConfigProblem(key, value, f"not an IPv4 CIDR range: {err}"))
        return None


def _check_platform(config: StackConfig) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    problems += _check_names(config)
    problems += _check_ranges(config)
    problems += _check_lifecycle(config)
    return problems


def _check_names(config: StackConfig) -> list[ConfigProblem]:
    """Names GKE, GCS, Artifact Registry and Kubernetes accept."""
    problems = []
    if not _DNS_LABEL_RE.match(config.namespace) or config.namespace.startswith("kube-"):
        problems.append(
            ConfigProblem(
                "park:namespace",
                config.namespace,
                "a Kubernetes namespace: lowercase letters, digits and '-', ≤ 63 chars, not kube-*",
            )
        )
    if not _CLUSTER_NAME_RE.match(config.cluster.name):
        problems.append(
            ConfigProblem(
                "park:cluster.name",
                config.cluster.name,
                "a GKE cluster name: lowercase letters, digits and '-', starts with a letter, "
                "≤ 40 chars",
            )
        )
    bucket = config.bucket_name
    if not _BUCKET_RE.match(bucket) or bucket.startswith("goog") or ".." in bucket:
        how = "" if config.storage.bucket else f" (derived from the project and stack: {bucket})"
        problems.append(
            ConfigProblem(
                "park:storage.bucket",
                config.storage.bucket or bucket,
                f"a bucket name: 3-63 lowercase letters, digits, '-', '_' or '.'{how}",
            )
        )
    mount = config.storage.mount_path
    if not mount.startswith("/") or mount.rstrip("/") in ("", *_RESERVED_MOUNTS):
        problems.append(
            ConfigProblem(
                "park:storage.mountPath",
                mount,
                f"an absolute path other than {', '.join(_RESERVED_MOUNTS)} (Ray pods mount "
                "those already)",
            )
        )
    if not _REPOSITORY_RE.match(config.registry.repository):
        problems.append(
            ConfigProblem(
                "park:registry.repository",
                config.registry.repository,
                "an Artifact Registry repository id: lowercase letters, digits and '-', starts "
                "with a letter",
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
    return problems


def _check_ranges(config: StackConfig) -> list[ConfigProblem]:
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
        key = f"park:cluster.masterAuthorizedNetworks[{i}].cidr"
        parsed = _cidr(key, authorized.cidr, problems)
        if parsed is not None and parsed.prefixlen == 0:
            problems.append(
                ConfigProblem(
                    key, authorized.cidr, "opens the control plane to everyone; list your ranges"
                )
            )
    return problems


def _check_lifecycle(config: StackConfig) -> list[ConfigProblem]:
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
