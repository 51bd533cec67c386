"""Disk and host memory per pod and per node, before anything runs: the disk model.

Where bytes go (issue 19 item 3, what the plan renders):

- model weights from the hub are staged once into the stack's bucket (``models/<org>/<name>``,
  `park stage-model`) and read through the GCS FUSE mount; serving reads them through a gcsfuse
  file cache sized here (a cap gcsfuse honours by evicting, on its own emptyDir), training
  streams them once (no file cache: each rank reads only its slices, once);
- DCP checkpoints and exports go to the bucket directly (through the mount, gcsfuse's streaming
  writes: no local staging of the file) and a resume reads them from there;
- what stays in the pod's scratch (the ``/tmp`` emptyDir, where HOME, TMPDIR, HF_HOME and the
  local compile caches live): Ray's session folder and logs (rotation bounded by the env this
  plan sets), hub side files and data sets, the compilers' local scratch.

Every figure below is either derived from the plan (weights from the model's facts, the gcsfuse
file cache, the per-host share of a checkpoint) or a named allowance with its reason; the pod's
ephemeral-storage request and limit, the emptyDirs' sizeLimits and the node pools' boot disks
are derived from them (infra/plan/ray/pods.py, infra/plan/node_pools.py), never constants.
Pure: no torch, no Pulumi; infra/resolve/disk_plan.py builds the stack's DiskPlan from these
(its `build` runs at the end of infra.resolve.resolve).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra import model_facts
from infra.resolve.host_memory import HostMemory, Item
from infra.resolve.types import RlPlan, ServingPlan, TrainingPlan
from infra.schema.models import TrainingConfig

GIB = 1024**3
MIB = 1024**2
GB = 10**9

MODELS_PREFIX = "models"  # staged hub models: gs://<bucket>/models/<org>/<name>

# ---- allowances: what no source sizes; each says why it is this big --------------------------
# Ray's own logs: Ray rotates each log file at RAY_ROTATION_MAX_BYTES with RAY_ROTATION_BACKUP_
# COUNT backups (defaults 512 MiB and 5, ray/_common/ray_constants.py: 3 GiB per file). The pods
# get the smaller values below (infra/plan/ray/pods.py `container_env`), so a file holds at
# most 128 MiB.
RAY_LOG_ROTATE_BYTES = 64 * MIB
RAY_LOG_BACKUPS = 1
# Log files of one Ray node besides its workers' (raylet, gcs, dashboard and its agents, log
# monitor, runtime env agent, monitor..., .out and .err each): counted on a Ray 2.60 session.
RAY_SYSTEM_LOG_FILES = 24
RAY_WORKER_LOG_FILES = 2  # .out and .err per worker process (one per chip, plus a few idle)
RAY_SESSION_OTHER_BYTES = 2 * GIB  # runtime_env packages, sockets, the session's metadata
HF_SIDE_FILES_BYTES = 1 * GIB  # config, tokenizer and chat template files in HF_HOME
HF_DATASET_BYTES = 4 * GIB  # an hf: data set's download and Arrow cache (not known offline)
COMPILE_SCRATCH_BYTES = 8 * GIB  # compilers' local dumps and inductor/XLA caches under TMPDIR
CONTAINER_LOGS_BYTES = 50 * MIB  # the kubelet's log rotation: 10 MiB x 5 files per container
SUBMITTER_SCRATCH_BYTES = 1 * GIB  # `ray job submit` writes ~/.ray and its logs only
FILE_CACHE_OVERHEAD_BYTES = 1 * GIB  # gcsfuse's cache index and partial downloads beyond max
# The GCS FUSE sidecar's own disk, in every pod that mounts the bucket (the CSI webhook injects
# it). Streaming writes send a new file straight to the bucket; a write gcsfuse cannot stream (a
# rewrite of an existing object, an out-of-order write) is staged whole in a temp file on its
# write buffer, the gke-gcsfuse-buffer volume (an emptyDir; a pod volume of that name replaces
# it, GKE's "custom write buffer volume"), which the plan sizes. What the stacks rewrite through
# the mount are the engines' compile-cache files (vLLM's per-rank vllm_compile_cache.py and
# graphs, torch_tpu's executables: MiBs to a few hundred MiB each): an allowance, not a size.
# With its container logs, that is the sidecar's ephemeral-storage request and limit. Left to
# the webhook, the sidecar requests 5Gi (its default request and limit, pkg/webhook/config.go
# and the webhook's --sidecar-ephemeral-storage-request flag; a "0" limit with no request
# keeps the 5Gi request: populateResource), which no node sum here counted.
GCSFUSE_WRITE_BUFFER_BYTES = 2 * GIB
# The node's boot disk also holds the images (the workload image carries torch, torch_tpu,
# vLLM, JAX and Ray: well over 10 GB unpacked; this is an upper allowance) and system pods.
IMAGE_BYTES = 30 * GIB
SYSTEM_PODS_BYTES = 2 * GIB
DEFAULT_BOOT_DISK_GB = 100  # GKE's default; the floor of a derived boot disk
BOOT_DISK_STEP_GB = 10  # derived boot disks are rounded up to this


# How long staging a hub model into the bucket may take (workloads/train/stage.py streams each
# file from the hub into the bucket): the one bound both sides use, what `pulumi up` waits for
# the staging Job (infra/plan/staging.py) and what a workload waits for the staged copy (the
# trainer's --model-wait-s, a serving replica's wait). An assumption, stated, not a
# measurement: a slow day's floor of 25 MB/s through one stream (the hub's CDN and GCS each
# sustain several times that from a GKE node), plus 20 minutes to schedule the Job's pod on a
# fresh CPU node, pull the workload image (well over 10 GB) and start; two hours when the
# model's size is not known here (no facts).
STAGE_FLOOR_BYTES_PER_S = 25 * 10**6
STAGE_START_S = 20 * 60
STAGE_UNKNOWN_SIZE_S = 2 * 3600


def stage_timeout_s(weights_bytes: int | None) -> int:
    """The staging bound of a model of `weights_bytes` (None: not known), whole minutes."""
    if weights_bytes is None:
        return STAGE_UNKNOWN_SIZE_S
    seconds = STAGE_START_S + weights_bytes / STAGE_FLOOR_BYTES_PER_S
    return math.ceil(seconds / 60) * 60


def staged_uri(bucket: str, repo: str) -> str:
    """Where a hub model is staged in the stack's bucket."""
    return f"gs://{bucket}/{MODELS_PREFIX}/{repo}"


def staged_path(mount_path: str, repo: str) -> str:
    """The staged copy as the pods see it, through the bucket's FUSE mount."""
    return f"{mount_path.rstrip('/')}/{MODELS_PREFIX}/{repo}"


def needs_staging(source: str | None) -> bool:
    """A hub id: fetched once into the bucket, never per host into scratch."""
    return bool(source) and model_facts.is_hub_id(str(source))


def gke_allocatable_bytes(disk_gb: int) -> int:
    """Ephemeral storage a GKE node offers pods from a boot disk of `disk_gb` GB: GKE reserves
    min(50 %, 6 GiB + 35 %, 100 GiB) of it for the system and evicts at 10 % free (GKE, "Plan
    GKE Standard node sizes", local ephemeral storage reservation; a 100 GB node shows ~47 GB
    allocatable there, this formula says ~49: the image allowance covers the difference)."""
    total = disk_gb * GB
    reserved = min(total // 2, 6 * GIB + int(total * 0.35), 100 * GIB)
    return total - reserved - total // 10


def boot_disk_needed_gb(pod_bytes: int) -> int:
    """The smallest boot disk (GB, a multiple of BOOT_DISK_STEP_GB, at least GKE's default)
    whose allocatable storage holds `pod_bytes` plus the images and system pods."""
    need = pod_bytes + IMAGE_BYTES + SYSTEM_PODS_BYTES
    # Allocatable storage grows with the disk, and is at least 90 % of it less 100 GiB: a
    # binary search between the default and that bound, in steps (a model's size comes from
    # a config.json anyone may write: never a walk of one step per 10 GB).
    low = -(-DEFAULT_BOOT_DISK_GB // BOOT_DISK_STEP_GB)  # in steps
    high = max(low, -(-(need + 100 * GIB) * 10 // (9 * GB)) // BOOT_DISK_STEP_GB + 1)
    while low < high:
        middle = (low + high) // 2
        if gke_allocatable_bytes(middle * BOOT_DISK_STEP_GB) >= need:
            high = middle
        else:
            low = middle + 1
    return max(low * BOOT_DISK_STEP_GB, DEFAULT_BOOT_DISK_GB)


# ---- the model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class StagedModel:
    """A hub model the stack reads from its bucket: staged once, before the workloads run."""

    repo: str
    uri: str  # gs://<bucket>/models/<repo>
    path: str  # the same folder through the pods' mount
    weights_bytes: int | None  # from the model's facts; None when not known here
    used_by: tuple[str, ...]  # config keys naming it

    @property
    def stage_timeout_s(self) -> int:
        """How long its staging may take: what its readers wait for it at most."""
        return stage_timeout_s(self.weights_bytes)


def _whole_mib(size: int) -> str:
    """A Kubernetes quantity in whole MiB, rounded up: an emptyDir's sizeLimit."""
    return f"{math.ceil(size / MIB)}Mi"


@dataclass(frozen=True)
class PodDisk:
    """One pod's local disk: its scratch emptyDir, its gcsfuse file cache, and what goes
    straight to the bucket (shown, no scratch)."""

    role: str  # training-worker, serving-worker, training-head, serving-head, submitter
    pool: str  # the config pool it runs on ("cpu" for the CPU pool)
    scratch: tuple[Item, ...]
    file_cache_bytes: int = 0  # gcsfuse's read cache cap (0: off)
    bucket: tuple[Item, ...] = ()
    mounts_bucket: bool = True  # through GCS FUSE: the pod gets the sidecar and its disk

    @property
    def scratch_bytes(self) -> int:
        return sum(i.bytes for i in self.scratch)

    @property
    def cache_volume_bytes(self) -> int:
        """The cache emptyDir's sizeLimit: the cap plus gcsfuse's own overhead."""
        return self.file_cache_bytes + FILE_CACHE_OVERHEAD_BYTES if self.file_cache_bytes else 0

    @property
    def worst_case_bytes(self) -> int:
        """Everything this pod may hold on the node's disk at once."""
        return self.scratch_bytes + self.cache_volume_bytes + CONTAINER_LOGS_BYTES

    @property
    def limit_bytes(self) -> int:
        """The container's ephemeral-storage request and limit: the worst case in whole GiB."""
        return math.ceil(self.worst_case_bytes / GIB) * GIB

    @property
    def limit(self) -> str:
        return f"{self.limit_bytes // GIB}Gi"

    @property
    def write_buffer_bytes(self) -> int:
        """The GCS FUSE sidecar's write buffer volume (0: no sidecar)."""
        return GCSFUSE_WRITE_BUFFER_BYTES if self.mounts_bucket else 0

    @property
    def write_buffer_limit(self) -> str:
        return _whole_mib(self.write_buffer_bytes)

    @property
    def sidecar_bytes(self) -> int:
        """The sidecar's ephemeral-storage request and limit: its write buffer and its logs,
        in whole MiB (0: no sidecar)."""
        if not self.mounts_bucket:
            return 0
        return math.ceil((self.write_buffer_bytes + CONTAINER_LOGS_BYTES) / MIB) * MIB

    @property
    def sidecar_limit(self) -> str:
        return _whole_mib(self.sidecar_bytes)

    @property
    def pod_bytes(self) -> int:
        """What the pod requests of its node's disk: its container's and its sidecar's."""
        return self.limit_bytes + self.sidecar_bytes

    @property
    def scratch_limit(self) -> str:
        return _whole_mib(self.scratch_bytes)

    @property
    def cache_limit(self) -> str:
        return _whole_mib(self.cache_volume_bytes)

    @property
    def file_cache_mb(self) -> int:
        """gcsfuse's file-cache:max-size-mb (MiB)."""
        return self.file_cache_bytes // MIB


@dataclass(frozen=True)
class NodeDisk:
    """One node pool's boot disk against the pods that may share one of its nodes."""

    key: str  # the config key of its size: park:tpuPools[0].diskSizeGb, park:cpuPool.diskSizeGb
    pool: str
    machine_type: str
    boot_disk_gb: int  # what the node pool gets: the stack's, or the derived size
    needed_gb: int  # the smallest boot disk that holds it
    pinned: bool  # the stack set the size
    pods_bytes: int  # ephemeral-storage requests of the pods one node may run (sidecars too)
    local_ssd_gib: int | None  # the machine type's local SSD (None: not known, none assumed)

    @property
    def allocatable_bytes(self) -> int:
        return gke_allocatable_bytes(self.boot_disk_gb)

    @property
    def fits(self) -> bool:
        return self.boot_disk_gb >= self.needed_gb


@dataclass(frozen=True)
class DiskPlan:
    pods: tuple[PodDisk, ...]
    nodes: tuple[NodeDisk, ...]
    memory: tuple[HostMemory, ...]
    staged: tuple[StagedModel, ...]

    def pod(self, role: str) -> PodDisk | None:
        return next((p for p in self.pods if p.role == role), None)

    def node(self, pool: str) -> NodeDisk | None:
        return next((n for n in self.nodes if n.pool == pool), None)

    def staged_model(self, repo: str) -> StagedModel | None:
        return next((s for s in self.staged if s.repo == repo), None)


# ---- per workload ---------------------------------------------------------------------------


def _training_facts(training: TrainingPlan) -> model_facts.ModelFacts | None:
    return training.facts.facts


def _ray_logs(workers: int) -> Item:
    files = RAY_SYSTEM_LOG_FILES + RAY_WORKER_LOG_FILES * (workers + 2)
    per_file = RAY_LOG_ROTATE_BYTES * (1 + RAY_LOG_BACKUPS)
    return Item(
        "ray session logs",
        files * per_file + RAY_SESSION_OTHER_BYTES,
        f"{files} files x {per_file // MIB} MiB (rotation set in the pod env) + session files",
    )


def _training_uses_hub_data(training: TrainingPlan) -> bool:
    return str(training.spec.data or "").startswith("hf:")


def trainer_model_source(spec: TrainingConfig, mount_path: str) -> str | None:
    """What the trainer loads for park:training.model: a hub model's staged copy under the
    mount when the run needs its weights, else the spec's source as is (a run from random
    weights fetches only config and tokenizer, small, into HF_HOME)."""
    if spec.model and needs_staging(spec.model) and spec.init != "config":
        return staged_path(mount_path, spec.model)
    return spec.model


def _checkpoint_bytes(training: TrainingPlan) -> int | None:
    """One checkpoint: fp32 weights and AdamW's two fp32 moments (12 bytes a parameter)."""
    facts = _training_facts(training)
    if facts is None or facts.params is None:
        return None
    return facts.params * 12


def training_pod(training: TrainingPlan) -> PodDisk:
    tpu = training.pool.slice
    scratch = [_ray_logs(tpu.chips_per_host), Item("hub side files (HF_HOME)", HF_SIDE_FILES_BYTES)]
    if _training_uses_hub_data(training):
        scratch.append(
            Item("hub data set (HF_HOME)", HF_DATASET_BYTES, f"{training.spec.data}: allowance")
        )
    scratch.append(Item("compile scratch (TMPDIR)", COMPILE_SCRATCH_BYTES))
    spec = training.spec
    if spec.model and spec.model.startswith("gs://"):
        # another bucket's model is mirrored once per node into the cache (workloads/train/
        # storage.mirror); our own bucket's is read through the mount
        mirrored = model_facts.weights_bytes(_training_facts(training)) or 0
        scratch.append(Item("model mirrored from another bucket", mirrored, spec.model))
    bucket: list[Item] = []
    ckpt = _checkpoint_bytes(training)
    if ckpt is not None:
        per_host = ckpt * tpu.chips_per_host // max(training.workers, 1)
        bucket.append(
            Item(
                "checkpoint shards (DCP, through the mount)",
                per_host,
                f"this host's share of {ckpt / GIB:.1f} GiB; resume reads them in place",
            )
        )
    if training.export_path:
        weights = model_facts.weights_bytes(_training_facts(training))
        if weights is not None:
            bucket.append(Item("export (safetensors, to the bucket)", weights))
    return PodDisk("training-worker", training.pool.name, tuple(scratch), 0, tuple(bucket))


def serving_file_cache_bytes(serving: ServingPlan) -> int:
    """The gcsfuse file cache of a serving worker: the largest model one replica loads (every
    host reads every safetensors file of its model), so a restarted replica loads from disk."""
    sizes = [model_facts.weights_bytes(m.facts.facts) or 0 for m in serving.models]
    return max(sizes, default=0)


def serving_pod(serving: ServingPlan, bucket: str) -> PodDisk:
    """A serving worker: Ray's scratch and the compilers' (the engines' compile caches live on
    the bucket, infra/plan/ray/pods.py), the file cache, and any model of another bucket, which
    Serve LLM mirrors into the pod's scratch (`bucket_uri`)."""
    tpu = serving.pool.slice
    scratch = [
        _ray_logs(tpu.chips_per_host),
        Item("hub side files (HF_HOME)", HF_SIDE_FILES_BYTES),
        Item("compile scratch (TMPDIR)", COMPILE_SCRATCH_BYTES, "engine caches: on the bucket"),
    ]
    for m in serving.models:
        source = m.source or ""
        if source.startswith("gs://") and not source.startswith(f"gs://{bucket}/"):
            size = model_facts.weights_bytes(m.facts.facts) or 0
            scratch.append(Item(f"{m.spec.name} mirrored from another bucket", size, source))
    cache = serving_file_cache_bytes(serving)
    return PodDisk("serving-worker", serving.pool.name, tuple(scratch), cache)


def rl_pods(rl: RlPlan) -> list[PodDisk]:
    """park:rl's pods: a learner host like a training host (the policy's checkpoints go to the
    bucket), a rollout host like a serving host (its file cache holds the published policy,
    which every engine reloads at each version), its head and submitter."""
    weights = model_facts.weights_bytes(rl.facts.facts) or 0
    hub = rl.spec.data.startswith("hf:")
    learner = [
        _ray_logs(rl.learner.slice.chips_per_host),
        Item("hub side files (HF_HOME)", HF_SIDE_FILES_BYTES),
    ]
    if hub:
        allowance = f"{rl.spec.data}: allowance"
        learner.append(Item("hub data set (HF_HOME)", HF_DATASET_BYTES, allowance))
    learner.append(Item("compile scratch (TMPDIR)", COMPILE_SCRATCH_BYTES))
    chips = rl.rollout.tpu.slice.chips_per_host if rl.rollout.tpu else rl.rollout.tensor_parallel
    rollout = (
        _ray_logs(chips),
        Item("hub side files (HF_HOME)", HF_SIDE_FILES_BYTES),
        Item("compile scratch (TMPDIR)", COMPILE_SCRATCH_BYTES),
    )
    return [
        PodDisk("rl-learner", rl.learner.name, tuple(learner)),
        PodDisk("rl-rollout", rl.rollout.pool_name, rollout, weights),
        head_pod("rl-head"),
        submitter_pod(),
    ]


def head_pod(role: str) -> PodDisk:
    scratch = (_ray_logs(4), Item("hub side files (HF_HOME)", HF_SIDE_FILES_BYTES))
    return PodDisk(role, "cpu", scratch)


def submitter_pod() -> PodDisk:
    scratch = (Item("ray job submit", SUBMITTER_SCRATCH_BYTES),)
    return PodDisk("submitter", "cpu", scratch, mounts_bucket=False)
