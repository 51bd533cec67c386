"""The Jobs that stage a stack's hub models into its bucket, once, before anything reads them.

Staging is part of `pulumi up`: each Job is a resource of the program (infra/components/
staging.py) that pulumi-kubernetes awaits until it is Complete, and every workload that reads a
staged model depends on it, so a training run or a serving replica never starts before its model
is in the bucket. The await's bound comes from the model's size (`disk.stage_timeout_s`, the
bound its readers wait too). A Job that failed is replaced on the next `pulumi up`
(`pulumi.com/replaceUnready`), and a rerun of a complete copy of the same revision does nothing
(the stage module's marker), so `up` is idempotent. `park stage-model STACK | kubectl apply
-f -` prints the same Jobs for manual use.

It runs on the CPU pool as the workloads' service account (the bucket roles of
infra/plan/storage.py, through Workload Identity) and streams each file from the hub into the
bucket (workloads/train/stage.py): its scratch holds nothing but Python's. A copy cut short
resumes file by file, and calls refused while the new IAM binding propagates are retried.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from infra.names import (
    HF_SECRET_KEY,
    HF_SECRET_NAME,
    HF_TOKEN_DIR,
    HF_TOKEN_VOLUME,
    PART_OF,
    ROLE_LABEL,
)
from infra.plan import ray
from infra.plan.kubelet import literal
from infra.resolve import StackPlan, disk
from infra.resolve.host_memory import Item

STAGE_MODULE = "workloads.train.stage"
STAGE_SCRATCH = disk.PodDisk("stage-model", "cpu", (Item("python and the hub client", disk.GIB),))
# pulumi-kubernetes replaces a Job that is not Complete on the next update (FACTS.md).
REPLACE_UNREADY = {"pulumi.com/replaceUnready": "true"}
STAGE_RETRIES = 3  # the Job's own retries of a failed pod (a dropped stream, a preempted node)


@dataclass(frozen=True)
class StageJob:
    """One model's staging Job and how long `pulumi up` waits for it."""

    model: disk.StagedModel
    manifest: dict[str, Any]
    timeout_s: int


def stage_image(plan: StackPlan) -> str:
    """The image a staging Job runs: a workload's (torch-free staging runs in any of them).
    Only workloads read staged models, so a stack that stages has one."""
    for workload in (plan.training, plan.serving, plan.rl):
        if workload is not None:
            return workload.image
    raise ValueError("a stack without workloads stages no model")


# A Job's name is a DNS-1123 label in practice: the Job controller copies it into the
# `batch.kubernetes.io/job-name` label of its pods, whose values are at most 63 characters.
_JOB_NAME_MAX = 63
_NOT_SLUG = re.compile(r"[^a-z0-9]+")  # ASCII only: str.isalnum would let "é" through
DIGEST_CHARS = 8


def job_name(repo: str) -> str:
    """The one name of hub model `repo`'s stage Job: ``park-stage-<slug>-<digest>``, a DNS-1123
    label. The slug (the id in lowercase ASCII letters and digits, the rest folded to '-') is
    for people; the digest (the first hex digits of the id's SHA-256) keeps two ids apart that
    fold to one slug (`Org/a.b`, `org/a-b`) or share their first 60 characters."""
    suffix = hashlib.sha256(repo.encode()).hexdigest()[:DIGEST_CHARS]
    slug = _NOT_SLUG.sub("-", repo.lower()).strip("-")
    head = f"park-stage-{slug}"[: _JOB_NAME_MAX - len(suffix) - 1].rstrip("-")
    return f"{head}-{suffix}"


def staging_job(
    pods: ray.RayPods, model: disk.StagedModel, image: str, deadline_s: int
) -> dict[str, Any]:
    """The Job that stages `model`: no ttlSecondsAfterFinished, as Pulumi owns the Job (a Job
    the cluster deleted would be re-created by the next refresh, for nothing). It ends by
    `deadline_s`, the bound `up` awaits it for (activeDeadlineSeconds): a Job is never still
    running when the next `up` replaces it, and the replacement resumes the copy."""
    budget = STAGE_SCRATCH
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(model.repo),
            "namespace": pods.namespace,
            "labels": {"app.kubernetes.io/name": "park-stage-model", **PART_OF},
            "annotations": dict(REPLACE_UNREADY),
        },
        "spec": {
            "backoffLimit": STAGE_RETRIES,
            "activeDeadlineSeconds": deadline_s,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "serviceAccountName": pods.service_account,
                    "automountServiceAccountToken": False,
                    "securityContext": ray.pod_security_context(),
                    "nodeSelector": {ROLE_LABEL: "system"},
                    "containers": [
                        {
                            "name": "stage",
                            "image": image,
                            "imagePullPolicy": "Always",
                            "command": [
                                literal(word)  # infra.plan.kubelet
                                for word in (
                                    "python",
                                    "-m",
                                    STAGE_MODULE,
                                    "--repo",
                                    model.repo,
                                    "--dest",
                                    model.uri,
                                )
                            ],
                            "env": [
                                {"name": "PYTHONUNBUFFERED", "value": "1"},
                                {"name": "HOME", "value": ray.SCRATCH},
                                {"name": "HF_HOME", "value": f"{ray.SCRATCH}/huggingface"},
                                {
                                    "name": "HF_TOKEN_PATH",
                                    "value": f"{HF_TOKEN_DIR}/{HF_SECRET_KEY}",
                                },
                            ],
                            "resources": ray.container_resources(1, "2Gi", budget),
                            "securityContext": ray.container_security_context(),
                            "volumeMounts": [
                                {"name": "tmp", "mountPath": ray.SCRATCH},
                                {
                                    "name": HF_TOKEN_VOLUME,
                                    "mountPath": HF_TOKEN_DIR,
                                    "readOnly": True,
                                },
                            ],
                        }
                    ],
                    "volumes": [
                        {"name": "tmp", "emptyDir": {"sizeLimit": budget.scratch_limit}},
                        {
                            # the workspace's token when the stack has one (a gated model)
                            "name": HF_TOKEN_VOLUME,
                            "secret": {
                                "secretName": HF_SECRET_NAME,
                                "optional": True,
                                "items": [{"key": HF_SECRET_KEY, "path": HF_SECRET_KEY}],
                                "defaultMode": 0o440,
                            },
                        },
                    ],
                }
            },
        },
    }


def stage_jobs(plan: StackPlan) -> tuple[StageJob, ...]:
    """One Job per hub model the stack reads from its bucket (resolve.disk's staged models)."""
    if plan.disk is None or not plan.disk.staged:
        return ()
    pods, image = ray.ray_pods(plan), stage_image(plan)
    return tuple(stage_job(pods, model, image) for model in plan.disk.staged)


def stage_job(pods: ray.RayPods, model: disk.StagedModel, image: str) -> StageJob:
    """`model`'s Job, bounded by `stage_timeout_s`: what `up` awaits is what the Job may take."""
    timeout_s = model.stage_timeout_s
    return StageJob(model, staging_job(pods, model, image, timeout_s), timeout_s)


def staging_jobs(plan: StackPlan) -> list[dict[str, Any]]:
    """The Jobs' manifests, as `park stage-model` prints them."""
    return [job.manifest for job in stage_jobs(plan)]
