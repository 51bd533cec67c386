"""Where training's bytes go (resolve/disk.py's placement): checkpoints written straight into the
storage folder (no temporary copy), the bucket read through its mount, hub models staged into
the bucket by streaming (workloads/train/stage.py)."""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.workloads.train_fixtures import gloo_world1  # noqa: F401  (fixture)
from workloads.train import stage, storage
from workloads.train.config import TrainConfig
from workloads.train.distributed.runenv import LocalEnv
from workloads.train.models import hf
from workloads.train.outputs.checkpointing import STATE_FILE
from workloads.train.run.loop import train
from workloads.train.testing import cpu_run


def _config(**overrides: Any) -> TrainConfig:
    run = dict(seq_len=64, global_batch_size=16, steps=8, checkpoint_every=4, report_every=4)
    return cpu_run(**(run | {"model_size": "tiny"} | overrides))


@pytest.mark.usefixtures("gloo_world1")
def test_checkpoints_land_in_storage_directly_no_temp_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    real = tempfile.TemporaryDirectory

    def watched(*args: Any, **kwargs: Any) -> Any:
        made.append(str(kwargs.get("prefix", "")))
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "TemporaryDirectory", watched)
    env = LocalEnv(tmp_path / "storage")
    train(_config(), env)
    assert not [p for p in made if p.startswith("park-ckpt")]  # no staging folder
    for step in (4, 8):
        folder = env.root / f"checkpoint_{step:08d}"
        assert (folder / ".metadata").is_file() and (folder / STATE_FILE).is_file()
        assert any(p.suffix == ".distcp" for p in folder.iterdir())
    # a resume reads the folder in place
    with env.latest_checkpoint() as directory:
        assert directory == str(env.root / "checkpoint_00000008")


def test_an_incomplete_checkpoint_is_not_resumed(tmp_path: Path) -> None:
    env = LocalEnv(tmp_path)
    (tmp_path / "checkpoint_00000004").mkdir()
    (tmp_path / "checkpoint_00000004" / STATE_FILE).write_text("{}")
    (tmp_path / "checkpoint_00000008").mkdir()  # a save that died before the train state
    with env.latest_checkpoint() as directory:
        assert directory == str(tmp_path / "checkpoint_00000004")


def test_local_path_maps_the_bucket_to_its_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mount = tmp_path / "data"
    mount.mkdir()
    monkeypatch.setenv(storage.BUCKET_URI_ENV, "gs://b")
    monkeypatch.setenv(storage.BUCKET_MOUNT_ENV, str(mount))
    assert storage.local_path("gs://b/checkpoints/run/c") == mount / "checkpoints/run/c"
    assert storage.local_path("gs://b") == mount
    assert storage.local_path("gs://bb/x") is None  # another bucket: a copy is needed
    assert storage.local_path("gs://other/x") is None
    assert storage.local_path(str(tmp_path / "x")) == tmp_path / "x"
    assert storage.local_path(f"file://{tmp_path}/y") == tmp_path / "y"
    monkeypatch.setenv(storage.BUCKET_MOUNT_ENV, str(tmp_path / "not-mounted"))
    assert storage.local_path("gs://b/x") is None


def test_stage_ignores_what_the_trainer_ignores() -> None:
    assert set(stage.IGNORE) == set(hf.HUB_IGNORE)
    assert stage.wanted("model-00001-of-00002.safetensors")
    assert stage.wanted("tokenizer.json")
    assert not stage.wanted("pytorch_model.bin")
    assert not stage.wanted("original/consolidated.00.pth")
    assert not stage.wanted(".gitattributes")


def test_stage_streams_files_into_the_bucket_once_per_revision(tmp_path: Path) -> None:
    files = {"config.json": b"{}", "model.safetensors": b"x" * 1000, "pytorch_model.bin": b"no"}
    opened: list[str] = []

    @contextlib.contextmanager
    def open_file(name: str) -> Iterator[io.BytesIO]:
        opened.append(name)
        yield io.BytesIO(files[name])

    listing = stage.Listing("abc", tuple((n, len(b)) for n, b in files.items()))
    dest = str(tmp_path / "bucket" / "models" / "org" / "m")
    marker = stage.stage("org/m", dest, listing, open_file)
    assert sorted(marker["files"]) == ["config.json", "model.safetensors"]
    assert (Path(dest) / "model.safetensors").read_bytes() == files["model.safetensors"]
    assert not (Path(dest) / "pytorch_model.bin").exists()
    assert json.loads((Path(dest) / stage.MARKER).read_text())["revision"] == "abc"
    opened.clear()
    stage.stage("org/m", dest, listing, open_file)  # the same revision: nothing copied
    assert opened == []
    stage.stage("org/m", dest, stage.Listing("def", listing.files), open_file)  # a new one
    assert sorted(opened) == ["config.json", "model.safetensors"]
