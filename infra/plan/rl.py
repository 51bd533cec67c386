"""The RL RayJob (`park:rl`) as a plain dict: one Ray cluster, a CPU head and two accelerator
worker groups, the learner on its TPU pool and the vLLM rollout engines on theirs.

The groups are the training RayJob's (infra/plan/ray/pods.py: one Ray pod per TPU host, one replica
per slice, the pool's own label in the nodeSelector so two pools of one shape never take each
other's nodes). A GPU rollout pool gets a worker group of one pod per node holding every GPU of
it. The entrypoint is ``python -m workloads.rl ...`` rendered from workloads/rl/config.py after
its own rules; every count in it is the resolved plan's (infra.resolve.rl).
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from infra.names import GPU_TAINT_KEY, METRICS_PORT, METRICS_PORT_NAME, POOL_LABEL
from infra.plan import ray
from infra.plan.kubelet import literal
from infra.resolve.types import RL_JOB_NAME, RlPlan, RolloutPlan
from infra.versions import RAY_VERSION
from workloads import flags
from workloads.rl.config import RLRunConfig
from workloads.rl.config_check import rl_entrypoint

GPU_RESOURCE = "nvidia.com/gpu"
# A Ray custom resource only the rollout group's pods advertise, one per chip (or GPU): the
# engines ask for it (--rollout-resource), so they never land on the learner's TPU hosts, which
# advertise `TPU` too.
ROLLOUT_RESOURCE = "park_rollout"


def rollout_start_params(units: int) -> dict[str, str]:
    """rayStartParams of a rollout pod holding `units` chips or GPUs. KubeRay passes
    `resources` to `ray start --resources` through a shell: the JSON is quoted as in its own
    TPU samples (kuberay v1.7.0 samples/ray-job.tpu-v6e-256-multihost.yaml)."""
    resources = json.dumps({ROLLOUT_RESOURCE: units}).replace('"', '\\"')
    return {"metrics-export-port": str(METRICS_PORT), "resources": f'"{resources}"'}


# A GPU pod's CPU and memory per GPU: what the smallest GPU machine (g2-standard-4, one L4:
# 4 vCPU, 16 GB) leaves allocatable, so the request schedules on any GPU machine type.
GPU_POD_CPU_PER_GPU = 3
GPU_POD_MEMORY_GIB_PER_GPU = 12


def rl_flags(rl: RlPlan) -> dict[str, Any]:
    """The flags of `python -m workloads.rl` the stack sets, in the workload's order: the plan's
    values (the learner's TPU facts, the engines' layout, counts), and each flag a park:rl key
    sets (its `stack=` in workloads/rl/config.py), read from the spec; None values left out."""
    tpu, rollout = rl.learner.slice, rl.rollout
    planned: dict[str, Any] = {
        "accelerator": "tpu",
        "num_workers": rl.workers,
        "tpu_topology": tpu.topology,
        "tpu_accelerator_type": tpu.ray_accelerator_type,
        "torch_tpu_topology": tpu.torch_tpu_topology,
        "chips_per_host": tpu.chips_per_host,
        "micro_batch_size": rl.micro_batch,  # the plan's: what preview proved fits
        "rollout_accelerator": rollout.kind,
        "rollout_engines": rollout.engines,
        "rollout_tensor_parallel_size": rollout.tensor_parallel,
        "rollout_torch_tpu_topology": rollout.torch_tpu_topology,
        "rollout_resource": ROLLOUT_RESOURCE,
        "model": rl.model_path,
        "storage_path": rl.storage_path,
        "run_name": rl.run_name,
    }
    return flags.stack_flags(RLRunConfig, rl.spec, planned, with_model=True)  # a policy, always


def gpu_worker_group(
    pods: ray.RayPods, rollout: RolloutPlan, image: str, *, hf_token: bool = False
) -> dict[str, Any]:
    """One Ray pod per GPU node of the rollout pool, holding all its GPUs; tolerates the GPU
    taint GKE puts on GPU pools, selects the pool by its label."""
    assert rollout.gpu is not None
    pool = rollout.gpu.spec
    budget = pods.budget("rl-rollout")
    gpus = pool.accelerator_count
    resources = ray.container_resources(
        GPU_POD_CPU_PER_GPU * gpus, f"{GPU_POD_MEMORY_GIB_PER_GPU * gpus}Gi", budget
    )
    for side in ("requests", "limits"):
        resources[side][GPU_RESOURCE] = str(gpus)
    return {
        "groupName": pool.name,
        "replicas": rollout.groups,
        "minReplicas": rollout.groups,
        "maxReplicas": rollout.groups,
        "rayStartParams": rollout_start_params(gpus),
        "template": {
            "metadata": ray.pod_metadata("rl-rollout", budget),
            "spec": {
                "serviceAccountName": pods.service_account,
                "automountServiceAccountToken": False,
                "securityContext": ray.pod_security_context(),
                "nodeSelector": {POOL_LABEL: pool.name},
                "tolerations": [
                    {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
                ],
                "containers": [
                    {
                        "name": "ray-worker",
                        "image": image,
                        "imagePullPolicy": "Always",
                        "ports": [{"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT}],
                        "resources": resources,
                        "env": ray.container_env(pods, hf_token),
                        "volumeMounts": ray.volume_mounts(pods, hf_token=hf_token),
                        "securityContext": ray.container_security_context(),
                    }
                ],
                "volumes": ray.pod_volumes(pods, budget, hf_token=hf_token),
            },
        },
    }


def rollout_group(rl: RlPlan, pods: ray.RayPods, *, hf_token: bool = False) -> dict[str, Any]:
    """The rollout engines' worker group: every slice (or GPU node) of the rollout pool."""
    rollout = rl.rollout
    if rollout.tpu is None:
        return gpu_worker_group(pods, rollout, rl.image, hf_token=hf_token)
    groups = rollout.groups
    group = ray.tpu_worker_group(
        pods,
        rollout.tpu,
        rl.image,
        replicas=groups,
        min_replicas=groups,
        max_replicas=groups,
        hf_token=hf_token,
        role="rl-rollout",
    )
    group["rayStartParams"] |= rollout_start_params(rollout.tpu.slice.chips_per_host)
    return group


def rl_rayjob(rl: RlPlan, pods: ray.RayPods, *, hf_token: bool = False) -> dict[str, Any]:
    """The RL RayJob: runs to completion, then releases both pools' slices."""
    spec, image = rl.spec, rl.image
    learner = ray.tpu_worker_group(
        pods,
        rl.learner,
        image,
        replicas=rl.slices,
        min_replicas=rl.slices,
        max_replicas=rl.slices,
        hf_token=hf_token,
        role="rl-learner",
    )
    body: dict[str, Any] = {
        "entrypoint": literal(rl_entrypoint(rl_flags(rl))),  # infra.plan.kubelet
        "runtimeEnvYAML": yaml.safe_dump(
            ray.training_runtime_env(rl.learner.slice), sort_keys=True
        ),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
        "activeDeadlineSeconds": spec.active_deadline_seconds,
        "backoffLimit": spec.backoff_limit,
        "submitterPodTemplate": ray.submitter_template(pods, image),
        "rayClusterSpec": {
            "rayVersion": RAY_VERSION,
            "headGroupSpec": ray.head_group(pods, image, hf_token=hf_token, role="rl-head"),
            "workerGroupSpecs": [learner, rollout_group(rl, pods, hf_token=hf_token)],
        },
    }
    ray.label_pods(body["rayClusterSpec"], RL_JOB_NAME)
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {
            "name": RL_JOB_NAME,
            "namespace": pods.namespace,
            "labels": ray.app_labels(RL_JOB_NAME),
        },
        "spec": body,
    }
