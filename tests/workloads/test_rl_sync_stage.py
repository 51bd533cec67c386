"""A host receiver's stage (workloads/rl/sync.py HostReceiver), without Ray: its fetch is a
stand-in that hands out safetensors bytes (written by the ``safetensors`` package itself), so
the test sees how many gets are in flight at once, whether a bucket is written while later ones
are still coming, and what a failed get leaves behind.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save

from workloads.rl.sync import BUCKET_FILE, HostReceiver, PolicyVersion, WeightBucket

WAIT_S = 20.0  # how long a fetch waits for what it expects of the others before failing


def _buckets(count: int) -> tuple[dict[str, np.ndarray], list[bytes]]:
    """``count`` buckets of one tensor each, in safetensors bytes; the tensors by name."""
    rng = np.random.default_rng(0)
    tensors = {f"layer{i}.weight": rng.standard_normal((64, 33)).astype(np.float32)
               for i in range(count)}  # fmt: skip
    return tensors, [save({name: tensor}) for name, tensor in tensors.items()]


def _policy(version: int, blobs: list[bytes]) -> PolicyVersion:
    buckets = tuple(WeightBucket(i, i, len(blob)) for i, blob in enumerate(blobs))
    return PolicyVersion(version, None, buckets, sum(len(b) for b in blobs))


class Fetches:
    """The stand-in for Ray's get: bucket ``ref``'s bytes as the uint8 array a get returns,
    counting the gets in flight, with an optional ``hold(ref)`` run before answering."""

    def __init__(self, blobs: list[bytes], hold: Callable[[int], None] | None = None) -> None:
        self.blobs, self.hold = blobs, hold
        self.lock = threading.Lock()
        self.now = self.most = 0

    def __call__(self, ref: int) -> np.ndarray:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        try:
            if self.hold is not None:
                self.hold(ref)
            return np.frombuffer(self.blobs[ref], dtype=np.uint8)
        finally:
            with self.lock:
                self.now -= 1


@pytest.fixture
def name() -> Iterator[str]:
    """A staging folder of this test's own (under /dev/shm when the host has it)."""
    name = f"park-rl-stage-test-{uuid.uuid4().hex[:8]}"
    yield name
    HostReceiver(name, fetch=lambda ref: ref).close()


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        threading.Event().wait(0.005)


def _written(root: Path, index: int, size: int) -> bool:
    """Whether bucket ``index``'s file is in host memory whole (in whichever folder)."""
    return any(p.stat().st_size == size for p in root.rglob(BUCKET_FILE.format(index)))


def test_buckets_are_fetched_several_at_once_and_written_as_they_come(name: str) -> None:
    """Three gets in flight at once (a barrier of three that one get at a time would never
    pass); bucket 0 written while buckets 1 and 2 are still being fetched; never more than
    three in flight; the files byte for byte the buckets, read back by safetensors as the
    tensors, and equal to what one get at a time writes."""
    tensors, blobs = _buckets(8)
    together = threading.Barrier(3, timeout=WAIT_S)
    receiver: HostReceiver

    def hold(ref: int) -> None:
        if ref < 3:
            together.wait()
        if ref in (1, 2):  # bucket 0 reaches host memory while this get is still out
            _until(lambda: _written(receiver.root, 0, len(blobs[0])), "bucket 0 written")

    fetches = Fetches(blobs, hold)
    receiver = HostReceiver(name, in_flight=3, fetch=fetches)
    staged = receiver.stage(_policy(1, blobs))
    assert fetches.most == 3
    assert staged.path is not None and staged.nbytes == sum(len(b) for b in blobs)
    files = sorted(Path(staged.path).iterdir())
    assert [f.name for f in files] == [BUCKET_FILE.format(i) for i in range(8)]
    assert [f.read_bytes() for f in files] == blobs
    read: dict[str, np.ndarray] = {}
    for f in files:
        read |= load_file(str(f))
    assert sorted(read) == sorted(tensors)
    for key, tensor in tensors.items():
        np.testing.assert_array_equal(read[key], tensor)
    assert 0 < staged.pull_s <= staged.seconds and staged.write_s > 0

    serial = HostReceiver(name + "-serial", in_flight=1, fetch=Fetches(blobs))
    try:
        one_by_one = serial.stage(_policy(1, blobs))
        assert one_by_one.path is not None
        assert [f.read_bytes() for f in sorted(Path(one_by_one.path).iterdir())] == blobs
    finally:
        serial.close()


def test_a_failed_get_leaves_no_folder_and_the_version_can_be_staged_again(name: str) -> None:
    """Bucket 4 of 6 cannot be had: the stage raises the get's error, leaves neither the
    version's folder nor a partial one (the version stays unstaged, the one before intact);
    a later stage of the version writes it whole."""
    _, blobs = _buckets(6)
    receiver = HostReceiver(name, in_flight=2, fetch=Fetches(blobs))
    before = receiver.stage(_policy(1, blobs))

    def lost(ref: int) -> None:
        if ref == 4:
            raise ConnectionError("object lost: its owner died")

    receiver.fetch = Fetches(blobs, lost)
    with pytest.raises(ConnectionError, match="owner died"):
        receiver.stage(_policy(2, blobs))
    assert sorted(p.name for p in receiver.root.iterdir()) == ["v000001"]
    assert 2 not in receiver.staged
    assert before.path is not None and len(list(Path(before.path).iterdir())) == 6

    receiver.fetch = Fetches(blobs)
    again = receiver.stage(_policy(2, blobs))
    assert again.path is not None
    assert [f.read_bytes() for f in sorted(Path(again.path).iterdir())] == blobs


def test_at_least_one_get(name: str) -> None:
    fetch: Any = Fetches([])
    with pytest.raises(ValueError, match="at least one"):
        HostReceiver(name, in_flight=0, fetch=fetch)
