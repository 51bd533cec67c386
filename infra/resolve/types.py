"""The plan's records: what resolve derives for each piece of a stack, frozen.

Every layer above reads these (plan functions, rules, components, tools); the functions that
build them sit beside, in this package: `stack.resolve` for the whole StackPlan, `training`,
`rl`, `disk` and `host_memory` for their pieces. The records import none of those functions, so
the package has no cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from infra import catalog, engine, engines
from infra.model_facts import FactsLookup
from infra.ray_serve import SERVE_START_ATTEMPTS_PER_REPLICA
from infra.resolve.training import RunLimits
from infra.resolve.training_fit import TrainingFit
from infra.schema.models import (
    RL_SOURCE,
    TRAINING_SOURCE,
    GpuPoolConfig,
    RlConfig,
    ServedModel,
    ServingConfig,
    TpuPoolConfig,
    TrainingConfig,
)

# Images, by what runs in them: one TorchTPU image for training and the default engine; each
# serving engine's own in its record (infra.engines).
WORKLOAD_IMAGE = engines.WORKLOAD_IMAGE
CHECKPOINTS_PREFIX = "checkpoints"


# A rung's short name in its node pools' names and its nodes' label (GKE node pool names
# are at most 40 characters).
RUNG_TAGS = {
    "reservation": "rsv",
    "spot": "spot",
    "flex-start": "flex",
    "queued": "dws",
    "on-demand": "od",
}


@dataclass(frozen=True)
class RungPlan:
    """One rung of a pool's capacity ladder (infra.schema.models.CapacityRung), resolved:
    its place in the ladder and the tag its node pools, label, taint and Kueue flavor carry."""

    index: int  # position in the ladder: Kueue tries the rungs in this order
    capacity: str
    reservation: str | None
    max_run_duration: str | None
    tag: str  # unique in its pool: rsv, spot, flex, dws, od (rsv2... when a kind repeats)

    @property
    def nodes_expire(self) -> bool:
        """Nodes that go away on a clock (flex-start's run duration, DWS's booking)."""
        return self.capacity in ("flex-start", "queued")

    @property
    def preemptible(self) -> bool:
        return self.capacity == "spot"


def rungs_of(spec: TpuPoolConfig) -> tuple[RungPlan, ...]:
    """The pool's ladder (its own capacity as one rung when it has none), tagged."""
    rungs: list[RungPlan] = []
    for index, rung in enumerate(spec.rungs()):
        base = RUNG_TAGS[rung.capacity]
        repeats = sum(1 for r in rungs if r.capacity == rung.capacity)
        rungs.append(
            RungPlan(
                index=index,
                capacity=rung.capacity,
                reservation=rung.reservation,
                max_run_duration=rung.max_run_duration,
                tag=base if repeats == 0 else f"{base}{repeats + 1}",
            )
        )
    return tuple(rungs)


@dataclass(frozen=True)
class PoolPlan:
    """One TPU pool of `park:tpuPools`: `slices` slices of one (machine type, topology)."""

    index: int  # position in park:tpuPools, for config keys
    spec: TpuPoolConfig
    slice: catalog.TpuSlice  # one slice: chips, hosts, labels (the catalog's answer)
    total_chips: int  # every slice of the pool
    total_hosts: int
    # The capacity ladder in the order Kueue tries it (one rung without a ladder): derived from
    # the (frozen) spec once, here, since every node pool, flavor and rule of the pool reads it.
    rungs: tuple[RungPlan, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rungs", rungs_of(self.spec))

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def slices(self) -> int:
        return self.spec.slices

    @property
    def laddered(self) -> bool:
        """More than one rung: one node pool per rung and slice, walked by Kueue."""
        return len(self.rungs) > 1

    @property
    def capacity(self) -> str:
        """The first rung's: what the pool gets when all goes well."""
        return self.rungs[0].capacity

    @property
    def queued(self) -> bool:
        """A rung is DWS's queued provisioning."""
        return any(r.capacity == "queued" for r in self.rungs)

    @property
    def kueue(self) -> bool:
        """Jobs on the pool wait in a Kueue queue: a queued rung, or a ladder to walk."""
        return self.queued or self.laddered

    @property
    def key(self) -> str:
        return f"park:tpuPools[{self.index}]"


@dataclass(frozen=True)
class GpuPoolPlan:
    index: int
    spec: GpuPoolConfig
    total_gpus: int  # at full size


@dataclass(frozen=True)
class TrainingPlan:
    """The training RayJob: one Ray Train worker per device (a chip but on TPU7x) of `slices`
    slices of its pool."""

    spec: TrainingConfig
    pool: PoolPlan
    slices: int
    workers: int  # devices of those slices (chips but on TPU7x)
    hosts: int  # TPU hosts (Ray worker pods) of those slices
    image: str
    run_name: str
    storage_path: str  # where Ray Train keeps checkpoints (the stack's bucket)
    queue_name: str | None  # the Kueue LocalQueue when the pool is queued
    export_path: str | None  # the final Hugging Face export (model runs with export on)
    facts: FactsLookup  # the model's heads, layers, size... or why they are not known
    # What one chip holds at the chosen micro-batch (infra.training_fit), when the facts and
    # the batch are known; the rules refuse a run whose fit does not fit.
    fit: TrainingFit | None
    micro_batch: int  # sequences per chip per forward/backward: the pin, or the most that fit
    accumulation_steps: int  # micro-batches per optimizer step
    # The RayJob's deadline and retries, the trainer's wait for its staged model, and from them
    # when the run's export exists or never will (infra.resolve_training.RunLimits).
    limits: RunLimits
    # What the trainer loads for park:training.model: a hub model's staged copy in the bucket,
    # through the pods' mount (infra.disk), else the spec's source as is.
    model_path: str | None = None


@dataclass(frozen=True)
class ModelWait:
    """How a serving replica waits for a folder another job writes: its marker (workloads/
    protocol.py), the bound (the writer's own: a run's RayJob deadlines, a staging's bound) and
    what writes it, for the replica's message."""

    timeout_s: int
    marker: str
    writer: str


@dataclass(frozen=True)
class ServedModelPlan:
    """One served model: its TP, the slices its replicas hold, what it is and how it fits."""

    index: int
    spec: ServedModel
    source: str | None  # what the engine loads: spec.source, or the training run's export
    base_model: str | None  # whose facts stand for it (baseModel, or the run's model)
    tensor_parallel: int  # default: every chip of one slice
    min_slices: int  # one whole slice per replica (module docstring)
    max_slices: int
    idle_devices_per_replica: int
    facts: FactsLookup  # heads, layers, size... or why they are not known (infra.model_facts)
    fit: engine.Fit | None  # weights and KV cache per chip, when the facts are known
    memory_utilization: float  # what the engine keeps of each chip's HBM
    # A model whose folder another job writes (the run's export, a hub model's staging): its
    # replica waits for the folder's marker inside its start (workloads/serve/wait.py).
    wait: ModelWait | None = None
    # Failed starts Serve allows before DEPLOY_FAILED (deployment_config
    # max_constructor_retry_count): SERVE_START_ATTEMPTS_PER_REPLICA per replica it may want.
    start_attempts: int = SERVE_START_ATTEMPTS_PER_REPLICA
    # The engine's batch as the fit costs it and the render pins it (EngineSettings.pinned):
    # max_num_seqs and max_num_batched_tokens, each one number read by both.
    settings: engine.EngineSettings = field(default_factory=engine.EngineSettings)
    # Seconds one max-length stream may take on its slice (engine.max_stream_s): how long a
    # replica, a reloaded HAProxy or an upgrade's old cluster drains before it cuts streams.
    drain_s: int = engine.DRAIN_FLOOR_S

    @property
    def key(self) -> str:
        return f"park:serving.models[{self.index}]"

    @property
    def target_ongoing_requests(self) -> int:
        """Serve's autoscaling target per replica: the requests its engine batches at once,
        max_num_seqs, or fewer when the KV cache holds fewer max-length ones. Below it another
        replica adds nothing; above it requests queue in vLLM's scheduler. (Ray LLM merges
        1e9 in otherwise, and the deployment never scales: L/core/server/builder.py:27-34.)"""
        batch = self.settings.max_num_seqs
        return max(1, min(batch, self.fit.sequences) if self.fit else batch)

    @property
    def from_training(self) -> bool:
        """It serves a run of the stack: the training run (source: training) or the RL run's
        final policy (source: rl)."""
        return self.spec.source in (TRAINING_SOURCE, RL_SOURCE)


@dataclass(frozen=True)
class ServingPlan:
    """The serving RayService on one pool, and how many of its slices the models hold."""

    spec: ServingConfig
    pool: PoolPlan
    models: tuple[ServedModelPlan, ...]
    image: str
    min_slices: int  # held at the models' minReplicas: the worker group's starting size
    max_slices: int  # held at maxReplicas: the worker group's maximum
    slice_budget: int  # slices one RayService cluster may hold (halved for blue/green)
    upgrade_clusters: int  # Ray clusters during an upgrade: 2 for NewCluster*, else 1
    # The KubeRay release that runs it: the chart's (install: helm), or the one GKE's add-on is
    # taken to run (infra.gke.addon_kuberay); "" when not known (a partial plan).
    kuberay: str = ""


RL_JOB_NAME = "park-rl"
ROLLOUT_ENGINE = engines.DEFAULT_ENGINE  # the project's image: vLLM on torch_tpu, as serving


@dataclass(frozen=True)
class RolloutPlan:
    """The rollout engines: which pool, how wide each engine is, how many there are."""

    kind: Literal["tpu", "gpu"]
    pool_name: str
    tpu: PoolPlan | None  # the TPU pool (kind tpu)
    gpu: GpuPoolPlan | None  # the GPU pool (kind gpu)
    tensor_parallel: int  # chips (GPUs) per engine
    options: tuple[int, ...]  # the TP sizes the slice (node) and the model allow
    groups: int  # worker-group replicas: TPU slices, or GPU nodes
    engines_per_group: int
    hosts: int  # Ray worker pods: TPU hosts of every slice, or GPU nodes
    max_model_len: int  # prompt + completion
    fit: engine.Fit | None  # weights and KV cache per chip (TPU only)
    torch_tpu_topology: str | None  # an engine narrower than its host (infra.engine)

    @property
    def engines(self) -> int:
        return self.groups * self.engines_per_group

    @property
    def chips(self) -> int:
        return self.engines * self.tensor_parallel


# v6e's data-center network: 25.6 Tbps per 256-chip pod (Google's v6e system table; 4 x 200
# Gbps NICs per 8-chip host), so 100 Gbps per chip: a 4-chip VM has 400 Gbps.
DCN_GBPS_PER_CHIP = {"v6e": 100.0}
SYNC_BYTES_PER_PARAM = 2  # bf16
LEGACY_BYTES_PER_PARAM = 4  # fp32 safetensors


@dataclass(frozen=True)
class SyncEstimate:
    """One weight sync per learner step (``syncEvery`` 1): as the job runs it and as before."""

    params: int
    rollout_hosts: int
    learner_hosts: int
    engines: int
    tensor_parallel: int
    seconds: float | None  # on v6e at infra.resolve.rl.SYNC_RATES (None: a GPU rollout pool)

    @property
    def version_bytes(self) -> int:
        """One version in bf16: what each rollout host receives."""
        return self.params * SYNC_BYTES_PER_PARAM

    @property
    def bytes_per_step(self) -> int:
        """Moved per step: the version once onto each rollout host."""
        return self.version_bytes * self.rollout_hosts

    @property
    def legacy_written(self) -> int:
        return self.params * LEGACY_BYTES_PER_PARAM

    @property
    def legacy_read(self) -> int:
        """The fp32 folder read whole by every tensor-parallel worker of every engine."""
        return self.legacy_written * self.engines * self.tensor_parallel

    @property
    def legacy_bytes_per_step(self) -> int:
        return self.legacy_written + self.legacy_read

    @property
    def host_memory_bytes(self) -> int:
        """Per rollout host: the object store's copy and the staged files (two versions)."""
        return self.version_bytes * 3


@dataclass(frozen=True)
class RlPlan:
    """The RL RayJob: the learner on one slice of its pool, the engines on the rollout pool."""

    spec: RlConfig
    learner: PoolPlan
    workers: int  # learner chips, one Ray Train worker each
    hosts: int  # learner pods
    rollout: RolloutPlan
    image: str
    run_name: str
    storage_path: str
    export_path: str | None
    model_path: str  # what the learner loads: a hub model's staged copy through the mount
    facts: FactsLookup
    fit: TrainingFit | None  # the learner's step per chip, when the facts are known
    micro_batch: int
    accumulation_steps: int
    sync: SyncEstimate | None  # the weight sync per step, when the facts are known

    @property
    def batch(self) -> int:
        """Completions per learner step."""
        return self.spec.prompts_per_step * self.spec.group_size

    @property
    def seq_len(self) -> int:
        return self.spec.max_prompt_tokens + self.spec.max_response_tokens

    @property
    def slices(self) -> int:
        return 1
