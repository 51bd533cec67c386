"""Running a rendered RayJob on the local Ray as KubeRay's submitter does (`ray job submit
--runtime-env-json ... -- <entrypoint>`), after its CPU profile, printed, and following it to
its end: one path for the training job (run.py) and the RL job (rl.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.markup import escape

from infra.plan.kubelet import as_run
from infra.tools.local import console as console_out
from infra.tools.local.bucket import EmulatedBucket, EmulatorError
from infra.tools.local.outcome import LocalRun
from infra.tools.local.profile import ProfileError, cpu_entrypoint, runtime_env_of
from infra.tools.local.ray_head import (
    LocalRunError,
    follow_job,
    log_tail,
    ray_auth_env,
)
from workloads import protocol

# rendered entrypoint -> (the CPU entrypoint, what changed)
Profile = Callable[[str], tuple[str, list[str]]]


@dataclass(frozen=True)
class LocalJob:
    """How one kind of RayJob runs here: its CPU profile and what is printed. The defaults
    are the training job's (run.py); the RL job (rl.py) names its own."""

    profile: Profile = cpu_entrypoint
    kind: str = "training"  # prefixes its changes in the summary
    title: str = "training: the RayJob's entrypoint through the Ray Jobs API"  # numbered
    table: str = "infra/tools/local/profile.py TRAIN_CPU_PROFILE"  # where the profile is
    log_name: str = "train.log"  # its kept log, in the run's folder
    timeout_s: float = 1800.0
    label: str = "training"  # in the timeout message
    failed_as: str = "training job"  # in the failure message


def run_job(
    job: LocalJob,
    rayjob: dict[str, Any],
    run: LocalRun,
    *,
    on_record: Callable[[str, dict[str, Any]], None],
    succeeded: Callable[[dict[str, Any] | None], bool],
) -> None:
    """Apply the job's profile to the RayJob's entrypoint, print the changes, the runtime env
    and the entrypoint, submit them through the Jobs API and follow the job to its end
    (protocol lines to `on_record`). Its storage stays the rendered ``gs://`` path: the job
    reaches the emulated bucket through the gate named in its runtime env (`outcome.bucket`).
    The changes, the job id and its time go on `outcome`; a status other than SUCCEEDED, or a
    result (`outcome.trained`) `succeeded` refuses, raises LocalRunError with the log's tail."""
    ray, run_dir, console, outcome = run.ray, run.run_dir, run.console, run.outcome
    os.environ.update(ray_auth_env())  # before Ray reads it: the client sends our token
    from ray.job_submission import JobStatus, JobSubmissionClient

    try:
        # what the pod would run: the kubelet's reading of it (infra.plan.kubelet)
        entrypoint, changes = job.profile(as_run(rayjob["spec"]["entrypoint"]))
        runtime_env = runtime_env_of(rayjob)
    except ProfileError as err:
        raise LocalRunError(str(err)) from None
    bucket_env = outcome.bucket.env(job.kind) if outcome.bucket is not None else {}
    if bucket_env:
        env_vars = {**(runtime_env.get("env_vars") or {}), **bucket_env}
        runtime_env = {**runtime_env, "env_vars": env_vars}
        changes += [
            f"runtime_env env_vars {k}={v}: added (the emulated bucket's IAM gate; on GKE the "
            "pods reach Cloud Storage as the workload identity)"
            for k, v in bucket_env.items()
        ]
    outcome.changes += [f"{job.kind}: {c}" for c in changes]
    console_out.section(console, outcome, job.title)
    console_out.changes(console, f"changed for CPU ({job.table}):", changes)
    console.print(
        f"runtime_env (runtimeEnvYAML + the bucket's gate): {escape(json.dumps(runtime_env))}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"entrypoint: {escape(entrypoint)}", highlight=False, soft_wrap=True)
    client = JobSubmissionClient(ray.dashboard_url)
    started = time.monotonic()
    job_id = submit_job(client, entrypoint, runtime_env)
    outcome.train_job = job_id
    console.print(f"submitted job {job_id}; waiting for its progress...", highlight=False)
    log_path = run_dir / job.log_name
    status = follow_job(
        client, job_id, log_path, timeout_s=job.timeout_s, label=job.label, on_record=on_record
    )
    outcome.train_seconds = time.monotonic() - started
    bucket = outcome.bucket
    for key in ("export_path", "checkpoint_path"):  # in the bucket: shown as the mount shows it
        value = str((outcome.trained or {}).get(key) or "")
        if outcome.trained and bucket is not None and value.startswith(("gs://", bucket.bucket)):
            outcome.trained[key] = str(bucket.mounted(value))
    if status != JobStatus.SUCCEEDED or not succeeded(outcome.trained):
        console.print(escape(log_tail(log_path)), highlight=False)
        raise LocalRunError(f"{job.failed_as} {job_id} ended {status}; full log: {log_path}")


def submit_job(client: Any, entrypoint: str, runtime_env: dict[str, Any]) -> str:
    """Submit, retrying while the head's job agent comes up (it may lag the dashboard)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return str(client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env))
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(3)


def export_of(rayjob: dict[str, Any], bucket: EmulatedBucket | None, default_run: str) -> str:
    """Where the RayJob writes its final export, as the pods' FUSE mount shows it: the rule of
    workloads/protocol.py on its rendered storage path, in the emulated bucket's folder."""
    _, fields = protocol.split_entrypoint(str(rayjob["spec"]["entrypoint"]))
    run_name = fields.get("run_name") or default_run
    uri = protocol.training_export_path(as_run(str(fields["storage_path"])), run_name)
    if bucket is None:
        raise LocalRunError("the run has no emulated bucket to write its export to")
    try:
        return str(bucket.mounted(uri))
    except EmulatorError as err:
        raise LocalRunError(str(err)) from None
