"""The Ray pods every KubeRay manifest of the stack is built from: the head, the TPU worker
group, their volumes, environment, resources and security context.

Kept close to KubeRay v1.7.0's own TPU samples (`samples/ray-*.tpu-v6e-*.yaml`): `replicas` =
slices, `numOfHosts` = hosts per slice, `google.com/tpu` requests = limits = chips per host,
nodeSelectors on the accelerator and topology labels. Deliberate differences are commented.
The RayJobs (infra.plan.ray.job) and the RayService (infra.plan.ray.service) assemble these.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from infra import catalog
from infra.names import (
    APP_NAME_LABEL,
    GCS_VOLUME,
    HEAD_PORTS,
    HF_SECRET_KEY,
    HF_SECRET_NAME,
    HF_TOKEN_DIR,
    HF_TOKEN_VOLUME,
    METRICS_PORT,
    METRICS_PORT_NAME,
    PART_OF,
    POOL_LABEL,
    QUEUED_TAINT_KEY,
    RAY_GID,
    RAY_NODE_LABEL,
    RAY_NODE_TYPE_LABEL,
    RAY_UID,
    ROLE_LABEL,
    RUNG_LABEL,
    TPU_DEVICE_PLUGIN_METRICS_PORT,
    WORKLOAD_LABEL,
)
from infra.plan.kubelet import literal
from infra.resolve import PoolPlan, StackPlan, disk
from infra.resolve.disk import DiskPlan, PodDisk


@dataclass(frozen=True)
class RayPods:
    """What every Ray pod of a stack mounts and runs as."""

    namespace: str
    bucket: str
    mount_path: str  # where pods see the bucket (GCS FUSE)
    service_account: str  # the KSA, bound to the workload GSA through Workload Identity
    tpu_metrics: bool = True  # TPU chip metrics from the device plugin
    disk: DiskPlan | None = None  # each pod's scratch and file cache (infra.resolve.disk)

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


def container_security_context() -> dict[str, Any]:
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


def pod_security_context() -> dict[str, Any]:
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
# Its write buffer, where a write it cannot stream is staged whole: ours too, sized by the plan
# (infra/resolve/disk.py GCSFUSE_WRITE_BUFFER_BYTES), instead of an unbounded emptyDir.
GCSFUSE_BUFFER_VOLUME = "gke-gcsfuse-buffer"


def mount_options(budget: disk.PodDisk) -> str:
    """gcsfuse's options: the Ray user owns the files; the file cache capped at what the disk
    plan gives this pod (0: no cache; gcsfuse evicts past the cap); streaming writes, so a
    checkpoint or export written through the mount is uploaded as it is written, not staged
    whole in a local temp file first (the default from gcsfuse 3.0, explicit for older)."""
    return (
        f"implicit-dirs,uid={RAY_UID},gid={RAY_GID},"
        f"file-cache:max-size-mb:{budget.file_cache_mb},write:enable-streaming-writes:true"
    )


def pod_volumes(
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
        {"name": GCSFUSE_BUFFER_VOLUME, "emptyDir": {"sizeLimit": budget.write_buffer_limit}},
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


def volume_mounts(pods: RayPods, *, hf_token: bool = False) -> list[dict[str, Any]]:
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


def container_env(
    pods: RayPods, hf_token: bool, extra: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Every Ray container's variables, each value as the kubelet must pass it on (the mount
    path and the bucket come from the stack: infra.plan.kubelet)."""
    values = {"PYTHONUNBUFFERED": "1", **scratch_env(pods)}
    if hf_token:
        values["HF_TOKEN_PATH"] = f"{HF_TOKEN_DIR}/{HF_SECRET_KEY}"
    values |= dict(sorted((extra or {}).items()))
    return [{"name": k, "value": literal(v)} for k, v in values.items()]


def container_resources(
    cpu: int | str, memory: str, budget: disk.PodDisk, tpu_chips: int = 0
) -> dict[str, Any]:
    """Requests = limits; ephemeral storage is the disk plan's worst case for this pod."""
    amounts = {"cpu": str(cpu), "memory": memory, "ephemeral-storage": budget.limit}
    if tpu_chips:
        amounts[catalog.TPU_RESOURCE] = str(tpu_chips)
    return {"requests": dict(amounts), "limits": dict(amounts)}


# Which of the disk plan's budgets a pod was sized from (resolve/disk.py), for review and tests.
DISK_BUDGET_ANNOTATION = "park-gke/disk-budget"


# The cluster autoscaler never drains a node to remove it while such a pod runs there: a Ray
# head's node stays while its run does (KubeRay fails a RayJob whose head is gone for 300 s).
SAFE_TO_EVICT_ANNOTATION = "cluster-autoscaler.kubernetes.io/safe-to-evict"


def pod_metadata(role: str, budget: disk.PodDisk) -> dict[str, Any]:
    """The GCS FUSE sidecar is injected only when asked for; CPU and memory 0: no limits. Its
    disk (its write buffer and logs) is the plan's, request = limit, and counted in the node's
    sum (infra/resolve/disk.py); the webhook's default would request 5Gi nothing counted."""
    annotations = {
        "gke-gcsfuse/volumes": "true",
        "gke-gcsfuse/cpu-limit": "0",
        "gke-gcsfuse/memory-limit": "0",
        "gke-gcsfuse/ephemeral-storage-request": budget.sidecar_limit,
        "gke-gcsfuse/ephemeral-storage-limit": budget.sidecar_limit,
        DISK_BUDGET_ANNOTATION: role,
    }
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
    through the Kubernetes API. `role`: its disk budget in the plan (infra.resolve.disk)."""
    budget = pods.budget(role)
    ports = [{"name": n, "containerPort": p} for n, p in HEAD_PORTS.items()]
    ports.append({"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT})
    metadata = pod_metadata(role, budget)
    metadata["annotations"][SAFE_TO_EVICT_ANNOTATION] = "false"
    return {
        "serviceType": "ClusterIP",
        "rayStartParams": {
            "num-cpus": "0",
            "dashboard-host": "0.0.0.0",
            "metrics-export-port": str(METRICS_PORT),
        },
        "template": {
            "metadata": metadata,
            "spec": {
                "serviceAccountName": pods.service_account,
                "automountServiceAccountToken": autoscaler,
                "securityContext": pod_security_context(),
                "nodeSelector": {ROLE_LABEL: "system"},
                "containers": [
                    {
                        "name": "ray-head",
                        "image": image,
                        "imagePullPolicy": "Always",
                        "ports": ports,
                        "resources": container_resources(2, "8Gi", budget),
                        "env": container_env(pods, hf_token, extra_env),
                        "volumeMounts": volume_mounts(pods, hf_token=hf_token),
                        "securityContext": container_security_context(),
                    }
                ],
                "volumes": pod_volumes(pods, budget, hf_token=hf_token),
            },
        },
    }


def tpu_metrics_env(pods: RayPods) -> list[dict[str, Any]]:
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


def label_pods(cluster_spec: dict[str, Any], workload: str) -> dict[str, Any]:
    for group in (cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]):
        group["template"]["metadata"].setdefault("labels", {})[WORKLOAD_LABEL] = workload
    return cluster_spec


RAY_KINDS = ("RayJob", "RayService", "RayCluster")


def head_disruption_budget(manifest: dict[str, Any]) -> dict[str, Any]:
    """The PodDisruptionBudget (policy/v1) of a Ray object's head: no voluntary eviction
    (maxUnavailable 0), so neither a node drain (GKE's node upgrades, the autoscaler) nor
    `kubectl drain` takes the head of a running job or service. It selects the head pods of
    this workload: KubeRay's labels on every head pod (`ray.io/is-ray-node`, `ray.io/node-type:
    head`) and the workload label the head template carries, which KubeRay keeps on the pod
    (its RayCluster, and so `ray.io/cluster`, has a random suffix for a RayJob or RayService).
    Named `<workload>-head`, in the object's namespace."""
    kind = manifest["kind"]
    spec = manifest["spec"]
    cluster = {"RayJob": "rayClusterSpec", "RayService": "rayClusterConfig"}.get(kind)
    head = (spec[cluster] if cluster else spec)["headGroupSpec"]["template"]["metadata"]
    workload = head["labels"][WORKLOAD_LABEL]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": f"{workload}-head",
            "namespace": manifest["metadata"]["namespace"],
            "labels": {**(manifest["metadata"].get("labels") or {})},
        },
        "spec": {
            "maxUnavailable": 0,
            "selector": {
                "matchLabels": {
                    RAY_NODE_LABEL: "yes",
                    RAY_NODE_TYPE_LABEL: "head",
                    WORKLOAD_LABEL: workload,
                }
            },
        },
    }


def tpu_tolerations(pool: PoolPlan) -> list[dict[str, str]]:
    tolerations = [
        {"key": catalog.TPU_TAINT_KEY, "operator": "Exists", "effect": catalog.TPU_TAINT_EFFECT}
    ]
    # Every rung of the ladder: Kueue picks the rung (its flavor's nodeSelector), the pods must
    # tolerate whichever it picks.
    if pool.queued:
        tolerations.append({"key": QUEUED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"})
    if pool.laddered:
        tolerations.append({"key": RUNG_LABEL, "operator": "Exists", "effect": "NoSchedule"})
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
    per slice. `role`: its disk budget in the plan (infra.resolve.disk)."""
    tpu = pool.slice
    budget = pods.budget(role)
    # The pool's own label too: two pools of one topology (prod: training on a reservation,
    # serving on demand) must not take each other's nodes, nor make the autoscaler grow the
    # wrong one.
    node_selector = {**tpu.node_labels(), POOL_LABEL: pool.name}
    if pool.capacity == "spot" and not pool.laddered:  # on a ladder, Kueue adds the rung's
        node_selector[catalog.SPOT_LABEL] = "true"
    start_params = {"metrics-export-port": str(METRICS_PORT)}
    if tpu.devices_per_host != tpu.chips_per_host:
        # KubeRay sets `TPU` from google.com/tpu (chips); a device each is what Ray Train and
        # Serve schedule (RAY_TPU_RESOURCE_PER_CHIP in the env below). `google.com/tpu` stays
        # chips: the device plugin's and the TPU webhook's unit.
        start_params["resources"] = json.dumps(json.dumps({"TPU": tpu.devices_per_host}))
    return {
        "groupName": pool.name,
        "replicas": replicas,
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "numOfHosts": tpu.hosts,
        "rayStartParams": start_params,
        "template": {
            "metadata": pod_metadata(role, budget),
            "spec": {
                "serviceAccountName": pods.service_account,
                "automountServiceAccountToken": False,  # workers never call the API server
                "securityContext": pod_security_context(),
                "nodeSelector": node_selector,
                "tolerations": tpu_tolerations(pool),
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": image,
                        "imagePullPolicy": "Always",
                        "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT}],
                        "resources": container_resources(
                            tpu.pod_cpu, f"{tpu.pod_memory_gib}Gi", budget, tpu.chips_per_host
                        ),
                        "env": [
                            *container_env(pods, hf_token, {**tpu.ray_env(), **(extra_env or {})}),
                            *tpu_metrics_env(pods),
                        ],
                        "volumeMounts": volume_mounts(pods, hf_token=hf_token),
                        "securityContext": container_security_context(),
                    }
                ],
                "volumes": pod_volumes(pods, budget, hf_token=hf_token),
            },
        },
    }


def app_labels(name: str) -> dict[str, str]:
    return {APP_NAME_LABEL: name, **PART_OF}
