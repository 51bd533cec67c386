"""Batches for the training loop, and the token-id sources: synthetic, ``.bin``/``.npy`` files.

The loop asks a batch source for :class:`Batch` es (inputs, targets with -100 where nothing is
to be predicted, position ids) and for its state, which the checkpoint keeps per rank. Text
and chat data for Hugging Face models live in :mod:`workloads.train.inputs.text`; this module holds
the token sources, where each batch is a pure function of (seed, step, rank): a resumed or
restarted run sees exactly the batches it would have seen. Files are memory-mapped and sampled
as random windows across all shards (nanoGPT-style), so every worker reads only the bytes of
its own windows.

Formats: ``.bin`` raw uint16 token ids (nanoGPT's format), ``.npy`` an integer array, and for
the GPT presets ``.txt`` UTF-8 bytes as tokens (vocabulary 256, the ``tiny`` preset's; a
Hugging Face model reads ``.txt`` as text). A folder or ``gs://`` prefix means every such file
under it; ``gs://`` files are copied once per node to a local cache with pyarrow (a Ray
dependency) and memory-mapped from there.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

SUFFIXES = (".txt", ".bin", ".npy")  # token sources (.txt: bytes, for the GPT presets)
CACHE_DIR = Path(os.environ.get("PARK_DATA_CACHE", "/tmp/park-data-cache"))
IGNORE = -100  # a target that is not trained on (cross_entropy's ignore_index)


class DataError(ValueError):
    """Data that cannot feed the model (missing files, ids beyond the vocabulary)."""


@dataclass
class Batch:
    """One worker's batch: ``[batch, seq_len]`` tensors on the CPU.

    ``labels[b, t]`` is the token to predict after ``input_ids[b, t]``, or -100; ``n_targets``
    counts the others (the loss is their mean over all workers). ``position_ids`` restart at
    each packed document (None: one sequence per row).
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor | None
    n_targets: int


class BatchSource(Protocol):
    """What the loop draws batches from; ``counts_vary`` says whether ``n_targets`` differs
    between workers (then the loop sums it across them every step)."""

    counts_vary: bool

    def next_batch(self) -> Batch: ...

    def state_dict(self) -> dict[str, Any]: ...

    @property
    def epoch(self) -> int: ...


def _open_array(path: Path) -> np.ndarray:
    if path.suffix == ".bin":
        return np.memmap(path, dtype=np.uint16, mode="r")
    if path.suffix == ".txt":
        return np.memmap(path, dtype=np.uint8, mode="r")
    array = np.load(path, mmap_mode="r")
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise DataError(f"{path}: expected a 1-D integer array, got {array.dtype}{array.shape}")
    return array


def _local_files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES and p.is_file())
    elif path.is_file():
        files = [path]
    else:
        raise DataError(f"--data {path}: no such file or folder")
    if not files:
        raise DataError(f"--data {path}: no {', '.join(SUFFIXES)} files in it")
    return files


def _cache_gcs(uri: str) -> list[Path]:
    """Copy ``gs://`` files to the node-local cache once (a lock keeps one copier per node)."""
    import pyarrow.fs as pafs

    from workloads.train import storage

    fs, root = storage.filesystem(uri)
    info = fs.get_file_info(root)
    if info.type == pafs.FileType.File:
        remote = [root]
    else:
        selector = pafs.FileSelector(root, recursive=True)
        remote = sorted(
            i.path
            for i in fs.get_file_info(selector)
            if i.type == pafs.FileType.File and Path(i.path).suffix in SUFFIXES
        )
    if not remote:
        raise DataError(f"--data {uri}: no {', '.join(SUFFIXES)} files there")
    local_root = CACHE_DIR / hashlib.sha256(uri.encode()).hexdigest()[:16]
    local_root.mkdir(parents=True, exist_ok=True)
    files = []
    with open(local_root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for i, remote_path in enumerate(remote):
            local = local_root / f"{i:05d}-{Path(remote_path).name}"
            if not local.exists():
                partial = local.with_name(local.name + ".partial")
                pafs.copy_files(
                    remote_path,
                    str(partial),
                    source_filesystem=fs,
                    destination_filesystem=pafs.LocalFileSystem(),
                )
                partial.rename(local)
            files.append(local)
    return files


def open_shards(spec: str) -> list[np.ndarray]:
    """Memory-map every token file named by ``spec`` (a file, a folder or ``gs://...``)."""
    files = _cache_gcs(spec) if spec.startswith("gs://") else _local_files(Path(spec))
    return [_open_array(f) for f in files]


class TokenBatches:
    """Batches ``(inputs, targets)`` of shape ``[batch, seq_len]`` for one worker.

    ``shards=None`` means synthetic tokens: sequences that follow ``t' = (a·t + c) mod V`` nine
    times in ten and jump at random otherwise, so a model can learn them (loss falls well below
    ``ln V``) while costing nothing to produce.
    """

    def __init__(
        self,
        shards: Sequence[np.ndarray] | None,
        *,
        vocab_size: int,
        seq_len: int,
        batch_size: int,
        seed: int,
        rank: int,
    ) -> None:
        self.shards = list(shards) if shards is not None else None
        self.vocab_size = vocab_size
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        if self.shards is not None:
            usable = np.array([max(len(s) - seq_len - 1, 0) for s in self.shards], dtype=np.float64)
            if usable.sum() <= 0:
                raise DataError(
                    f"every data file is shorter than seq_len + 1 = {seq_len + 1} tokens"
                )
            self._weights = usable / usable.sum()
            self._usable = usable.astype(np.int64)

    def _rng(self, step: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, step, self.rank])

    def _synthetic(self, rng: np.random.Generator) -> np.ndarray:
        v, n = self.vocab_size, self.seq_len + 1
        tokens = np.empty((self.batch_size, n), dtype=np.int64)
        tokens[:, 0] = rng.integers(0, v, self.batch_size)
        jumps = rng.random((self.batch_size, n)) < 0.1
        noise = rng.integers(0, v, (self.batch_size, n))
        for i in range(1, n):
            follow = (tokens[:, i - 1] * 5 + 3) % v
            tokens[:, i] = np.where(jumps[:, i], noise[:, i], follow)
        return tokens

    def _windows(self, rng: np.random.Generator) -> np.ndarray:
        assert self.shards is not None
        picks = rng.choice(len(self.shards), size=self.batch_size, p=self._weights)
        rows = []
        for shard_index in picks:
            start = int(rng.integers(0, self._usable[shard_index] + 1))
            rows.append(np.asarray(self.shards[shard_index][start : start + self.seq_len + 1]))
        tokens = np.stack(rows).astype(np.int64)
        if tokens.max() >= self.vocab_size:
            raise DataError(
                f"token id {int(tokens.max())} is beyond the model's vocabulary "
                f"({self.vocab_size}); pick a larger --model-size or --vocab-size"
            )
        return tokens

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch for ``step`` (1-based), the same on every call and every restart."""
        rng = self._rng(step)
        tokens = self._synthetic(rng) if self.shards is None else self._windows(rng)
        t = torch.from_numpy(tokens)
        return t[:, :-1], t[:, 1:]


def make_batches(
    data: str, *, vocab_size: int, seq_len: int, batch_size: int, seed: int, rank: int
) -> TokenBatches:
    """The worker's token batch source for ``--data`` (synthetic or token files)."""
    shards = None if data == "synthetic" else open_shards(data)
    return TokenBatches(
        shards, vocab_size=vocab_size, seq_len=seq_len, batch_size=batch_size, seed=seed, rank=rank
    )


class TokenStream:
    """:class:`TokenBatches` as a :class:`BatchSource`: its state is the last step drawn."""

    counts_vary = False
    epoch = 0

    def __init__(self, batches: TokenBatches, state: dict[str, Any] | None = None) -> None:
        self.batches = batches
        self.step = int(state["step"]) if state else 0

    def next_batch(self) -> Batch:
        self.step += 1
        inputs, targets = self.batches.batch(self.step)
        return Batch(inputs, targets, None, int(targets.numel()))

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}
