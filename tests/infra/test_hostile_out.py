"""`--out` owns only its files (issue 30, item 1): hostile folders of the kind a pull request
can commit (a linked manifests/, a dangling resources.json, a linked manifest, a record listing
../x or an absolute path with the right digest) are refused, and nothing outside --out is
written, replaced or deleted: each test snapshots the folder around --out (every entry's kind,
bytes, inode and mtime) and compares it after."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.tools.cli import app
from infra.tools.outdir import RECORD, OutputError, write_owned
from infra.tools.render import render_stack_file, write_outputs
from tests.conftest import STACKS_DIR

FILES = {"resources.json": b"[]\n", "manifests/job-a.yaml": b"kind: Job\n"}


def snapshot(root: Path, skip: Path) -> dict[str, tuple]:
    """Every entry under `root` but `skip` (the --out folder): kind, target, bytes, inode,
    mtime. Links are recorded, never followed."""
    seen: dict[str, tuple] = {}
    for path in sorted(root.rglob("*")):
        if path == skip or skip in path.parents:
            continue
        info = path.lstat()
        if path.is_symlink():
            seen[str(path)] = ("link", os.readlink(path), info.st_ino)
        elif path.is_dir():
            seen[str(path)] = ("dir", info.st_ino)
        else:
            seen[str(path)] = ("file", path.read_bytes(), info.st_ino, info.st_mtime_ns)
    return seen


@pytest.fixture
def place(tmp_path):
    """(out, outside): an --out folder and a sibling folder holding a victim file."""
    out, outside = tmp_path / "out", tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_bytes(b"precious\n")
    return out, outside


def record(out: Path, files: dict[str, str]) -> None:
    out.mkdir(exist_ok=True)
    (out / RECORD).write_text(json.dumps({"files": files}))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def refused(out: Path, tmp_path: Path, match: str) -> None:
    before = snapshot(tmp_path, out)
    with pytest.raises(OutputError, match=match) as info:
        write_owned(out, FILES)
    assert "\n" not in str(info.value)
    assert snapshot(tmp_path, out) == before


def test_a_linked_manifests_folder_is_refused(place, tmp_path):
    out, outside = place
    out.mkdir()
    (out / "manifests").symlink_to(outside, target_is_directory=True)
    refused(out, tmp_path, "symbolic link")
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


def test_a_dangling_resources_json_is_refused(place, tmp_path):
    out, outside = place
    out.mkdir()
    (out / "resources.json").symlink_to(outside / "planted.json")
    refused(out, tmp_path, "resources.json .a symbolic link")
    assert not (outside / "planted.json").exists()


def test_a_linked_manifest_is_refused(place, tmp_path):
    out, outside = place
    (out / "manifests").mkdir(parents=True)
    (out / "manifests" / "job-a.yaml").symlink_to(outside / "victim.txt")
    # even when the record vouches for the target's digest
    record(out, {"manifests/job-a.yaml": sha(b"precious\n")})
    refused(out, tmp_path, "symbolic link")
    assert (outside / "victim.txt").read_bytes() == b"precious\n"


@pytest.mark.parametrize("listed", ["../outside/victim.txt", "ABSOLUTE", "manifests/../../x"])
def test_a_record_naming_a_file_outside_is_refused(place, tmp_path, listed):
    out, outside = place
    victim = outside / "victim.txt"
    name = str(victim) if listed == "ABSOLUTE" else listed
    record(out, {name: sha(b"precious\n")})
    refused(out, tmp_path, "not a file park writes inside --out")
    assert victim.read_bytes() == b"precious\n"


@pytest.mark.parametrize("what", ["link", "folder"])
def test_a_record_naming_a_link_or_a_folder_is_refused(place, tmp_path, what):
    out, outside = place
    (out / "manifests").mkdir(parents=True)
    old = out / "manifests" / "old.yaml"
    if what == "link":
        old.symlink_to(outside / "victim.txt")
    else:
        old.mkdir()
        (old / "inside.txt").write_text("kept")
    record(out, {"manifests/old.yaml": sha(b"precious\n")})
    refused(out, tmp_path, "never through a link")
    assert old.is_symlink() or (old / "inside.txt").read_text() == "kept"


def test_a_linked_record_is_refused(place, tmp_path):
    out, outside = place
    out.mkdir()
    (outside / "fake.json").write_text(json.dumps({"files": {}}))
    (out / RECORD).symlink_to(outside / "fake.json")
    refused(out, tmp_path, "symbolic link")


def test_out_itself_or_a_relative_parent_as_a_link_is_refused(place, tmp_path, monkeypatch):
    out, outside = place
    out.symlink_to(outside, target_is_directory=True)
    refused(out, tmp_path, "symbolic link")
    # a committed link inside the working tree: `--out rendered/dev` with rendered -> outside
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rendered").symlink_to(outside, target_is_directory=True)
    before = snapshot(tmp_path, tmp_path / "none")
    with pytest.raises(OutputError, match="symbolic link"):
        write_owned(Path("rendered/dev"), FILES)
    assert snapshot(tmp_path, tmp_path / "none") == before


def test_its_own_earlier_files_are_replaced_and_removed_and_a_changed_one_kept(place, tmp_path):
    out, _ = place
    write_owned(out, {**FILES, "manifests/job-old.yaml": b"old\n", "manifests/job-b.yaml": b"b"})
    (out / "manifests" / "job-b.yaml").write_bytes(b"edited by hand")
    before = snapshot(tmp_path, out)
    write_owned(out, {**FILES, "resources.json": b"[1]\n"})
    assert snapshot(tmp_path, out) == before
    assert (out / "resources.json").read_bytes() == b"[1]\n"
    assert not (out / "manifests" / "job-old.yaml").exists()  # park's own, unchanged: removed
    assert (out / "manifests" / "job-b.yaml").read_bytes() == b"edited by hand"  # kept
    listed = json.loads((out / RECORD).read_text())["files"]
    assert set(listed) == set(FILES) and not list(out.rglob(".park-tmp-*"))


@pytest.fixture(scope="module")
def dev_render():
    return render_stack_file(STACKS_DIR / "Pulumi.dev.yaml")


def test_a_real_render_into_a_hostile_folder_writes_nothing_outside(dev_render, place, tmp_path):
    out, outside = place
    (out / "manifests").mkdir(parents=True)
    write_outputs(dev_render, out)
    target = next((out / "manifests").glob("rayjob-*.yaml"))
    target.unlink()
    target.symlink_to(outside / "victim.txt")
    before = snapshot(tmp_path, out)
    with pytest.raises(OutputError):
        write_outputs(dev_render, out)
    assert snapshot(tmp_path, out) == before


def test_the_cli_refuses_in_one_line_without_a_traceback(place, tmp_path):
    out, outside = place
    out.mkdir()
    (out / "resources.json").symlink_to(outside / "planted.json")
    stack = STACKS_DIR / "Pulumi.dev.yaml"
    result = CliRunner().invoke(
        app, ["render", "dev", "--config-file", str(stack), "--out", str(out)]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = [x for x in result.output.splitlines() if "error:" in x]
    assert "resources.json" in line and "link" in line
    assert not (outside / "planted.json").exists()
