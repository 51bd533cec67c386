"""The RayJobs' own parts: the training job, the fields of its entrypoint, the submitter pod
and the runtime env every RayJob's driver gets (training here, RL in infra.plan.rl)."""

from __future__ import annotations

from typing import Any

import yaml

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
from workloads import protocol

# Keys of park:training a Hugging Face model run passes on under the same names, in the
# trainer's order: its data columns, then its export.
MODEL_DATA_FIELDS = ("data_split", "text_field", "messages_field", "prompt_field", "response_field")
MODEL_EXPORT_FIELDS = ("export", "export_every", "export_dtype", "export_max_shard_size")


def _spec_fields(training: TrainingPlan, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(training.spec, name) for name in names}


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
        fields["model_wait_s"] = training.limits.model_wait_s  # a staged copy: wait for it
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
        **(_spec_fields(training, MODEL_DATA_FIELDS) if spec.model else {}),
        "checkpoint_every": spec.checkpoint_every,
        "keep_checkpoints": spec.keep_checkpoints,
        "storage_path": training.storage_path,
        "run_name": training.run_name,
        "max_failures": spec.max_failures,
        **(
            _spec_fields(training, MODEL_EXPORT_FIELDS)
            if spec.model
            else {"export_every": spec.export_every or None}
        ),
    }
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
    labels = app_labels(TRAINING_JOB_NAME)
    if training.queue_name:
        labels[QUEUE_NAME_LABEL] = training.queue_name
    body: dict[str, Any] = {
        # KubeRay hands it to the submitter's args, where the kubelet expands $(VAR)
        "entrypoint": literal(protocol.training_entrypoint(training_fields(training))),
        "runtimeEnvYAML": yaml.safe_dump(training_runtime_env(), sort_keys=True),
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
