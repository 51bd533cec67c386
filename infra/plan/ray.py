"""KubeRay manifests (RayJob for training, RayService for serving) as plain dicts.

Kept close to KubeRay v1.7.0's own TPU samples (`samples/ray-*.tpu-v6e-*.yaml`): `replicas` =
slices, `numOfHosts` = hosts per slice, `google.com/tpu` requests = limits = chips per host,
nodeSelectors on the accelerator and topology labels. Deliberate differences are commented.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from infra import catalog
from infra.config import RAY_VERSION, StackConfig, TpuPoolConfig
from infra.plan.node_pools import POOL_LABEL, QUEUED_TAINT_KEY, ROLE_LABEL

WORKLOAD_KSA = "park-workload"
HF_SECRET_NAME = "hf-token"
HF_SECRET_KEY = "token"
TRAINING_JOB_NAME = "park-train"
SERVICE_NAME = "park-serve"
OPENAI_SERVICE_NAME = "park-openai"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
GCS_VOLUME = "gcs"
SERVE_PORT = 8000
DASHBOARD_PORT = 8265
METRICS_PORT = 8080
HEAD_PORTS = {"gcs-server": 6379, "dashboard": DASHBOARD_PORT, "client": 10001, "serve": SERVE_PORT}
TRAIN_MODULE = "workloads.train"
# Every Ray pod carries its workload's name: KubeRay names clusters with a random suffix, so
# metrics (PodMonitoring target labels) and the dashboard Service select on this label instead.
WORKLOAD_LABEL = "park-gke/workload"
# The GKE TPU device plugin serves chip metrics on the node; Ray's agent reads them from
# TPU_DEVICE_PLUGIN_ADDR and exports them as ray_tpu_* (the KubeRay TPU webhook sets the same).
TPU_DEVICE_PLUGIN_METRICS_PORT = 2112
# The user and group of Ray's images (`ray`, `users`). A uid without a passwd entry breaks
# getpass.getuser() in Ray and torch, so we keep the image's own non-root user.
RAY_UID = 1000
RAY_GID = 100
# The HF token reaches pods as a read-only file (huggingface_hub reads HF_TOKEN_PATH), never as an
# environment variable, which leaks into `ray job` logs, crash dumps and /proc/<pid>/environ.
HF_TOKEN_DIR = "/var/run/secrets/huggingface"
HF_TOKEN_VOLUME = "hf-token"
# Set by the program only when the stack's config flag asks for a public endpoint; the policy
# pack (policy/) rejects a LoadBalancer, NodePort or Ingress for Ray that lacks it.
EXPOSE_SERVE_ANNOTATION = "park-gke/expose-serve"
EXPOSE_DASHBOARD_ANNOTATION = "park-gke/expose-dashboard"


def workload_gsa_email(config: StackConfig) -> str:
    """The workload Google service account; deterministic, so manifests need no cloud lookup."""
    return f"park-workload@{config.project}.iam.gserviceaccount.com"


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


def _volumes(config: StackConfig, *, hf_token: bool = False) -> list[dict[str, Any]]:
    """The bucket through the GCS FUSE CSI driver (owned by the Ray user, who runs non-root),
    writable scratch for a read-only root, and the HF token file when there is one."""
    volumes: list[dict[str, Any]] = [
        {
            "name": GCS_VOLUME,
            "csi": {
                "driver": "gcsfuse.csi.storage.gke.io",
                "volumeAttributes": {
                    "bucketName": config.bucket_name,
                    "mountOptions": (
                        f"implicit-dirs,uid={RAY_UID},gid={RAY_GID},file-cache:max-size-mb:-1"
                    ),
                },
            },
        },
        {"name": "tmp", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
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


def _volume_mounts(config: StackConfig, *, hf_token: bool = False) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"name": GCS_VOLUME, "mountPath": config.storage.mount_path},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    if hf_token:
        mounts.append({"name": HF_TOKEN_VOLUME, "mountPath": HF_TOKEN_DIR, "readOnly": True})
    return mounts


def _env(hf_token: bool) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "HOME", "value": "/tmp"},  # caches go to the writable scratch
    ]
    if hf_token:
        env.append({"name": "HF_TOKEN_PATH", "value": f"{HF_TOKEN_DIR}/{HF_SECRET_KEY}"})
    return env


def _resources(cpu: int | str, memory: str, tpu_chips: int = 0) -> dict[str, Any]:
    amounts = {"cpu": str(cpu), "memory": memory, "ephemeral-storage": "20Gi"}
    if tpu_chips:
        amounts[catalog.TPU_RESOURCE] = str(tpu_chips)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _pod_metadata() -> dict[str, Any]:
    # The GCS FUSE sidecar is injected only when asked for; 0 = no sidecar resource limits.
    return {
        "annotations": {
            "gke-gcsfuse/volumes": "true",
            "gke-gcsfuse/cpu-limit": "0",
            "gke-gcsfuse/memory-limit": "0",
            "gke-gcsfuse/ephemeral-storage-limit": "0",
        }
    }


def head_group(
    config: StackConfig, image: str, *, hf_token: bool = False, autoscaler: bool = False
) -> dict[str, Any]:
    """The Ray head on the CPU pool. It runs no tasks (num-cpus 0); the dashboard listens on the
    pod network only — the head Service is ClusterIP and no Ingress is created. Only a head
    with KubeRay's autoscaler sidecar mounts an API token: the autoscaler scales worker groups
    through the Kubernetes API."""
    ports = [{"name": n, "containerPort": p} for n, p in HEAD_PORTS.items()]
    ports.append({"name": "metrics", "containerPort": METRICS_PORT})
    return {
        "serviceType": "ClusterIP",
        "rayStartParams": {
            "num-cpus": "0",
            "dashboard-host": "0.0.0.0",
            "metrics-export-port": str(METRICS_PORT),
        },
        "template": {
            "metadata": _pod_metadata(),
            "spec": {
                "serviceAccountName": WORKLOAD_KSA,
                "automountServiceAccountToken": autoscaler,
                "securityContext": _pod_security_context(),
                "nodeSelector": {ROLE_LABEL: "system"},
                "containers": [
                    {
                        "name": "ray-head",
                        "image": image,
                        "imagePullPolicy": "Always",
                        "ports": ports,
                        "resources": _resources(2, "8Gi"),
                        "env": _env(hf_token),
                        "volumeMounts": _volume_mounts(config, hf_token=hf_token),
                        "securityContext": _security_context(),
                    }
                ],
                "volumes": _volumes(config, hf_token=hf_token),
            },
        },
    }


def _tpu_metrics_env(config: StackConfig) -> list[dict[str, Any]]:
    if not config.observability.tpu_metrics:
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


def tpu_tolerations(pool: TpuPoolConfig) -> list[dict[str, str]]:
    tolerations = [
        {"key": catalog.TPU_TAINT_KEY, "operator": "Exists", "effect": catalog.TPU_TAINT_EFFECT}
    ]
    if pool.capacity == "queued":
        tolerations.append({"key": QUEUED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    return tolerations


def tpu_worker_group(
    config: StackConfig,
    pool: TpuPoolConfig,
    image: str,
    *,
    replicas: int,
    min_replicas: int,
    max_replicas: int,
    hf_token: bool = False,
) -> dict[str, Any]:
    """The worker group shared by training and serving: one Ray pod per TPU host."""
    tpu = pool.slice
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
            "metadata": _pod_metadata(),
            "spec": {
                "serviceAccountName": WORKLOAD_KSA,
                "automountServiceAccountToken": False,  # workers never call the API server
                "securityContext": _pod_security_context(),
                "nodeSelector": node_selector,
                "tolerations": tpu_tolerations(pool),
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": image,
                        "imagePullPolicy": "Always",
                        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
                        "resources": _resources(
                            tpu.pod_cpu, f"{tpu.pod_memory_gib}Gi", tpu.chips_per_host
                        ),
                        "env": [*_env(hf_token), *_tpu_metrics_env(config)],
                        "volumeMounts": _volume_mounts(config, hf_token=hf_token),
                        "securityContext": _security_context(),
                    }
                ],
                "volumes": _volumes(config, hf_token=hf_token),
            },
        },
    }


# ---------------------------------------------------------------------------------------------
# Training


def training_args(config: StackConfig) -> list[tuple[str, str]]:
    """The flags of `python -m workloads.train`, in order; TPU facts come from the catalog."""
    training = config.training
    tpu = config.tpu_pool(training.pool).slice
    return [
        ("--accelerator", "tpu"),
        ("--num-workers", str(tpu.chips * training.num_slices)),
        ("--tpu-topology", tpu.topology),
        ("--tpu-accelerator-type", tpu.ray_accelerator_type),
        ("--torch-tpu-topology", tpu.torch_tpu_topology),
        ("--chips-per-host", str(tpu.chips_per_host)),
        ("--num-slices", str(training.num_slices)),
        ("--peak-tflops-per-device", f"{tpu.generation.peak_bf16_tflops_per_chip:g}"),
        ("--strategy", training.strategy),
        ("--model-size", training.model_size),
        ("--steps", str(training.steps)),
        ("--global-batch-size", str(training.global_batch_size)),
        ("--seq-len", str(training.seq_len)),
        ("--lr", f"{training.learning_rate:g}"),
        ("--checkpoint-every", str(training.checkpoint_every)),
        ("--storage-path", f"gs://{config.bucket_name}/checkpoints"),
        ("--run-name", f"{config.stack}-{TRAINING_JOB_NAME}"),
        ("--max-failures", str(training.max_failures)),
        ("--data", training.data),
    ]


def entrypoint(args: list[tuple[str, str]]) -> str:
    parts = ["python", "-m", TRAIN_MODULE]
    for flag, value in args:
        parts += [flag, value]
    return shlex.join(parts)


def training_runtime_env(config: StackConfig) -> dict[str, Any]:
    # torch_tpu memoizes its env on first use; the training bridge sets the slice env per
    # worker before the process group starts (Ray 2.60 does not).
    return {"env_vars": {"PYTHONUNBUFFERED": "1", "TORCH_TPU_BASE_PORT": "8070"}}


def rayjob(config: StackConfig, *, queue_name: str | None = None) -> dict[str, Any]:
    """The training RayJob: runs to completion, then releases the TPUs."""
    training = config.training
    pool = config.tpu_pool(training.pool)
    image = config.image_for(training)
    labels = {"app.kubernetes.io/name": TRAINING_JOB_NAME, "app.kubernetes.io/part-of": "park-gke"}
    if queue_name:
        labels[QUEUE_NAME_LABEL] = queue_name
    spec: dict[str, Any] = {
        "entrypoint": entrypoint(training_args(config)),
        "runtimeEnvYAML": yaml.safe_dump(training_runtime_env(config), sort_keys=True),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": training.ttl_seconds_after_finished,
        "activeDeadlineSeconds": training.active_deadline_seconds,
        "backoffLimit": training.backoff_limit,
        "submitterPodTemplate": _submitter_template(image),
        "rayClusterSpec": {
            "rayVersion": RAY_VERSION,
            "headGroupSpec": head_group(config, image),
            "workerGroupSpecs": [
                tpu_worker_group(
                    config,
                    pool,
                    image,
                    replicas=training.num_slices,
                    min_replicas=training.num_slices,
                    max_replicas=training.num_slices,
                )
            ],
        },
    }
    _label_pods(spec["rayClusterSpec"], TRAINING_JOB_NAME)
    if queue_name:
        spec["suspend"] = True  # Kueue admits it when the queued capacity arrives
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": TRAINING_JOB_NAME, "namespace": config.namespace, "labels": labels},
        "spec": spec,
    }


def _submitter_template(image: str) -> dict[str, Any]:
    """KubeRay's submitter pod runs `ray job submit`; same image, small and locked down."""
    return {
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": WORKLOAD_KSA,
            "automountServiceAccountToken": False,  # it talks to the Ray dashboard, not the API
            "securityContext": _pod_security_context(),
            "nodeSelector": {ROLE_LABEL: "system"},
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": image,
                    "imagePullPolicy": "Always",
                    "resources": _resources("500m", "1Gi"),
                    "env": [{"name": "HOME", "value": "/tmp"}],  # `ray job submit` writes ~/.ray
                    "securityContext": _security_context(),
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        }
    }


# ---------------------------------------------------------------------------------------------
# Serving


def _model_source(config: StackConfig, source: str) -> str | dict[str, str]:
    """HF id as is; our own bucket through the FUSE mount (no copy); other buckets mirrored."""
    own = f"gs://{config.bucket_name}/"
    if source.startswith(own):
        return f"{config.storage.mount_path}/{source[len(own) :]}"
    if source.startswith("gs://"):
        return {"bucket_uri": source}
    return source


def serve_config(config: StackConfig) -> dict[str, Any]:
    """serveConfigV2: Ray Serve LLM's OpenAI app, one LLMConfig per served model."""
    serving = config.serving
    tpu = config.tpu_pool(serving.pool).slice
    llm_configs = []
    for model in serving.models:
        env = {"VLLM_DISABLE_COMPILE_CACHE": "1"}
        if tpu.multi_host:
            env["TPU_MULTIHOST_BACKEND"] = "ray"  # else vLLM silently runs on one host
        llm_configs.append(
            {
                "model_loading_config": {
                    "model_id": model.name,
                    "model_source": _model_source(config, model.source),
                },
                "accelerator_type": tpu.ray_accelerator_type,
                "accelerator_config": {"kind": "tpu", "topology": tpu.topology},
                "engine_kwargs": {
                    **model.engine_kwargs,
                    "tensor_parallel_size": model.tensor_parallel_size or tpu.chips,
                    "max_model_len": model.max_model_len,
                    "enable_expert_parallel": model.enable_expert_parallel,
                },
                "deployment_config": {
                    "autoscaling_config": {
                        "min_replicas": model.min_replicas,
                        "max_replicas": model.max_replicas,
                    }
                },
                "runtime_env": {"env_vars": env},
            }
        )
    return {
        "applications": [
            {
                "name": "llm",
                "route_prefix": "/",
                "import_path": "ray.serve.llm:build_openai_app",
                "args": {"llm_configs": llm_configs},
            }
        ]
    }


def rayservice(config: StackConfig, *, hf_token: bool) -> dict[str, Any]:
    """The serving RayService. Serve autoscaling drives the TPU worker group from 0 to the
    pool's slices. Upgrade strategy "NewCluster" (blue/green) holds twice the TPUs while it
    runs; the default "None" updates the serve config in place and needs no spare slice."""
    serving = config.serving
    pool = config.tpu_pool(serving.pool)
    image = config.image_for(serving)
    slices_needed = max(
        (m.min_replicas for m in serving.models), default=0
    )  # one replica per slice at most
    service_type = "LoadBalancer" if serving.expose_publicly else "ClusterIP"
    metadata: dict[str, Any] = {
        "name": SERVICE_NAME,
        "namespace": config.namespace,
        "labels": {
            "app.kubernetes.io/name": SERVICE_NAME,
            "app.kubernetes.io/part-of": "park-gke",
        },
    }
    if serving.expose_publicly:
        # park:serving.exposePublicly, made visible to review and to the policy pack
        metadata["annotations"] = {EXPOSE_SERVE_ANNOTATION: "true"}
    manifest: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": metadata,
        "spec": {
            "upgradeStrategy": {"type": serving.upgrade_strategy},
            "serveConfigV2": yaml.safe_dump(serve_config(config), sort_keys=False),
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
                "headGroupSpec": head_group(config, image, hf_token=hf_token, autoscaler=True),
                "workerGroupSpecs": [
                    tpu_worker_group(
                        config,
                        pool,
                        image,
                        replicas=min(slices_needed, pool.slices),
                        min_replicas=0,
                        max_replicas=pool.slices,
                        hf_token=hf_token,
                    )
                ],
            },
        },
    }
    _label_pods(manifest["spec"]["rayClusterConfig"], SERVICE_NAME)
    return manifest
