"""Where the loop runs: inside Ray Train, or in a plain process group (tests, benchmark).

The loop only needs its rank, its device, the latest checkpoint folder and a way to report;
keeping Ray behind this small interface lets the same loop run under ``torchrun``-style
launchers and in-process tests without a cluster.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch


class RunEnv(Protocol):
    rank: int
    world_size: int
    device: torch.device

    def latest_checkpoint(self) -> contextlib.AbstractContextManager[str | None]:
        """A local folder holding the latest checkpoint, or None for a fresh run."""
        ...

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int) -> None:
        """Publish metrics (every rank calls this), with this rank's checkpoint shards if any."""
        ...

    def progress(self, metrics: dict[str, Any]) -> None:
        """Metrics between checkpoints (every rank calls this; it must not synchronize)."""
        ...


class RayTrainEnv:
    """Ray Train: checkpoints go to ``storage_path`` and come back after a restart."""

    def __init__(self) -> None:
        import ray.train
        import ray.train.torch

        context = ray.train.get_context()
        self.rank = context.get_world_rank()
        self.world_size = context.get_world_size()
        self.device = ray.train.torch.get_device()

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            yield None
            return
        with checkpoint.as_directory() as directory:
            yield directory

    def progress(self, metrics: dict[str, Any]) -> None:
        """Nothing for Ray: a ``ray.train.report`` is a barrier and a controller round trip
        (the loop prints progress; Ray gets the metrics with each checkpoint)."""

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int) -> None:
        import ray.train

        if checkpoint_dir is None:
            ray.train.report(metrics)
            return
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(checkpoint_dir),
            checkpoint_dir_name=f"checkpoint_{step:08d}",
        )


class LocalEnv:
    """A plain process group (already initialized); checkpoints are copied under ``root``."""

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
        return sorted(self.root.glob("checkpoint_*"))

    @contextlib.contextmanager
    def latest_checkpoint(self) -> Iterator[str | None]:
        found = self._checkpoints()
        yield str(found[-1]) if found else None

    def progress(self, metrics: dict[str, Any]) -> None:
        self.reports.append(dict(metrics))

    def report(self, metrics: dict[str, Any], checkpoint_dir: str | None, step: int) -> None:
        self.reports.append(dict(metrics))
        if checkpoint_dir is not None:
            shutil.copytree(
                checkpoint_dir, self.root / f"checkpoint_{step:08d}", dirs_exist_ok=True
            )
