"""KubeRay manifests (RayJob for training, RayService for serving) as plain dicts.

`pods`: the Ray pods every manifest is built from (head, TPU worker group, volumes, env);
`job`: the RayJobs (training here, RL in infra.plan.rl); `service`: the serving RayService.
The names below are what callers use, so `from infra.plan import ray` reads as one module.
"""

from infra.plan.ray.job import (
    rayjob,
    submitter_template,
    trainer_flags,
    training_runtime_env,
)
from infra.plan.ray.pods import (
    DISK_BUDGET_ANNOTATION,
    GCSFUSE_BUFFER_VOLUME,
    GCSFUSE_CACHE_VOLUME,
    SCRATCH,
    RayPods,
    app_labels,
    container_env,
    container_resources,
    container_security_context,
    head_group,
    label_pods,
    mount_options,
    pod_metadata,
    pod_security_context,
    pod_volumes,
    ray_pods,
    scratch_env,
    tpu_metrics_env,
    tpu_tolerations,
    tpu_worker_group,
    volume_mounts,
)
from infra.plan.ray.service import (
    COMPILE_CACHE_DIR,
    HEALTH_CHECK_TIMEOUT_S,
    compile_cache_key,
    model_source,
    rayservice,
    serve_config,
)

__all__ = [
    "COMPILE_CACHE_DIR",
    "DISK_BUDGET_ANNOTATION",
    "GCSFUSE_BUFFER_VOLUME",
    "GCSFUSE_CACHE_VOLUME",
    "HEALTH_CHECK_TIMEOUT_S",
    "SCRATCH",
    "RayPods",
    "app_labels",
    "compile_cache_key",
    "container_env",
    "container_resources",
    "container_security_context",
    "head_group",
    "label_pods",
    "model_source",
    "mount_options",
    "pod_metadata",
    "pod_security_context",
    "pod_volumes",
    "ray_pods",
    "rayjob",
    "rayservice",
    "scratch_env",
    "serve_config",
    "submitter_template",
    "tpu_metrics_env",
    "tpu_tolerations",
    "tpu_worker_group",
    "trainer_flags",
    "training_runtime_env",
    "volume_mounts",
]
