"""The stack spec: a typed model of every `park:*` key (and the `gcp:*` ones the program reads).

Types, enums and ranges only. Rules that need the TPU catalog or several keys at once live in
`infra.rules`; numbers derived from the spec (chips, hosts, workers, slices, names) in
`infra.resolve`. Keys are camelCase in YAML and snake_case here; an unknown key is an error.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat
from pydantic.alias_generators import to_camel

from infra.versions import KUBERAY_VERSION, KUEUE_VERSION

Capacity = Literal["on-demand", "spot", "reservation", "flex-start", "queued"]
CAPACITY_TYPES: tuple[str, ...] = get_args(Capacity)
# What the offline reader puts where a stack file holds a `secure:` value.
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
    name: str | None = None  # default: park-<stack>
    release_channel: Literal["RAPID", "REGULAR", "STABLE", "EXTENDED"] = "REGULAR"
    # None: the channel's default version. A pin is GKE's initial version (a minor such as
    # "1.35" takes its newest patch); the channel upgrades the cluster from there.
    version: str | None = None
    dns_endpoint: bool = True  # the DNS-based control-plane endpoint (IAM-authorized)
    private_nodes: bool = True
    private_endpoint: bool = False
    master_authorized_networks: list[AuthorizedNetwork] = []
    deletion_protection: bool = True


class CpuPoolConfig(_Model):
    machine_type: str = "e2-standard-8"
    min_nodes: int = Field(1, ge=0)
    max_nodes: int = Field(3, ge=1)
    # Boot disk, GB (GKE: 15 GB at least from 1.36.3-gke.1480000). Unset: what the pods
    # scheduled there need (infra.disk); set below that, validation refuses it.
    disk_size_gb: int | None = Field(None, ge=15)


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
    # Boot disk, GB (GKE: 15 GB at least from 1.36.3-gke.1480000). Unset: what the pods
    # scheduled there need (infra.disk); set below that, validation refuses it.
    disk_size_gb: int | None = Field(None, ge=15)


class GpuPoolConfig(_Model):
    name: str
    machine_type: str  # e.g. a3-highgpu-8g
    accelerator_type: str  # e.g. nvidia-h100-80gb
    accelerator_count: int = Field(8, ge=1)
    nodes: int = Field(1, ge=1)  # max nodes; the pool scales to 0 while idle
    capacity: Capacity = "on-demand"
    reservation: str | None = None
    autoscaling: bool = True
    disk_size_gb: int = Field(200, ge=15)  # GKE: 15 GB from 1.36.3-gke.1480000


class StorageConfig(_Model):
    bucket: str | None = None  # default: <project>-<stack>-park
    location: str | None = None  # default: the region
    versioning: bool = True
    force_destroy: bool = False
    mount_path: str = "/data"  # where pods see the bucket (GCS FUSE)


class RegistryConfig(_Model):
    repository: str | None = None  # default: park-<stack>
    create: bool = True  # false: use an existing repository (e.g. one several stacks share)


class TrainingConfig(_Model):
    """The training RayJob: a Hugging Face causal LM (or a GPT preset) on the stack's data.

    Each key is a flag of `python -m workloads.train` (workloads/train/config.py), rendered into
    the RayJob's entrypoint and checked by that config's own rules at preview time."""

    enabled: bool = False
    pool: str = ""
    image: str | None = None  # default: <registry>/park-workloads:<version>
    strategy: Literal["ddp", "fsdp2"] = "fsdp2"
    # A Hugging Face causal LM: hub id, gs://..., a path under the bucket mount, or
    # park:tiny-llama (built on the worker). Unset: the GPT preset of model_size.
    model: str | None = None
    tokenizer: str | None = None  # default: the model's
    init: Literal["auto", "pretrained", "config"] = "auto"  # auto: pretrained, config for park:
    model_size: Literal["tiny", "small", "gpt2-small", "gpt2-medium", "1b"] = "gpt2-small"
    steps: int = Field(1000, ge=1)
    global_batch_size: int = Field(64, ge=1)
    # Sequences per chip per forward/backward (gradient accumulation over the rest of the
    # chip's share of the global batch). Unset: the largest that fits (infra.training_fit).
    micro_batch_size: int | None = Field(None, ge=1)
    seq_len: int = Field(1024, ge=8)
    learning_rate: float = Field(3e-4, gt=0)
    warmup_steps: int = Field(10, ge=0)
    lr_schedule: Literal["cosine", "linear", "constant"] = "cosine"
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    # "synthetic", token files (.bin/.npy), text (.jsonl/.json/.parquet/.txt: a file or a
    # folder, under the bucket mount or gs://...), hf:NAME[:CONFIG], or park:facts.
    data: str = "synthetic"
    objective: Literal["clm", "sft"] = "clm"  # sft: chat template, loss on responses only
    data_split: str = "train"
    text_field: str = "text"
    messages_field: str = "messages"
    prompt_field: str = "prompt"
    response_field: str = "completion"
    checkpoint_every: int = Field(100, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    export: bool = True  # a Hugging Face folder at the end of the run (model runs only)
    export_every: int = Field(0, ge=0)  # also every Nth checkpoint
    export_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    export_max_shard_size: str = Field("5GB", pattern=r"^[0-9]+(\.[0-9]+)?\s*([KMGT]i?B)$")
    activation_checkpointing: bool = False
    num_slices: int = Field(1, ge=1)
    max_failures: int = Field(3, ge=0)
    ttl_seconds_after_finished: int = Field(600, ge=0)
    active_deadline_seconds: int = Field(86400, ge=60)
    backoff_limit: int = Field(0, ge=0)
    estimated_step_seconds: float = Field(1.0, gt=0)  # for `park cost`'s run estimate


# A served model whose source is this serves the training run's final export.
TRAINING_SOURCE = "training"
# ... and this, the RL (park:rl) run's final policy.
RL_SOURCE = "rl"


class ServedModel(_Model):
    name: str  # the OpenAI model id clients ask for
    # Hugging Face id, gs://..., a path under the bucket mount, or "training" / "rl": the
    # training (or RL) run's final export, from the bucket mount.
    source: str
    # The model a fine-tuned source was trained from: its facts (architecture, heads, size)
    # stand in for the source's at preview. Default: the source's own; for source: training,
    # park:training.model.
    base_model: str | None = None
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


class RlConfig(_Model):
    """`park:rl`: a GRPO job (workloads/rl) on two pools of one Ray cluster: a learner (Ray
    Train, one worker per chip, FSDP2) and vLLM rollout engines exchanging weights. Each key is
    a flag of `python -m workloads.rl` (workloads/rl/config.py); infra/rules/rl.py checks both
    sides' fit."""

    enabled: bool = False
    learner_pool: str = ""  # a TPU pool of park:tpuPools
    rollout_pool: str = ""  # a TPU pool of park:tpuPools, or a GPU pool of park:gpuPools
    image: str | None = None  # default: <registry>/park-workloads:<version>
    model: str = ""  # HF id, gs://..., or a path under the bucket mount
    init: Literal["pretrained", "config"] = "pretrained"
    # Prompts with reference answers: .jsonl/.json/.parquet (under the bucket mount or
    # gs://...), or hf:NAME[:CONFIG].
    data: str = ""
    data_split: str = "train"
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    group_size: int = Field(8, ge=1)  # completions per prompt (the rules ask for 2 or more)
    prompts_per_step: int = Field(32, ge=1)
    sampling_temperature: float = Field(1.0, gt=0)
    max_prompt_tokens: int = Field(512, ge=1)
    max_response_tokens: int = Field(1024, ge=1)
    # Built-ins (exact_match, numeric, format) or module:function importable on the cluster.
    rewards: list[str] = ["numeric"]
    reward_weights: list[float] | None = None
    kl_coef: float = Field(0.0, ge=0)
    max_staleness: int = Field(1, ge=0)  # policy versions a rollout may lag the learner
    sync_every: int = Field(1, ge=1)  # publish the policy every N learner steps
    steps: int = Field(200, ge=1)
    learning_rate: float = Field(1e-6, ge=0)
    strategy: Literal["ddp", "fsdp2"] = "fsdp2"
    micro_batch_size: int | None = Field(None, ge=1)  # unset: the most that fit
    activation_checkpointing: bool = False
    tensor_parallel_size: int | None = Field(None, ge=1)  # per engine; default: the most allowed
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    checkpoint_every: int = Field(50, ge=1)
    export: bool = True  # the final policy as a Hugging Face folder (servable)
    max_failures: int = Field(3, ge=0)
    ttl_seconds_after_finished: int = Field(600, ge=0)
    active_deadline_seconds: int = Field(86400, ge=60)
    backoff_limit: int = Field(0, ge=0)
    estimated_step_seconds: float = Field(30.0, gt=0)  # for `park cost`'s run estimate


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
    # What a production stack may expose on purpose (infra/rules/security.py): a control plane
    # reachable from the internet, nodes with public IPs, a public serving endpoint. Without
    # it these are refused on production stacks and warned about elsewhere.
    acknowledge_public: list[Literal["control-plane", "nodes", "serving"]] = []

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
    # park:hfToken, a Pulumi secret (or an ESC environment's pulumiConfig): one Hugging Face
    # token for the training RayJob and the RayService. The spec holds SECRET_PLACEHOLDER when
    # one is set, never the token: the program reads it itself, as a secret Output.
    hf_token: Literal["[secret]"] | None = None
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
    rl: RlConfig = RlConfig()
    prices: PricesConfig = PricesConfig()
    observability: ObservabilityConfig = ObservabilityConfig()
    policy: PolicyConfig = PolicyConfig()
