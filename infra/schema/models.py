"""The stack spec: a typed model of every `park:*` key (and the `gcp:*` ones the program reads).

Types, enums and ranges only. Rules that need the TPU catalog or several keys at once live in
`infra.rules`; numbers derived from the spec (chips, hosts, workers, slices, names) in
`infra.resolve`. Keys are camelCase in YAML and snake_case here; an unknown key is an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import Field

from infra import engines
from infra.schema._model import _Model
from infra.schema.jobs import RlConfig as RlConfig
from infra.schema.jobs import TrainingConfig as TrainingConfig
from infra.versions import KUBERAY_VERSION, KUEUE_VERSION

Capacity = Literal["on-demand", "spot", "reservation", "flex-start", "queued"]
CAPACITY_TYPES: tuple[str, ...] = get_args(Capacity)
# Named, so the component arguments' enums (infra/components/_types.py) are these very values.
ReleaseChannel = Literal["RAPID", "REGULAR", "STABLE", "EXTENDED"]
KubeRayInstall = Literal["addon", "helm"]
UpgradeStrategy = Literal["NewCluster", "NewClusterWithIncrementalUpgrade", "None"]
# The serving engines: the names of infra/engines.py's records (a row there is a value here).
if TYPE_CHECKING:
    EngineName = str
else:
    EngineName = Literal[engines.ENGINE_NAMES]
# What the offline reader puts where a stack file holds a `secure:` value.
SECRET_PLACEHOLDER = "[secret]"

# Bounds: past these a number is a typo, and several drive work (one GKE node pool and one
# Pulumi resource per slice, one LLMConfig per model) or meaning (a disk, a price).
MAX_TPU_POOLS = 32
MAX_GPU_POOLS = 16
MAX_TPU_SLICES = 512  # across every TPU pool of a stack: each slice is a GKE node pool
MAX_SERVED_MODELS = 16
MAX_REPLICAS = MAX_TPU_SLICES  # each replica holds a whole slice
MAX_NODES = 15_000  # GKE Standard's nodes per cluster (infra/rules/values.py says more)
MAX_DISK_GB = 65_536  # Persistent Disk's largest boot disk (64 TiB)
MAX_AUTHORIZED_NETWORKS = 100  # GKE's own limit (with a private endpoint; 50 without)
MAX_ITEMS = 100  # any other list or mapping of the spec
MAX_PRICE = 1_000_000.0  # $/hour of anything: a larger one is a typo, and it scales every total
Price = Annotated[float, Field(ge=0, le=MAX_PRICE, allow_inf_nan=False)]


class AuthorizedNetwork(_Model):
    cidr: str
    """A range allowed to reach the control plane, e.g. `203.0.113.0/24` (never `0.0.0.0/0`)."""
    name: str = "authorized"
    """A label for it."""


class NetworkConfig(_Model):
    """A new VPC (default) or an existing network and subnetwork by name."""

    existing_network: str | None = None
    """Use this network instead of creating a VPC."""
    existing_subnetwork: str | None = None
    """Its subnet, carrying the pods/services ranges."""
    subnet_cidr: str = "10.10.0.0/20"
    """Node range of the new subnet."""
    pods_cidr: str = "10.16.0.0/14"
    """Secondary range for pods."""
    services_cidr: str = "10.20.0.0/20"
    """Secondary range for services."""
    master_cidr: str = "172.16.0.0/28"
    """/28 of the private control plane."""
    pods_range_name: str = "pods"
    """Name of the pods secondary range."""
    services_range_name: str = "services"
    """Name of the services secondary range."""


class ClusterConfig(_Model):
    name: str | None = None
    """GKE cluster name (default `park-<stack>`)."""
    release_channel: ReleaseChannel = "REGULAR"
    """RAPID, REGULAR, STABLE or EXTENDED; upgrades the cluster."""
    # None: the channel's default version. A pin is GKE's initial version (a minor such as
    # "1.35" takes its newest patch); the channel upgrades the cluster from there.
    version: str | None = None
    """Unset: the channel's default. A pin (`1.35`) is the initial version."""
    dns_endpoint: bool = True
    """DNS-based control-plane endpoint (IAM); the kubeconfig uses it."""
    private_nodes: bool = True
    """Nodes without public IPs (egress through Cloud NAT)."""
    private_endpoint: bool = False
    """Control plane reachable only from the VPC."""
    master_authorized_networks: list[AuthorizedNetwork] = Field(
        [], max_length=MAX_AUTHORIZED_NETWORKS
    )
    """`[{cidr, name}]` allowed to reach the control plane."""
    deletion_protection: bool = True
    """Refuse `pulumi destroy` of the cluster."""


class CpuPoolConfig(_Model):
    machine_type: str = "e2-standard-8"
    """Machine type."""
    min_nodes: int = Field(1, ge=0, le=MAX_NODES)
    """Autoscaling minimum."""
    max_nodes: int = Field(3, ge=1, le=MAX_NODES)
    """Autoscaling maximum."""
    # Boot disk, GB (GKE: 15 GB at least from 1.36.3-gke.1480000). Unset: what the pods
    # scheduled there need (infra.resolve.disk); set below that, validation refuses it.
    disk_size_gb: int | None = Field(None, ge=15, le=MAX_DISK_GB)
    """Boot disk, GB; unset: what its pods need (`park validate`)."""


class KubeRayConfig(_Model):
    install: KubeRayInstall = "addon"
    """`addon` (GKE Ray Operator add-on, with the TPU webhook) or `helm`."""
    version: str = KUBERAY_VERSION
    """kuberay-operator chart version (helm)."""
    logging: bool = False
    """Ray add-on: Ray logs to Cloud Logging."""
    monitoring: bool = False
    """Ray add-on: Ray metrics to Managed Prometheus."""
    tpu_webhook_chart: str | None = None
    """helm, multi-host: path of the kuberay-tpu-webhook chart."""


class KueueConfig(_Model):
    """Kueue, installed by Helm only when a TPU pool is queued (DWS) or has a capacity ladder."""

    version: str = KUEUE_VERSION
    """Kueue Helm chart version (OCI, registry.k8s.io)."""
    pods_ready_timeout_s: int = Field(1800, ge=300, le=86_400)
    """Seconds an admitted job's pods may take to start before Kueue evicts and requeues it
    (a stockout on its rung): node creation, image pull and Ray's start."""


# A ladder's rungs: one node pool per rung and slice, one Kueue flavor per rung. Bounded: past
# this it is a typo (each rung is `slices` node pools), and Kueue's ConcurrentAdmission takes
# at most 16 flavors per ClusterQueue.
MAX_RUNGS = 6


class CapacityRung(_Model):
    """One rung of a TPU pool's capacity ladder: how its nodes are obtained, tried in order."""

    capacity: Capacity
    """on-demand, spot, reservation, flex-start or queued."""
    reservation: str | None = None
    """Reservation, block or sub-block path (capacity `reservation` only)."""
    max_run_duration: str | None = None
    """flex-start: longest a node lives, e.g. `86400s`."""


class TpuPoolConfig(_Model):
    name: str
    """Pool name (node pools are `<name>-s<i>`)."""
    machine_type: str
    """ct6e-standard-1t, -4t or -8t."""
    topology: str
    """Slice topology the machine type offers (e.g. 2x4, 4x4)."""
    slices: int = Field(1, le=MAX_TPU_SLICES)
    """Number of slices (node pools)."""
    capacity: Capacity = "on-demand"
    """on-demand, spot, reservation, flex-start or queued."""
    reservation: str | None = None
    """Reservation name (capacity `reservation` only)."""
    autoscaling: bool = True
    """Scale each slice between 0 and its hosts."""
    max_run_duration: str | None = None
    """flex-start: longest a node lives, e.g. `86400s`."""
    ladder: list[CapacityRung] | None = Field(None, min_length=1, max_length=MAX_RUNGS)
    """Capacity tried in order (instead of `capacity`): one node pool per rung and slice; Kueue
    admits each job on the first rung with room."""
    # Boot disk, GB (GKE: 15 GB at least from 1.36.3-gke.1480000). Unset: what the pods
    # scheduled there need (infra.resolve.disk); set below that, validation refuses it.
    disk_size_gb: int | None = Field(None, ge=15, le=MAX_DISK_GB)
    """Boot disk, GB; unset: what its pods need (`park validate`)."""

    def rungs(self) -> list[CapacityRung]:
        """The ladder, or the pool's own capacity as a ladder of one rung."""
        if self.ladder:
            return list(self.ladder)
        one = CapacityRung(
            capacity=self.capacity,
            reservation=self.reservation,
            max_run_duration=self.max_run_duration,
        )
        return [one]


class GpuPoolConfig(_Model):
    name: str
    """Pool name."""
    machine_type: str
    """e.g. a3-highgpu-8g."""
    accelerator_type: str
    """e.g. nvidia-h100-80gb."""
    accelerator_count: int = Field(8, ge=1, le=16)
    """GPUs per node."""
    nodes: int = Field(1, ge=1, le=MAX_NODES)
    """Maximum nodes (0 while idle)."""
    capacity: Capacity = "on-demand"
    """on-demand, spot, reservation or flex-start."""
    reservation: str | None = None
    """Reservation name (capacity `reservation` only)."""
    autoscaling: bool = True
    """Scale between 0 and `nodes`."""
    disk_size_gb: int = Field(200, ge=15, le=MAX_DISK_GB)
    """Boot disk, GB (at least 15)."""


class StorageConfig(_Model):
    bucket: str | None = None
    """Bucket name (default `<project>-<stack>-park`)."""
    location: str | None = None
    """Bucket location (default: the region)."""
    versioning: bool = True
    """Object versioning."""
    force_destroy: bool = False
    """Let `pulumi destroy` delete a non-empty bucket."""
    mount_path: str = "/data"
    """Where Ray pods see the bucket (GCS FUSE)."""


class RegistryConfig(_Model):
    repository: str | None = None
    """Repository id (default `park-<stack>`)."""
    create: bool = True
    """`false`: use an existing repository, e.g. one stacks share."""


# A served model whose source is this serves the training run's final export.
TRAINING_SOURCE = "training"
# ... and this, the RL (park:rl) run's final policy.
RL_SOURCE = "rl"


class ServedModel(_Model):
    name: str
    """OpenAI model id clients ask for."""
    # Hugging Face id, gs://..., a path under the bucket mount, or "training" / "rl": the
    # training (or RL) run's final export, from the bucket mount.
    source: str
    """HF id, `gs://` (own bucket: mounted), `training` or `rl`."""
    # The model a fine-tuned source was trained from: its facts (architecture, heads, size)
    # stand in for the source's at preview. Default: the source's own; for source: training,
    # park:training.model.
    base_model: str | None = None
    """The model a fine-tuned source was trained from: its facts (architecture, size) stand in
    for the source's at preview, when its config cannot be read then (a run not yet done)."""
    tensor_parallel_size: int | None = Field(None, ge=1, le=4096)
    """Default: every chip of one slice."""
    max_model_len: int = Field(8192, ge=16, le=1 << 24)
    """Context length."""
    enable_expert_parallel: bool = False
    """For MoE models."""
    min_replicas: int = Field(1, ge=0, le=MAX_REPLICAS)
    """Serve autoscaling minimum; each replica holds a whole slice."""
    max_replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    """Serve autoscaling maximum."""
    engine_kwargs: dict[str, Any] = Field({}, max_length=MAX_ITEMS)
    """Other vLLM engine arguments."""


class ServingConfig(_Model):
    enabled: bool = False
    """Create the RayService."""
    pool: str = ""
    """TPU pool it runs on (not training's)."""
    image: str | None = None
    """Image; default: the engine's, built from this checkout by `pulumi up`."""
    engine: EngineName = Field(engines.DEFAULT_ENGINE, description=engines.describe())
    models: list[ServedModel] = Field([], max_length=MAX_SERVED_MODELS)
    """Served models."""
    upgrade_strategy: UpgradeStrategy = "None"
    """`None` (in place), `NewCluster` (blue/green: twice the slices) or
    `NewClusterWithIncrementalUpgrade`."""
    expose_publicly: bool = False
    """A LoadBalancer for the OpenAI endpoint (else a ClusterIP Service)."""


class PricesConfig(_Model):
    """`park:prices`: your own rates over infra/data/prices.yaml (negotiated, regional, newer)."""

    source: str | None = None
    """Where your prices come from, shown by `park cost`."""
    tpu_chip_hour: dict[Capacity, Price] = {}
    """$/chip-hour by capacity type, e.g. `{on-demand: 2.5, spot: 0.95}`."""
    machine_hour: dict[str, Price] = Field({}, max_length=MAX_ITEMS)
    """$/hour by machine type of the CPU and GPU pools."""
    cluster_hour: float | None = Field(None, ge=0, le=MAX_PRICE, allow_inf_nan=False)
    """GKE cluster management fee, $/hour."""


class ObservabilityConfig(_Model):
    """Metrics to Managed Prometheus and how people reach the dashboards (private by default)."""

    pod_monitoring: bool = True
    """PodMonitoring for Ray head and workers."""
    tpu_metrics: bool = True
    """TPU chip metrics (`ray_tpu_*`, from the TPU device plugin)."""
    expose_dashboard: bool = False
    """Opt-in: the RayService's Ray dashboard behind IAP."""
    iap_members: list[str] = Field([], max_length=MAX_ITEMS)
    """Who IAP lets in, e.g. `group:ml@example.com`."""
    dashboard_domain: str | None = None
    """Host name of the IAP-protected dashboard (certificate)."""
    # IAP's OAuth client: its id, and the name of a Secret in the workload namespace whose key
    # "key" holds the client secret (created out of band: the secret never enters the stack).
    iap_oauth_client_id: str | None = None
    """OAuth client id IAP signs users in with."""
    iap_oauth_secret: str | None = None
    """Secret (key `key`) holding that client's secret."""
    grafana: bool = False
    """A Grafana dashboard ConfigMap (`grafana_dashboard: "1"`)."""
    training_metrics: bool = True
    """Loss and tokens/s as log-based metrics."""
    scrape_interval: str = Field("30s", pattern=r"^[0-9]{1,5}(ms|s|m|h)$")
    """Managed Prometheus scrape interval of Ray pods."""


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
    """Rule name → mandatory, advisory or disabled."""
    prod_like: bool | None = None
    """Treat as production (default: stack name starts with `prod`)."""
    # What a production stack may expose on purpose (infra/rules/security.py): a control plane
    # reachable from the internet, nodes with public IPs, a public serving endpoint. Without
    # it these are refused on production stacks and warned about elsewhere.
    acknowledge_public: list[Literal["control-plane", "nodes", "serving"]] = []
    """What a production stack exposes on purpose (control-plane, nodes, serving); otherwise
    refused there, warned elsewhere."""

    def is_prod_like(self, stack: str) -> bool:
        """Prod-like stacks keep deletion protection (config rules and the policy pack)."""
        return self.prod_like if self.prod_like is not None else stack.startswith("prod")

    def level(self, rule: PolicyRule, default: str = "mandatory") -> str:
        return self.enforcement.get(rule, default)


class StackConfig(_Model):
    """Everything one stack declares, validated."""

    project: str
    """GCP project id (placeholder in the shipped stacks: `pulumi config set`)."""
    region: str
    """Region of the network, registry and bucket."""
    stack: str = "dev"
    """The Pulumi stack's name (from the stack file's name, not a key)."""
    zone: str
    """Zone of the cluster and every pool; must offer TPU v6e."""
    extra_tpu_zones: list[str] = Field([], max_length=MAX_ITEMS)
    """Zones to accept beyond the catalog's known zones of the TPU generation."""
    namespace: str = "park"
    """Kubernetes namespace of the Ray workloads."""
    # park:hfToken, a Pulumi secret (or an ESC environment's pulumiConfig): one Hugging Face
    # token for the training RayJob and the RayService. The spec holds SECRET_PLACEHOLDER when
    # one is set, never the token: the program reads it itself, as a secret Output.
    hf_token: Literal["[secret]"] | None = None
    """Secret: `pulumi config set --secret park:hfToken` (or ESC); gated models."""
    # park:iapOauthClientSecret, a Pulumi secret like park:hfToken: the IAP OAuth client's
    # secret, which the program stores as the Secret park:observability.iapOauthSecret names
    # (in the namespace the same `up` creates: no step before `up`).
    iap_oauth_client_secret: Literal["[secret]"] | None = None
    """Secret: the IAP OAuth client's secret (`pulumi config set --secret`); exposeDashboard."""
    network: NetworkConfig = NetworkConfig()
    """New VPC (default) or an existing network."""
    cluster: ClusterConfig = ClusterConfig()
    """The GKE Standard cluster."""
    cpu_pool: CpuPoolConfig = CpuPoolConfig()
    """The CPU pool for Ray heads and system pods."""
    kuberay: KubeRayConfig = KubeRayConfig()
    """How KubeRay gets onto the cluster."""
    kueue: KueueConfig = KueueConfig()
    """Kueue, installed only when a TPU pool is `queued`."""
    tpu_pools: list[TpuPoolConfig] = Field([], max_length=MAX_TPU_POOLS)
    """TPU pools: one GKE node pool per slice."""
    gpu_pools: list[GpuPoolConfig] = Field([], max_length=MAX_GPU_POOLS)
    """Optional GPU pools beside the TPU pools."""
    storage: StorageConfig = StorageConfig()
    """The bucket for checkpoints and models."""
    registry: RegistryConfig = RegistryConfig()
    """The Artifact Registry repository for workload images."""
    training: TrainingConfig = TrainingConfig()
    """The training RayJob."""
    serving: ServingConfig = ServingConfig()
    """The serving RayService."""
    rl: RlConfig = RlConfig()
    """A GRPO RayJob: learner and vLLM rollout engines on their own pools."""
    prices: PricesConfig = PricesConfig()
    """Override list prices for `park cost` (the output names the source)."""
    observability: ObservabilityConfig = ObservabilityConfig()
    """Metrics and dashboards."""
    policy: PolicyConfig = PolicyConfig()
    """Policy pack settings for this stack."""
