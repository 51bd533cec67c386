"""Where the loop runs: inside Ray Train, or in a plain process group (tests, benchmark).

The loop only needs its rank, its device, a folder to write each checkpoint into, the latest
checkpoint folder and a way to report; keeping Ray behind this small interface lets the same
loop run under ``torchrun``-style launchers and in-process tests without a cluster.

Checkpoints are written where they are kept: every rank writes its DCP shards straight into the
run's storage folder (the bucket through the pod's GCS FUSE mount, or a local ``storage_path``),
Ray registers that folder without copying it (``CheckpointUploadMode.NO_UPLOAD``: the folder is
inside the run's storage path, ray/train/v2/_internal/execution/context.py is_managed_checkpoint),
and a resume reads it in place. No checkpoint passes through the pod's scratch disk
(infra/resolve/disk.py). Only storage that is neither local nor mounted falls back to a temporary
folder that Ray uploads, and a download on resume.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from workloads.train import storage
from workloads.train.outputs.checkpointing import STATE_FILE


def checkpoint_name(step: int) -> str:
    return f"checkpoint_{step:08d}"


class RunEnv(Protocol):
    rank: int
    world_size: int
    device: torch.device

    def latest_checkpoint(self) -> contextlib.AbstractContextManager[str | None]:
        """A local folder holding the latest checkpoint, or None for a fresh run."""
        ...

    def checkpoint_folder(self, step: int) -> contextlib.AbstractContextManager[str]:
        """The folder this rank writes step ``step``'s checkpoint into (every rank gets the
        same one): in storage when it can be written in place."""
        ...

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int) -> None:
        """Publish metrics (every rank calls this), with the checkpoint folder if any."""
        ...

    def progress(self, metrics: dict[str, Any]) -> None:
        """Metrics between checkpoints (every rank calls this; it must not synchronize)."""
        ...


class RayTrainEnv:
    """Ray Train: checkpoints are written into ``storage_path`` and come back after a restart."""

    def __init__(self) -> None:
        import ray.train
        import ray.train.torch

        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.device = ray.train.torch.get_device()
        self._storage = context.get_storage()  # DeveloperAPI: the run's filesystem and paths
        self._in_storage: dict[str, str] = {}  # local folder -> its path on the storage fs

    def _uri(self, fs_path: str) -> str:
        """A path on Ray's storage filesystem as a URI (gs://... or a local path)."""
        scheme = {"gcs": "gs"}.get(type_name := self._storage.storage_filesystem.type_name)
        return fs_path if type_name == "local" else f"{scheme or type_name}://{fs_path}"

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            yield None
            return
        in_place = None
        if checkpoint.filesystem.equals(self._storage.storage_filesystem):
            in_place = storage.local_path(self._uri(checkpoint.path))
        if in_place is not None and in_place.is_dir():
            yield str(in_place)  # read where it is: no download into scratch
            return
        with checkpoint.as_directory() as directory:
            yield directory

    @contextlib.contextmanager
    def checkpoint_folder(self, step: int) -> Iterator[str]:
        fs_path = self._storage.build_checkpoint_path_from_name(checkpoint_name(step))
        target = storage.local_path(self._uri(fs_path))
        if target is None:  # storage we can only upload to
            with tempfile.TemporaryDirectory(prefix="park-ckpt-") as directory:
                yield directory
            return
        target.mkdir(parents=True, exist_ok=True)
        self._in_storage[str(target)] = fs_path
        try:
            yield str(target)
        finally:
            self._in_storage.pop(str(target), None)

    def progress(self, metrics: dict[str, Any]) -> None:
        """Nothing for Ray: a ``ray.train.report`` is a barrier and a controller round trip
        (the loop prints progress; Ray gets the metrics with each checkpoint)."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int) -> None:
        import ray.train
        from ray.train import CheckpointUploadMode

        if checkpoint_dir is None:
            ray.train.report(metrics)
            return
        fs_path = self._in_storage.get(checkpoint_dir)
        if fs_path is not None:
            # Already in the run's storage folder: register it, copy nothing.
            checkpoint = ray.train.Checkpoint(fs_path, self._storage.storage_filesystem)
            ray.train.report(
                metrics,
                checkpoint=checkpoint,
                checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
            )
            return
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(checkpoint_dir),
            checkpoint_dir_name=checkpoint_name(step),
        )


class LocalEnv:
    """A plain process group (already initialized); checkpoints are written under ``root``."""

    def __init__(
        self,
        root: str | Path,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | None = None,
    ) -> None:
        self.root = Path(root)
        self.rank = rank
        self.world_size = world_size
        self.device = device or torch.device("cpu")
        self.reports: list[dict[str, Any]] = []

    def _checkpoints(self) -> list[Path]:
        # complete ones only: rank 0 writes the train state after every rank's shards
        return sorted(p for p in self.root.glob("checkpoint_*") if (p / STATE_FILE).exists())

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        found = self._checkpoints()
        yield str(found[-1]) if found else None

    @contextlib.contextmanager
    def checkpoint_folder(self, step: int) -> Iterator[str]:
        folder = self.root / checkpoint_name(step)
        folder.mkdir(parents=True, exist_ok=True)
        yield str(folder)

    def progress(self, metrics: dict[str, Any]) -> None:
        self.reports.append(dict(metrics))

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int) -> None:
        self.reports.append(dict(metrics))
