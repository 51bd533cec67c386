"""KubeRay manifests (RayJob for training, RayService for serving) as plain dicts.

Kept close to KubeRay v1.7.0's own TPU samples (`samples/ray-*.tpu-v6e-*.yaml`): `replicas` =
slices, `numOfHosts` = hosts per slice, `google.com/tpu` requests = limits = chips per host,
nodeSelectors on the accelerator and topology labels. Deliberate differences are commented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from infra import catalog, disk, engine
from infra.disk import DiskPlan, PodDisk
from infra.names import (
    APP_NAME_LABEL,
    EXPOSE_SERVE_ANNOTATION,
    GCS_VOLUME,
    HEAD_PORTS,
    HF_SECRET_KEY,
    HF_SECRET_NAME,
    HF_TOKEN_DIR,
    HF_TOKEN_VOLUME,
    METRICS_PORT,
    METRICS_PORT_NAME,
    OPENAI_SERVICE_NAME,
    PART_OF,
    POOL_LABEL,
    QUEUE_NAME_LABEL,
    QUEUED_TAINT_KEY,
    RAY_GID,
    RAY_UID,
    ROLE_LABEL,
    SERVE_PORT,
    SERVICE_NAME,
    TPU_DEVICE_PLUGIN_METRICS_PORT,
    TRAINING_JOB_NAME,
    WORKLOAD_LABEL,
)
from infra.plan import serve_tuning
from infra.resolve import PoolPlan, ServingPlan, StackPlan, TrainingPlan
from infra.versions import ENGINE_VERSIONS, IMAGE_TAG, RAY_VERSION
from workloads import protocol


@dataclass(frozen=True)
class RayPods:
    """What every Ray pod of a stack mounts and runs as."""

    namespace: str
    bucket: str
    mount_path: str  # where pods see the bucket (GCS FUSE)
    service_account: str  # the KSA, bound to the workload GSA through Workload Identity
    tpu_metrics: bool = True  # TPU chip metrics from the device plugin
    disk: DiskPlan | None = None  # each pod's scratch and file cache (infra.disk)

    def budget(self, role: str) -> PodDisk:
        """A pod's disk budget from the plan; without one, Ray's own scratch only."""
        found = self.disk.pod(role) if self.disk else None
        return found or disk.head_pod(role)


def ray_pods(plan: StackPlan) -> RayPods:
    spec = plan.spec
    return RayPods(
        namespace=spec.namespace,
        bucket=plan.names.bucket,
        mount_path=spec.storage.mount_path,
        service_account=plan.names.workload_ksa,
        tpu_metrics=spec.observability.tpu_metrics,
        disk=plan.disk,
    )


def _security_context() -> dict[str, Any]:
    """Non-root, no escalation, read-only root. TPU chips reach the pod through the device
    plugin (google.com/tpu), which needs no privilege on GKE ≥ 1.28."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RAY_UID,
        "runAsGroup": RAY_GID,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _pod_security_context() -> dict[str, Any]:
    """Pod-wide defaults (the injected GCS FUSE sidecar included): non-root, the runtime's
    seccomp profile, volumes group-owned by the Ray user's group."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RAY_UID,
        "runAsGroup": RAY_GID,
        "fsGroup": RAY_GID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


# The GCS FUSE sidecar's read cache: a pod volume of this name replaces the driver's default
# one (GKE, "Configure the Cloud Storage FUSE CSI driver sidecar container": custom read cache
# volume), so the plan sizes it.
GCSFUSE_CACHE_VOLUME = "gke-gcsfuse-cache"


def mount_options(budget: disk.PodDisk) -> str:
    """gcsfuse's options: the Ray user owns the files; the file cache capped at what the disk
    plan gives this pod (0: no cache; gcsfuse evicts past the cap); streaming writes, so a
    checkpoint or export written through the mount is uploaded as it is written, not staged
    whole in a local temp file first (the default from gcsfuse 3.0, explicit for older)."""
    return (
        f"implicit-dirs,uid={RAY_UID},gid={RAY_GID},"
        f"file-cache:max-size-mb:{budget.file_cache_mb},write:enable-streaming-writes:true"
    )


def _volumes(
    pods: RayPods, budget: disk.PodDisk, *, hf_token: bool = False
) -> list[dict[str, Any]]:
    """The bucket through the GCS FUSE CSI driver (owned by the Ray user, who runs non-root),
    writable scratch for a read-only root and gcsfuse's file cache, both sized by the disk
    plan, and the HF token file when there is one."""
    volumes: list[dict[str, Any]] = [
        {
            "name": GCS_VOLUME,
            "csi": {
                "driver": "gcsfuse.csi.storage.gke.io",
                "volumeAttributes": {
                    "bucketName": pods.bucket,
                    "mountOptions": mount_options(budget),
                },
            },
        },
        {"name": "tmp", "emptyDir": {"sizeLimit": budget.scratch_limit}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    if budget.file_cache_bytes:
        volumes.append(
            {"name": GCSFUSE_CACHE_VOLUME, "emptyDir": {"sizeLimit": budget.cache_limit}}
        )
    if hf_token:
        volumes.append(
            {
                "name": HF_TOKEN_VOLUME,
                "secret": {
                    "secretName": HF_SECRET_NAME,
                    "items": [{"key": HF_SECRET_KEY, "path": HF_SECRET_KEY}],
                    "defaultMode": 0o440,  # owner and the Ray group (fsGroup) only
                },
            }
        )
    return volumes


def _volume_mounts(pods: RayPods, *, hf_token: bool = False) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": GCS_VOLUME, "mountPath": pods.mount_path},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if hf_token:
        mounts.append({"name": HF_TOKEN_VOLUME, "mountPath": HF_TOKEN_DIR, "readOnly": True})
    return mounts


SCRATCH = "/tmp"  # the pod's scratch emptyDir, sized by the disk plan


def scratch_env(pods: RayPods) -> dict[str, str]:
    """Where local caches go (the sized scratch: the disk plan counts them), Ray's log rotation
    (bounded, so the plan can count Ray's logs), and the bucket as the pods see it (the trainer
    writes checkpoints through the mount and reads them back from it)."""
    return {
        "HOME": SCRATCH,
        "TMPDIR": SCRATCH,
        "HF_HOME": f"{SCRATCH}/huggingface",  # hub side files, hf: data sets
        "XDG_CACHE_HOME": f"{SCRATCH}/.cache",
        "PARK_CACHE_DIR": f"{SCRATCH}/park-gke",
        "RAY_ROTATION_MAX_BYTES": str(disk.RAY_LOG_ROTATE_BYTES),
        "RAY_ROTATION_BACKUP_COUNT": str(disk.RAY_LOG_BACKUPS),
        "PARK_BUCKET_URI": f"gs://{pods.bucket}",
        "PARK_BUCKET_MOUNT": pods.mount_path,
    }


def _env(
    pods: RayPods, hf_token: bool, extra: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": "PYTHONUNBUFFERED", "value": "1"}]
    env += [{"name": k, "value": v} for k, v in scratch_env(pods).items()]
    if hf_token:
        env.append({"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/{HF_SECRET_KEY}"})
    env += [{"name": k, "value": v} for k, v in sorted((extra or {}).items())]
    return env


def _resources(
    cpu: int | str, memory: str, budget: disk.PodDisk, tpu_chips: int = 0
) -> dict[str, Any]:
    """Requests = limits; ephemeral storage is the disk plan's worst case for this pod."""
    amounts = {"cpu": str(cpu), "memory": memory, "ephemeral-storage": budget.limit}
    if tpu_chips:
        amounts[catalog.TPU_RESOURCE] = str(tpu_chips)
    return {"requests": dict(amounts), "limits": dict(amounts)}


# Which of the disk plan's budgets a pod was sized from (infra/disk.py), for review and tests.
DISK_BUDGET_ANNOTATION = "park-gke/disk-budget"


def _pod_metadata(role: str | None = None) -> dict[str, Any]:
    # The GCS FUSE sidecar is injected only when asked for; 0 = no sidecar resource limits.
    annotations = {
        "gke-gcsfuse/volumes": "true",
        "gke-gcsfuse/cpu-limit": "0",
        "gke-gcsfuse/memory-limit": "0",
        "gke-gcsfuse/ephemeral-storage-limit": "0",
    }
    if role:
        annotations[DISK_BUDGET_ANNOTATION] = role
    return {"annotations": annotations}


def head_group(
    pods: RayPods,
    image: str,
    *,
    hf_token: bool = False,
    autoscaler: bool = False,
    extra_env: dict[str, str] | None = None,
    role: str = "training-head",
) -> dict[str, Any]:
    """The Ray head on the CPU pool. It runs no tasks (num-cpus 0); the dashboard listens on the
    pod network only — the head Service is ClusterIP and no Ingress is created. Only a head
    with KubeRay's autoscaler sidecar mounts an API token: the autoscaler scales worker groups
    through the Kubernetes API. `role`: its disk budget in the plan (infra.disk)."""
    budget = pods.budget(role)
    ports = [{"name": n, "containerPort": p} for n, p in HEAD_PORTS.items()]
    ports.append({"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT})
    return {
        "serviceType": "ClusterIP",
        "rayStartParams": {
            "num-cpus": "0",
            "dashboard-host": "0.0.0.0",
            "metrics-export-port": str(METRICS_PORT),
        },
        "template": {
            "metadata": _pod_metadata(role),
            "spec": {
                "serviceAccountName": pods.service_account,
                "automountServiceAccountToken": autoscaler,
                "securityContext": _pod_security_context(),
                "nodeSelector": {ROLE_LABEL: "system"},
                "containers": [
                    {
                        "name": "ray-head",
                        "image": image,
                        "imagePullPolicy": "Always",
                        "ports": ports,
                        "resources": _resources(2, "8Gi", budget),
                        "env": _env(pods, hf_token, extra_env),
                        "volumeMounts": _volume_mounts(pods, hf_token=hf_token),
                        "securityContext": _security_context(),
                    }
                ],
                "volumes": _volumes(pods, budget, hf_token=hf_token),
            },
        },
    }


def _tpu_metrics_env(pods: RayPods) -> list[dict[str, Any]]:
    if not pods.tpu_metrics:
        return []
    return [
        {
            "name": "TPU_DEVICE_PLUGIN_HOST_IP",
            "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}},
        },
        {
            "name": "TPU_DEVICE_PLUGIN_ADDR",
            "value": f"$(TPU_DEVICE_PLUGIN_HOST_IP):{TPU_DEVICE_PLUGIN_METRICS_PORT}",
        },
    ]


def _label_pods(cluster_spec: dict[str, Any], workload: str) -> dict[str, Any]:
    for group in (cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]):
        group["template"]["metadata"].setdefault("labels", {})[WORKLOAD_LABEL] = workload
    return cluster_spec


def tpu_tolerations(pool: PoolPlan) -> list[dict[str, str]]:
    tolerations = [
        {"key": catalog.TPU_TAINT_KEY, "operator": "Exists", "effect": catalog.TPU_TAINT_EFFECT}
    ]
    if pool.queued:
        tolerations.append({"key": QUEUED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    return tolerations


def tpu_worker_group(
    pods: RayPods,
    pool: PoolPlan,
    image: str,
    *,
    replicas: int,
    min_replicas: int,
    max_replicas: int,
    hf_token: bool = False,
    extra_env: dict[str, str] | None = None,
    role: str = "training-worker",
) -> dict[str, Any]:
    """The worker group shared by training and serving: one Ray pod per TPU host, one replica
    per slice. `role`: its disk budget in the plan (infra.disk)."""
    tpu = pool.slice
    budget = pods.budget(role)
    # The pool's own label too: two pools of one topology (prod: training on a reservation,
    # serving on demand) must not take each other's nodes, nor make the autoscaler grow the
    # wrong one.
    node_selector = {**tpu.node_labels(), POOL_LABEL: pool.name}
    if pool.capacity == "spot":
        node_selector[catalog.SPOT_LABEL] = "true"
    return {
        "groupName": pool.name,
        "replicas": replicas,
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "numOfHosts": tpu.hosts,
        "rayStartParams": {"metrics-export-port": str(METRICS_PORT)},
        "template": {
            "metadata": _pod_metadata(role),
            "spec": {
                "serviceAccountName": pods.service_account,
                "automountServiceAccountToken": False,  # workers never call the API server
                "securityContext": _pod_security_context(),
                "nodeSelector": node_selector,
                "tolerations": tpu_tolerations(pool),
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": image,
                        "imagePullPolicy": "Always",
                        "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT}],
                        "resources": _resources(
                            tpu.pod_cpu, f"{tpu.pod_memory_gib}Gi", budget, tpu.chips_per_host
                        ),
                        "env": [*_env(pods, hf_token, extra_env), *_tpu_metrics_env(pods)],
                        "volumeMounts": _volume_mounts(pods, hf_token=hf_token),
                        "securityContext": _security_context(),
                    }
                ],
                "volumes": _volumes(pods, budget, hf_token=hf_token),
            },
        },
    }


def _labels(name: str) -> dict[str, str]:
    return {APP_NAME_LABEL: name, **PART_OF}


# ---------------------------------------------------------------------------------------------
# Training


def training_fields(training: TrainingPlan) -> dict[str, Any]:
    """The fields of `python -m workloads.train` the stack sets, in order; TPU facts come from
    the catalog, counts from the resolved plan. A Hugging Face model run (park:training.model)
    gets its model, data and export fields; a GPT preset run its preset."""
    spec, tpu = training.spec, training.pool.slice
    fields: dict[str, Any] = {
        "accelerator": "tpu",
        "num_workers": training.workers,
        "tpu_topology": tpu.topology,
        "tpu_accelerator_type": tpu.ray_accelerator_type,
        "torch_tpu_topology": tpu.torch_tpu_topology,
        "chips_per_host": tpu.chips_per_host,
        "num_slices": training.slices,
        "peak_tflops_per_device": tpu.generation.peak_bf16_tflops_per_chip,
        "strategy": spec.strategy,
    }
    if spec.model:
        # the staged copy of a hub model, through the mount (infra.disk)
        model = training.model_path or spec.model
        fields |= {"model": model, "tokenizer": spec.tokenizer, "init": spec.init}
        fields["activation_checkpointing"] = spec.activation_checkpointing
    else:
        fields["model_size"] = spec.model_size
        # Set on a preset run, these reach the trainer: it refuses a tokenizer or an init without
        # a model, and checkpoints a preset's blocks as it does a model's.
        fields |= {
            "tokenizer": spec.tokenizer,
            "init": spec.init if spec.init != "auto" else None,
            "activation_checkpointing": spec.activation_checkpointing or None,
        }
    fields |= {
        "steps": spec.steps,
        "global_batch_size": spec.global_batch_size,
        # The plan's micro-batch (the pin, or the most that fit: infra.training_fit), so the
        # run holds what preview proved fits; the trainer accumulates over the rest.
        "micro_batch_size": training.micro_batch,
        "seq_len": spec.seq_len,
        "lr": spec.learning_rate,
        "warmup_steps": spec.warmup_steps,
        "lr_schedule": spec.lr_schedule,
        "min_lr_ratio": spec.min_lr_ratio,
        "data": spec.data,
        "objective": spec.objective,
    }
    if spec.model:
        fields |= {
            "data_split": spec.data_split,
            "text_field": spec.text_field,
            "messages_field": spec.messages_field,
            "prompt_field": spec.prompt_field,
            "response_field": spec.response_field,
        }
    fields |= {
        "checkpoint_every": spec.checkpoint_every,
        "keep_checkpoints": spec.keep_checkpoints,
        "storage_path": training.storage_path,
        "run_name": training.run_name,
        "max_failures": spec.max_failures,
    }
    if spec.model:
        fields |= {
            "export": spec.export,
            "export_every": spec.export_every,
            "export_dtype": spec.export_dtype,
            "export_max_shard_size": spec.export_max_shard_size,
        }
    elif spec.export_every:
        fields["export_every"] = spec.export_every
    return {k: v for k, v in fields.items() if v is not None}


def training_runtime_env() -> dict[str, Any]:
    # torch_tpu memoizes its env on first use; the training bridge sets the slice env per
    # worker before the process group starts (Ray 2.60 does not).
    return {
        "env_vars": {
            "PYTHONUNBUFFERED": "1",
            "TORCH_TPU_BASE_PORT": str(protocol.TORCH_TPU_BASE_PORT),
        }
    }


def rayjob(training: TrainingPlan, pods: RayPods, *, hf_token: bool = False) -> dict[str, Any]:
    """The training RayJob: runs to completion, then releases the TPUs. `hf_token`: the
    workspace holds the HF token Secret (a gated base model); every Ray pod reads it."""
    spec, image = training.spec, training.image
    labels = _labels(TRAINING_JOB_NAME)
    if training.queue_name:
        labels[QUEUE_NAME_LABEL] = training.queue_name
    body: dict[str, Any] = {
        "entrypoint": protocol.training_entrypoint(training_fields(training)),
        "runtimeEnvYAML": yaml.safe_dump(training_runtime_env(), sort_keys=True),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
        "activeDeadlineSeconds": spec.active_deadline_seconds,
        "backoffLimit": spec.backoff_limit,
        "submitterPodTemplate": _submitter_template(pods, image),
        "rayClusterSpec": {
            "rayVersion": RAY_VERSION,
            "headGroupSpec": head_group(pods, image, hf_token=hf_token),
            "workerGroupSpecs": [
                tpu_worker_group(
                    pods,
                    training.pool,
                    image,
                    hf_token=hf_token,
                    replicas=training.slices,
                    min_replicas=training.slices,
                    max_replicas=training.slices,
                )
            ],
        },
    }
    _label_pods(body["rayClusterSpec"], TRAINING_JOB_NAME)
    if training.queue_name:
        body["suspend"] = True  # Kueue admits it when the queued capacity arrives
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": TRAINING_JOB_NAME, "namespace": pods.namespace, "labels": labels},
        "spec": body,
    }


def _submitter_template(pods: RayPods, image: str) -> dict[str, Any]:
    """KubeRay's submitter pod runs `ray job submit`; same image, small and locked down."""
    budget = pods.budget("submitter")
    return {
        "metadata": {"annotations": {DISK_BUDGET_ANNOTATION: "submitter"}},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": pods.service_account,
            "automountServiceAccountToken": False,  # it talks to the Ray dashboard, not the API
            "securityContext": _pod_security_context(),
            "nodeSelector": {ROLE_LABEL: "system"},
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": image,
                    "imagePullPolicy": "Always",
                    "resources": _resources("500m", "1Gi", budget),
                    "env": [{"name": "HOME", "value": "/tmp"}],  # `ray job submit` writes ~/.ray
                    "securityContext": _security_context(),
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": budget.scratch_limit}}],
        },
    }


# ---------------------------------------------------------------------------------------------
# Serving


def model_source(pods: RayPods, source: str) -> str | dict[str, str]:
    """What the engine loads: a hub id's copy staged once in our bucket (`park stage-model`,
    infra.disk), and our own bucket's folders, through the FUSE mount and its sized file cache
    (never a per-host hub download into scratch); other buckets mirrored by Serve LLM."""
    if disk.needs_staging(source):
        return disk.staged_path(pods.mount_path, source)
    own = f"gs://{pods.bucket}/"
    if source.startswith(own):
        return f"{pods.mount_path}/{source[len(own) :]}"
    if source.startswith("gs://"):
        return {"bucket_uri": source}
    return source


# How long Serve waits on a replica's health check (Ray 2.60's default: 10 s, RAY_SERVE_LLM_
# DEFAULT_HEALTH_CHECK_TIMEOUT_S in ray/llm/_internal/serve/constants.py:36). A TPU engine
# compiling a new shape bucket with XLA answers late; Google's TorchTPU serving sample
# (serve_vllm_torchtpu.py) uses 900 s.
HEALTH_CHECK_TIMEOUT_S = 900
COMPILE_CACHE_DIR = "cache"  # under the bucket mount: <mount>/cache/{torch-tpu,vllm}/<key>


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text.lower()).strip("-")


def compile_cache_key(serving: ServingPlan, model_name: str, tensor_parallel: int) -> str:
    """Entries only a replica of the same model, slice shape, TP and engine may reuse."""
    tpu, engine_name = serving.pool.slice, serving.spec.engine
    return (
        f"{_slug(model_name)}-{tpu.machine_type}-{tpu.topology}-tp{tensor_parallel}-"
        f"{engine_name}-{ENGINE_VERSIONS[engine_name]}-{IMAGE_TAG}"
    )


def _engine_env(serving: ServingPlan, pods: RayPods, model_name: str, tp: int) -> dict[str, str]:
    """The engine's environment: its executor on multi-host, the topology torch_tpu must use,
    and a compile cache on the bucket so a restarted replica starts warm."""
    tpu = serving.pool.slice
    env: dict[str, str] = {}
    if tpu.multi_host:
        env["TPU_MULTIHOST_BACKEND"] = "ray"  # else vLLM silently runs on one host
    topology = engine.torch_tpu_topology(tpu, tp)
    if topology:
        # The TPU webhook injects the whole host's TORCH_TPU_TOPOLOGY, which torch_tpu keeps
        # (vllm_torchtpu/platforms/tpu_platform.py:540): a TP-4 engine on 8 chips needs 2,2,1.
        env["TORCH_TPU_TOPOLOGY"] = topology
    if serving.spec.engine == "vllm-torchtpu":
        # Not VLLM_DISABLE_COMPILE_CACHE=1 (the engine's CI setting: every replica start would
        # recompile). TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT is torch_tpu 0.2.0's persistent
        # executable cache (off unless set; read by its C++ runtime and vllm_torchtpu/envs.py:980);
        # VLLM_CACHE_ROOT holds vLLM's own compiled-graph cache (vllm/compilation/backends.py:1058).
        # The key keeps models, slice shapes, TPs and versions apart; the engine hashes its
        # own config (max_model_len, memory utilization...) inside.
        key = compile_cache_key(serving, model_name, tp)
        root = f"{pods.mount_path}/{COMPILE_CACHE_DIR}"
        env["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT"] = f"{root}/torch-tpu/{key}"
        env["VLLM_CACHE_ROOT"] = f"{root}/vllm/{key}"
    return env


def serve_config(serving: ServingPlan, pods: RayPods) -> dict[str, Any]:
    """serveConfigV2: Ray Serve LLM's OpenAI app, one LLMConfig per served model.

    Aligned with Google's TorchTPU serving sample (kubernetes-engine-samples ai-ml/gke-ray/
    rayserve/llm/torchtpu/serve_vllm_torchtpu.py): one TPU per engine worker's placement bundle,
    a health-check timeout that covers XLA compilation, the Ray executor across hosts.
    Deliberately not taken from it: `language_model_only` and `disable_hybrid_kv_cache_manager`
    (Gemma 4 choices: the latter makes sliding-window layers hold full context, a stack sets it
    in engineKwargs when it wants it), `max_num_batched_tokens` (the engine's default), and
    `USE_MOE_SPARSE_CORE=0` (routes Gemma 4's experts; other MoE models keep the default).
    """
    tpu = serving.pool.slice
    llm_configs = []
    for model in serving.models:
        spec = model.spec
        kwargs: dict[str, Any] = {
            **spec.engine_kwargs,
            "tensor_parallel_size": model.tensor_parallel,
            "max_model_len": spec.max_model_len,
            "enable_expert_parallel": spec.enable_expert_parallel,
        }
        if tpu.multi_host:
            # What Serve LLM forces anyway for an accelerator (vllm_models.py:147-162); the
            # plugin then picks its Ray executor from TPU_MULTIHOST_BACKEND.
            kwargs["distributed_executor_backend"] = "ray"
        llm_configs.append(
            {
                "model_loading_config": {
                    "model_id": spec.name,
                    # source: training is the run's export on the bucket, through the mount.
                    "model_source": model_source(pods, model.source or spec.source),
                },
                "accelerator_type": tpu.ray_accelerator_type,
                "accelerator_config": {"kind": "tpu", "topology": tpu.topology},
                # One engine worker per chip, as vllm-torchtpu's workers take one TPU each
                # (ray_distributed_executor_v2.py:181-188); the slice placement group then holds
                # every chip of the topology as such bundles.
                "placement_group_config": {"bundle_per_worker": {"TPU": 1}},
                "engine_kwargs": kwargs,
                "deployment_config": {
                    "autoscaling_config": {
                        "min_replicas": spec.min_replicas,
                        "max_replicas": spec.max_replicas,
                    },
                    "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
                    **serve_tuning.deployment_options(),
                },
                "runtime_env": {
                    "env_vars": _engine_env(serving, pods, spec.name, model.tensor_parallel)
                },
                **serve_tuning.llm_config_options(),
            }
        )
    return {
        "applications": [
            {
                "name": "llm",
                "route_prefix": "/",
                "import_path": "ray.serve.llm:build_openai_app",
                "args": {"llm_configs": llm_configs, **serve_tuning.app_args()},
            }
        ]
    }


def rayservice(serving: ServingPlan, pods: RayPods, *, hf_token: bool) -> dict[str, Any]:
    """The serving RayService. Each replica holds a whole slice (infra.resolve), so the TPU
    worker group starts at the slices of the models' minReplicas and Serve autoscaling grows it
    up to those of their maxReplicas. Upgrade strategy "NewCluster" (blue/green) holds a second
    cluster of the same size while it runs; the default "None" updates the serve config in
    place and needs no spare slice."""
    spec, image = serving.spec, serving.image
    ray_env = serve_tuning.ray_env()  # Ray Serve settings read from the process environment
    service_type = "LoadBalancer" if spec.expose_publicly else "ClusterIP"
    metadata: dict[str, Any] = {
        "name": SERVICE_NAME,
        "namespace": pods.namespace,
        "labels": _labels(SERVICE_NAME),
    }
    if spec.expose_publicly:
        # park:serving.exposePublicly, made visible to review and to the policy pack
        metadata["annotations"] = {EXPOSE_SERVE_ANNOTATION: "true"}
    manifest: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": metadata,
        "spec": {
            "upgradeStrategy": {"type": spec.upgrade_strategy},
            "serveConfigV2": yaml.safe_dump(serve_config(serving, pods), sort_keys=False),
            "serveService": {
                "metadata": {"name": OPENAI_SERVICE_NAME},
                "spec": {
                    "type": service_type,
                    "ports": [{"name": "serve", "port": SERVE_PORT, "targetPort": SERVE_PORT}],
                },
            },
            "rayClusterConfig": {
                "rayVersion": RAY_VERSION,
                "enableInTreeAutoscaling": True,
                "headGroupSpec": head_group(
                    pods,
                    image,
                    hf_token=hf_token,
                    autoscaler=True,
                    extra_env=ray_env,
                    role="serving-head",
                ),
                "workerGroupSpecs": [
                    tpu_worker_group(
                        pods,
                        serving.pool,
                        image,
                        replicas=serving.min_slices,
                        min_replicas=0,
                        max_replicas=serving.max_slices,
                        hf_token=hf_token,
                        extra_env=ray_env,
                        role="serving-worker",
                    )
                ],
            },
        },
    }
    _label_pods(manifest["spec"]["rayClusterConfig"], SERVICE_NAME)
    return manifest
