"""The RayJobs' own parts: the training job, the flags of its entrypoint, the submitter pod
and the runtime env every RayJob's driver gets (training here, RL in infra.plan.rl)."""

from __future__ import annotations

from typing import Any

import yaml

from infra import catalog
from infra.names import QUEUE_NAME_LABEL, ROLE_LABEL, TRAINING_JOB_NAME
from infra.plan.kubelet import literal
from infra.plan.ray.pods import (
    DISK_BUDGET_ANNOTATION,
    RayPods,
    app_labels,
    container_resources,
    container_security_context,
    head_group,
    label_pods,
    pod_security_context,
    tpu_worker_group,
)
from infra.resolve import TrainingPlan
from infra.versions import RAY_VERSION
from workloads import flags, protocol
from workloads.train.config import TrainConfig
from workloads.train.config_check import training_entrypoint


def trainer_flags(training: TrainingPlan) -> dict[str, Any]:
    """The flags of `python -m workloads.train` the stack sets, in the trainer's order: the
    plan's values (TPU facts from the catalog, counts from the resolved plan), and each flag a
    park:training key sets (its `stack=` in workloads/train/config.py), read from the spec."""
    spec, tpu = training.spec, training.pool.slice
    planned: dict[str, Any] = {
        "accelerator": "tpu",
        "num_workers": training.workers,
        "tpu_topology": tpu.topology,
        "tpu_accelerator_type": tpu.ray_accelerator_type,
        "torch_tpu_topology": tpu.torch_tpu_topology,
        "chips_per_host": tpu.chips_per_host,
        "num_slices": training.slices,
        "peak_tflops_per_device": tpu.generation.peak_bf16_tflops_per_device,
        # the staged copy of a hub model, through the mount (resolve.disk), and the wait for it
        "model": (training.model_path or spec.model) if spec.model else None,
        "model_wait_s": training.limits.model_wait_s if spec.model else None,
        # The plan's micro-batch (the pin, or the most that fit: infra.resolve.training_fit), so the
        # run holds what preview proved fits; the trainer accumulates over the rest.
        "micro_batch_size": training.micro_batch,
        "storage_path": training.storage_path,
        "run_name": training.run_name,
    }
    return flags.stack_flags(TrainConfig, spec, planned, with_model=bool(spec.model))


def training_runtime_env(tpu: catalog.TpuSlice | None = None) -> dict[str, Any]:
    # torch_tpu memoizes its env on first use; the training bridge sets the slice env per
    # worker before the process group starts (Ray 2.60 does not). The driver sizes the
    # ScalingConfig's TPU placement group in its own process: it needs Ray's per-chip count.
    return {
        "env_vars": {
            "PYTHONUNBUFFERED": "1",
            "TORCH_TPU_BASE_PORT": str(protocol.TORCH_TPU_BASE_PORT),
            **(tpu.ray_env() if tpu else {}),
        }
    }


def rayjob(training: TrainingPlan, pods: RayPods, *, hf_token: bool = False) -> dict[str, Any]:
    """The training RayJob: runs to completion, then releases the TPUs. `hf_token`: the
    workspace holds the HF token Secret (a gated base model); every Ray pod reads it."""
    spec, image = training.spec, training.image
    labels = app_labels(TRAINING_JOB_NAME)
    if training.queue_name:
        labels[QUEUE_NAME_LABEL] = training.queue_name
    body: dict[str, Any] = {
        # KubeRay hands it to the submitter's args, where the kubelet expands $(VAR)
        "entrypoint": literal(training_entrypoint(trainer_flags(training))),
        "runtimeEnvYAML": yaml.safe_dump(training_runtime_env(training.pool.slice), sort_keys=True),
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": spec.ttl_seconds_after_finished,
        "activeDeadlineSeconds": training.limits.active_deadline_s,  # the budget + model wait
        "backoffLimit": training.limits.backoff_limit,
        "submitterPodTemplate": submitter_template(pods, image),
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
    label_pods(body["rayClusterSpec"], TRAINING_JOB_NAME)
    if training.queue_name:
        body["suspend"] = True  # Kueue admits it when the queued capacity arrives
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": TRAINING_JOB_NAME, "namespace": pods.namespace, "labels": labels},
        "spec": body,
    }


def submitter_template(pods: RayPods, image: str) -> dict[str, Any]:
    """KubeRay's submitter pod runs `ray job submit`; same image, small and locked down."""
    budget = pods.budget("submitter")
    return {
        "metadata": {"annotations": {DISK_BUDGET_ANNOTATION: "submitter"}},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": pods.service_account,
            "automountServiceAccountToken": False,  # it talks to the Ray dashboard, not the API
            "securityContext": pod_security_context(),
            "nodeSelector": {ROLE_LABEL: "system"},
            "containers": [
                {
                    "name": "ray-job-submitter",
                    "image": image,
                    "imagePullPolicy": "Always",
                    "resources": container_resources("500m", "1Gi", budget),
                    "env": [{"name": "HOME", "value": "/tmp"}],  # `ray job submit` writes ~/.ray
                    "securityContext": container_security_context(),
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": budget.scratch_limit}}],
        },
    }
