"""The Jobs that stage a stack's hub models into its bucket, once (`park stage-model`).

Why a Job printed by the CLI, not a resource the program deploys: staging a 57 GiB model takes
longer than Pulumi waits on a Job, it is needed once per model and revision (not on every
`pulumi up`), and it must finish before the workloads that read it start; a Job applied with
`kubectl apply -f -` after the first `pulumi up` (the bucket, the namespace and the Workload
Identity binding exist then) is the simplest step that is also re-runnable: the staging
module skips a complete copy of the same revision. It runs on the CPU pool as the workloads'
service account (the bucket's objectUser through Workload Identity), streams each file from
the hub into the bucket (workloads/train/stage.py): its scratch holds nothing but Python's.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from infra import disk
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
from infra.resolve import StackPlan

STAGE_MODULE = "workloads.train.stage"
STAGE_SCRATCH = disk.PodDisk(
    "stage-model", "cpu", (disk.Item("python and the hub client", disk.GIB),)
)


def _image(plan: StackPlan) -> str:
    """A workload image of the stack (torch-free staging runs in any of them): a stack stages
    models only for a workload that reads them (infra.disk)."""
    for workload in (plan.training, plan.rl, plan.serving):
        if workload is not None:
            return workload.image
    raise ValueError(f"stack {plan.spec.stack} stages models but runs no workload")


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


def staging_job(plan: StackPlan, model: disk.StagedModel) -> dict[str, Any]:
    pods = ray.ray_pods(plan)
    budget = STAGE_SCRATCH
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(model.repo),
            "namespace": pods.namespace,
            "labels": {"app.kubernetes.io/name": "park-stage-model", **PART_OF},
        },
        "spec": {
            "backoffLimit": 3,
            "ttlSecondsAfterFinished": 86400,
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
                            "image": _image(plan),
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


def staging_jobs(plan: StackPlan) -> list[dict[str, Any]]:
    """One Job per hub model the stack reads from its bucket (infra.disk's staged models)."""
    if plan.disk is None:
        return []
    return [staging_job(plan, model) for model in plan.disk.staged]
