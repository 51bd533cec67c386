"""The rendered staging Job's own command, run against an emulated Cloud Storage that grants
what the stack renders (and, to see it fail, less): the Job's container command as the kubelet
runs it, with STORAGE_EMULATOR_HOST at the IAM gate and a local folder standing in for the hub.
Plus staging's resume and its retry through IAM propagation, on local folders."""

from __future__ import annotations

import json
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from infra import storage_iam
from infra.tools.local.bucket import EmulatedBucket, bound_roles
from infra.tools.local.staging import local_command
from tests.conftest import render_stack
from workloads import protocol
from workloads.train import stage

pytestmark = pytest.mark.e2e  # a subprocess running the Job's command end to end


def _job_command(rendered) -> list[str]:
    jobs = [m for m in rendered.manifests() if m.get("kind") == "Job"]
    stage_jobs = [j for j in jobs if "workloads.train.stage" in str(j)]
    assert stage_jobs, "dev renders a staging Job"
    return [str(w) for w in stage_jobs[0]["spec"]["template"]["spec"]["containers"][0]["command"]]


def _hub(tmp_path: Path) -> Path:
    hub = tmp_path / "hub"
    (hub / "sub").mkdir(parents=True)
    (hub / "config.json").write_text('{"model_type": "llama"}')
    (hub / "sub" / "model.safetensors").write_bytes(b"\0" * 4096)
    (hub / "pytorch_model.bin").write_bytes(b"not wanted")
    return hub


def _run(command: list[str], bucket: EmulatedBucket, hub: Path, *extra: str):
    env = {**os.environ, **bucket.env("staging")}
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    return subprocess.run(
        [*local_command(command), "--from-folder", str(hub), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_rendered_staging_command_completes_under_the_rendered_roles(tmp_path):
    rendered = render_stack("dev")
    command = _job_command(rendered)
    dest = command[command.index("--dest") + 1]
    roles = bound_roles(rendered)
    bucket_name = rendered.plan.names.bucket
    hub = _hub(tmp_path)
    with EmulatedBucket(
        bucket_name, storage_iam.granted(roles), "sa", tmp_path / "gcs", roles=roles
    ) as bucket:
        done = _run(command, bucket, hub)
        assert done.returncode == 0, done.stderr
        folder = bucket.mounted(dest)
        marker = json.loads((folder / protocol.STAGED_MARKER).read_text())
        assert sorted(marker["files"]) == ["config.json", "sub/model.safetensors"]
        assert (folder / "sub" / "model.safetensors").stat().st_size == 4096
        bucket.check()
        # every call it made is in the ledger's staging entry
        assert bucket.log.permissions("staging") <= storage_iam.ledger_of("staging").permissions


def test_without_objects_create_the_staging_fails_naming_it(tmp_path):
    rendered = render_stack("dev")
    command = _job_command(rendered)
    roles = ("roles/storage.objectViewer", "roles/storage.legacyBucketReader")
    with EmulatedBucket(
        rendered.plan.names.bucket, storage_iam.granted(roles), "sa", tmp_path / "gcs"
    ) as bucket:
        done = _run(command, bucket, _hub(tmp_path), "--iam-wait-s", "0")
        assert done.returncode == 1
        assert "storage.objects.create" in done.stderr
        assert not list(bucket.folder.rglob(protocol.STAGED_MARKER))


@contextmanager
def _opener(hub: Path, fail_on: str | None, opened: list[str]):
    def open_file(name: str):
        opened.append(name)
        if name == fail_on:
            raise OSError("stream dropped")
        return open(hub / name, "rb")

    yield open_file


def test_a_copy_cut_short_resumes_file_by_file(tmp_path):
    hub, dest = _hub(tmp_path), str(tmp_path / "bucket" / "models" / "m")
    listing = stage.folder_listing(str(hub))
    opened: list[str] = []
    with _opener(hub, "sub/model.safetensors", opened) as open_file, pytest.raises(OSError):
        stage.stage("org/m", dest, listing, open_file)
    assert opened == ["config.json", "sub/model.safetensors"]
    opened.clear()
    with _opener(hub, None, opened) as open_file:
        marker = stage.stage("org/m", dest, listing, open_file)
    assert opened == ["sub/model.safetensors"]  # config.json was there with its size
    assert marker["files"] == ["config.json", "sub/model.safetensors"]


def test_a_refused_call_is_retried_through_propagation_then_named(tmp_path):
    hub, dest = _hub(tmp_path), str(tmp_path / "bucket")
    listing = stage.folder_listing(str(hub))
    now = [0.0]
    calls = [0]

    def flaky(name: str):
        calls[0] += 1
        if calls[0] <= 2:
            raise PermissionError("PERMISSION_DENIED: storage.objects.create")
        return open(hub / name, "rb")

    marker = stage.stage_retrying(
        "org/m", dest, listing, flaky, iam_wait_s=60, retry_s=15,
        clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
    )  # fmt: skip
    assert marker["files"] and now[0] == 30.0

    def refused(name: str):
        raise PermissionError("PERMISSION_DENIED: storage.objects.create")

    with pytest.raises(PermissionError, match=r"after 60s.*storage\.objects\.create"):
        stage.stage_retrying(
            "org/m", str(tmp_path / "b2"), listing, refused, iam_wait_s=60, retry_s=15,
            clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
        )  # fmt: skip
    with pytest.raises(OSError, match="disk full"):  # anything else is not retried
        stage.stage_retrying(
            "org/m", str(tmp_path / "b3"), listing,
            lambda name: (_ for _ in ()).throw(OSError("disk full")),
        )  # fmt: skip
