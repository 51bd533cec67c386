"""The stack's bucket under Cloud Storage's own rules: pyarrow's real calls (the client the
workloads use on GKE) against an emulated Cloud Storage behind the IAM gate, the grant the
stack renders, Google's predefined roles (vendored), and the ledger `park validate` prints."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from infra import storage_iam
from infra.plan.storage import BUCKET_ROLES
from infra.tools.local.bucket import EmulatedBucket, bound_roles
from infra.tools.local.gcs_gate import classify
from tests.conftest import SHIPPED_STACKS, render_stack

BUCKET = "park-test-bucket"
PRINCIPAL = "park-test-workload@project.iam.gserviceaccount.com"


def _bucket(tmp_path: Path, roles: tuple[str, ...]) -> EmulatedBucket:
    return EmulatedBucket(
        bucket=BUCKET,
        granted=storage_iam.granted(roles),
        principal=PRINCIPAL,
        root=tmp_path / "gcs",
        log_path=tmp_path / "calls.jsonl",
        roles=roles,
    )


def _gcs(bucket: EmulatedBucket, workload: str) -> pafs.GcsFileSystem:
    """pyarrow's GCS filesystem at the gate, as workloads/train/storage.py builds it."""
    import datetime

    return pafs.GcsFileSystem(
        anonymous=True,
        scheme="http",
        endpoint_override=bucket.endpoint(workload).removeprefix("http://"),
        retry_time_limit=datetime.timedelta(seconds=5),
    )


@pytest.fixture
def monkeyenv(monkeypatch):
    return monkeypatch


def test_create_dir_on_a_fresh_bucket_needs_buckets_get(tmp_path):
    """The issue's reproduction: with objectUser alone, pyarrow's create_dir on a bucket with no
    folder marker reads the bucket's metadata and gets Cloud Storage's 403; a plain write works.
    With the stack's roles it works."""
    with _bucket(tmp_path / "a", ("roles/storage.objectUser",)) as bucket:
        fs = _gcs(bucket, "trainer")
        with fs.open_output_stream(f"{BUCKET}/checkpoints/run/file") as out:
            out.write(b"x")
        with pytest.raises(OSError, match=r"storage\.buckets\.get"):
            fs.create_dir(f"{BUCKET}/checkpoints/other/run", recursive=True)
        with pytest.raises(Exception, match=r"trainer: storage\.buckets\.get"):
            bucket.check()
    with _bucket(tmp_path / "b", BUCKET_ROLES) as bucket:
        fs = _gcs(bucket, "trainer")
        fs.create_dir(f"{BUCKET}/checkpoints/other/run", recursive=True)
        bucket.check()
        assert "storage.buckets.get" in bucket.log.permissions("trainer")


def test_overwrite_needs_delete_too(tmp_path):
    """Cloud Storage's rule: replacing an object needs storage.objects.delete besides create.
    objectCreator alone writes a new object and is refused the second write of it."""
    with _bucket(tmp_path, ("roles/storage.objectCreator",)) as bucket:
        fs = _gcs(bucket, "staging")
        with fs.open_output_stream(f"{BUCKET}/models/a/config.json") as out:
            out.write(b"{}")
        with (
            pytest.raises(OSError, match=r"storage\.objects\.delete"),
            fs.open_output_stream(f"{BUCKET}/models/a/config.json") as out,
        ):
            out.write(b"{}")
        # the file the first write made is what the FUSE mount's stand-in shows
        assert (bucket.folder / "models/a/config.json").read_bytes() == b"{}"


def test_reads_and_lists_need_their_permissions(tmp_path):
    """objectCreator cannot read back or list; objectViewer (the same bucket, later) reads and
    lists what was written, and writes nothing."""
    with _bucket(tmp_path, ("roles/storage.objectCreator",)) as bucket:
        fs = _gcs(bucket, "x")
        with fs.open_output_stream(f"{BUCKET}/models/m.json") as out:
            out.write(b"{}")
        with pytest.raises(OSError, match=r"storage\.objects\.get"):
            fs.open_input_stream(f"{BUCKET}/models/m.json").read()
        with pytest.raises(OSError, match=r"storage\.objects\.list"):
            fs.get_file_info(pafs.FileSelector(f"{BUCKET}/models", recursive=True))
    with _bucket(tmp_path, ("roles/storage.objectViewer",)) as bucket:
        fs = _gcs(bucket, "x")
        found = fs.get_file_info(pafs.FileSelector(f"{BUCKET}/models", recursive=True))
        assert [i.path for i in found] == [f"{BUCKET}/models/m.json"]
        assert fs.open_input_stream(f"{BUCKET}/models/m.json").read() == b"{}"
        with pytest.raises(OSError, match=r"storage\.objects\.create"):
            fs.open_output_stream(f"{BUCKET}/b").write(b"1")


def test_other_buckets_and_unknown_calls_are_refused(tmp_path):
    """Bucket-scoped roles grant nothing on another bucket; a call the gate's table does not
    know is refused rather than let through unrecorded."""
    with _bucket(tmp_path, BUCKET_ROLES) as bucket:
        fs = _gcs(bucket, "x")
        with pytest.raises(OSError, match=r"storage\.objects\.create"):
            fs.open_output_stream("another-bucket/a").write(b"1")
        import http.client

        host, port = bucket.endpoint("x").removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.request("POST", "/batch/storage/v1")
        response = connection.getresponse()
        assert response.status == 403
        assert "unknown call" in json.loads(response.read())["error"]["message"]


# "METHOD path -> call: the permission Cloud Storage's IAM page documents for it" (an independent
# reading of the docs, not the gate's table).
DOCUMENTED_CALLS = (
    f"GET /storage/v1/b/{BUCKET} -> buckets.get: storage.buckets.get",
    f"GET /storage/v1/b/{BUCKET}/o?prefix=a/ -> objects.list: storage.objects.list",
    f"GET /storage/v1/b/{BUCKET}/o/a%2Fb -> objects.get: storage.objects.get",
    f"GET /download/storage/v1/b/{BUCKET}/o/a?alt=media -> objects.get: storage.objects.get",
    f"DELETE /storage/v1/b/{BUCKET}/o/a -> objects.delete: storage.objects.delete",
    f"PATCH /storage/v1/b/{BUCKET}/o/a -> objects.patch: storage.objects.update",
    "POST /storage/v1/b?project=p -> buckets.insert: storage.buckets.create",
)


@pytest.mark.parametrize("documented", DOCUMENTED_CALLS)
def test_each_json_api_call_needs_its_documented_permission(documented: str):
    request, expected = documented.split(" -> ")
    method, target = request.split(" ")
    kind, permission = expected.split(": ")
    call = classify(method, target, b"", lambda b, o: False)
    assert call is not None and (call.kind, call.permissions) == (kind, (permission,))


def test_an_upload_names_its_object_in_the_query_or_the_metadata():
    """An upload needs create, and delete too when the object it names exists (unless it asks
    for generation 0, which only creates)."""
    exists = {(BUCKET, "a/b")}.__contains__
    target = f"/upload/storage/v1/b/{BUCKET}/o?uploadType=resumable"

    def check(target: str, body: bytes) -> tuple[str, ...]:
        call = classify("POST", target, body, lambda b, o: exists((b, o)))
        assert call is not None
        return call.permissions

    replace = ("storage.objects.create", "storage.objects.delete")
    assert check(target + "&name=a/b", b"") == replace
    assert check(target, b'{"name": "a/b"}') == replace
    assert check(target, b'--x\r\n\r\n{"name": "a/c"}\r\n--x--') == ("storage.objects.create",)
    assert check(target + "&name=a/b&ifGenerationMatch=0", b"") == ("storage.objects.create",)


def test_the_vendored_roles_hold_what_google_documents():
    """Spot checks against Google's role table (the issue's and FACTS.md's reading): objectUser
    has no bucket permission, legacyBucketReader exactly buckets.get and objects.list."""
    user = storage_iam.role_permissions("roles/storage.objectUser")
    assert not any(p.startswith("storage.buckets.") for p in user)
    assert {"storage.objects.create", "storage.objects.delete", "storage.objects.get"} <= user
    assert storage_iam.role_permissions("roles/storage.legacyBucketReader") == {
        "storage.buckets.get",
        "storage.objects.list",
    }
    with pytest.raises(KeyError, match=r"roles/storage\.admin"):
        storage_iam.role_permissions("roles/storage.admin")


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_ledger_permission_is_granted_by_the_rendered_roles(stack):
    """What each workload needs (the ledger) is granted by a role the stack binds."""
    roles = bound_roles(render_stack(stack))
    assert roles, f"{stack} binds no bucket role to its workload identity"
    assert storage_iam.missing(roles) == []


def test_the_ledger_refuses_a_grant_without_bucket_metadata():
    """objectUser alone leaves the trainer's create_dir (Ray Train's storage) ungranted."""
    rows = storage_iam.missing(("roles/storage.objectUser",))
    assert {r.permission for r in rows} == {"storage.buckets.get"}
    assert {r.workload for r in rows} >= {"training"}


def test_ledger_entries_are_real_permissions():
    every = set().union(*(storage_iam.role_permissions(r) for r in storage_iam.known_roles()))
    for entry in storage_iam.ledger():
        assert entry.needs, entry.workload
        assert entry.permissions <= every, entry.workload


def test_workloads_use_the_emulator_and_no_credentials(tmp_path, monkeyenv):
    """With STORAGE_EMULATOR_HOST set, workloads/train/storage.py reaches the emulator,
    anonymously over http (no credential, no metadata server is looked for)."""
    from workloads.train import storage

    with _bucket(tmp_path, BUCKET_ROLES) as bucket:
        monkeyenv.setenv("STORAGE_EMULATOR_HOST", bucket.endpoint("workload"))
        storage.write_bytes(f"gs://{BUCKET}/a/b.json", b"{}")
        assert storage.exists(f"gs://{BUCKET}/a/b.json")
        assert storage.list_files(f"gs://{BUCKET}/a") == [(f"{BUCKET}/a/b.json", 2)]
        path, fs = storage.ray_storage(f"gs://{BUCKET}/checkpoints")
        assert path == f"{BUCKET}/checkpoints" and fs is not None and fs.type_name == "gcs"
        bucket.check()
    monkeyenv.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1/extra")
    with pytest.raises(ValueError, match="STORAGE_EMULATOR_HOST"):
        storage.filesystem("gs://b/x")
    assert os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") is None


def test_validate_names_the_prerequisites_and_prints_the_ledger():
    """`park validate`'s tables: Cloud Resource Manager with Service Usage, the one command
    that enables both, and each permission beside the role that grants it."""
    from rich.console import Console

    from infra.tools import report_bucket

    plan = render_stack("dev").plan
    out = Console(record=True, width=200)
    report_bucket.prerequisites(plan, out)
    assert report_bucket.bucket_ledger(plan, out) == 0
    text = out.export_text()
    assert "cloudresourcemanager.googleapis.com" in text
    assert (
        "gcloud services enable serviceusage.googleapis.com cloudresourcemanager.googleapis.com "
        f"--project {plan.spec.project}" in text
    )
    assert "storage.buckets.get" in text and "roles/storage.legacyBucketReader" in text
    assert {"staging", "training", "serving-fuse"} <= set(report_bucket.ledger_workloads(plan))


def test_validate_counts_a_permission_no_role_grants(monkeypatch):
    from rich.console import Console

    from infra.plan import storage as storage_plan
    from infra.tools import report_bucket

    monkeypatch.setattr(storage_plan, "BUCKET_ROLES", ("roles/storage.objectUser",))
    out = Console(record=True, width=200)
    assert report_bucket.bucket_ledger(render_stack("dev").plan, out) == 1
    assert "NOT GRANTED" in out.export_text()


@pytest.mark.ray  # imports Ray Train (no cluster is started)
def test_ray_trains_own_storage_needs_the_bucket_metadata(tmp_path, monkeyenv):
    """Ray Train's own StorageContext (what every RayJob's trainer builds on its storage path)
    on a fresh bucket: refused with objectUser alone, naming storage.buckets.get; it works
    under the stack's roles. The storage path and filesystem are the launcher's."""
    from ray.train.v2._internal.execution.storage import StorageContext

    from workloads.train import storage

    for roles, refused in ((("roles/storage.objectUser",), True), (BUCKET_ROLES, False)):
        with _bucket(tmp_path / str(len(roles)), roles) as bucket:
            monkeyenv.setenv("STORAGE_EMULATOR_HOST", bucket.endpoint("training"))
            path, fs = storage.ray_storage(f"gs://{BUCKET}/checkpoints")
            if refused:
                with pytest.raises(OSError, match=r"storage\.buckets\.get"):
                    StorageContext(path, "run", storage_filesystem=fs)
            else:
                StorageContext(path, "run", storage_filesystem=fs)
                assert (
                    bucket.log.permissions("training")
                    <= storage_iam.ledger_of("training").permissions
                )


def test_a_mirror_is_never_a_stale_or_partial_selection(tmp_path, monkeyenv):
    """storage.mirror names its copy by the folder's files: the same URI written again by a
    later run (another policy version at the same path) is copied again, and a selection of
    some files (an engine's weights) is not what a whole-folder mirror returns."""
    from workloads.train import storage

    monkeyenv.setenv("PARK_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "bucket" / "policy" / "v0"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"1")
    weights = storage.mirror(f"file://{folder}", keep=lambda name: name.endswith(".safetensors"))
    whole = storage.mirror(f"file://{folder}")
    assert sorted(p.name for p in weights.iterdir()) == [".complete", "model.safetensors"]
    assert sorted(p.name for p in whole.iterdir()) == [
        ".complete",
        "config.json",
        "model.safetensors",
    ]
    (folder / "model.safetensors").write_bytes(b"22")  # a later run, the same path
    again = storage.mirror(f"file://{folder}")
    assert again != whole and (again / "model.safetensors").read_bytes() == b"22"
    assert storage.mirror(f"file://{folder}") == again  # and once per node


def test_a_bucket_path_never_leads_out_of_the_mounts_folder(tmp_path):
    """The FUSE mount's stand-in maps object names under its folder, and nothing else."""
    from infra.tools.local.bucket import EmulatorError

    bucket = _bucket(tmp_path, BUCKET_ROLES)
    assert bucket.mounted(f"gs://{BUCKET}/a/b") == bucket.folder / "a" / "b"
    assert bucket.mounted(f"{BUCKET}/a") == bucket.folder / "a"  # pyarrow's spelling
    for uri in (f"gs://{BUCKET}/../x", f"gs://{BUCKET}/a/../../x", "gs://other/a"):
        with pytest.raises(EmulatorError):
            bucket.mounted(uri)
