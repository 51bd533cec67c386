"""The weight-sync contract between the learner and the rollout engines.

- The **policy version** is the number of optimizer updates behind a set of weights (0: the
  initial model). The learner publishes weights after an update (every ``k``) and the version;
  versions only go up. Every rollout carries the version it was sampled with; **staleness** =
  learner version - rollout version. :class:`PolicyStore` holds the newest published weights and
  the sampled rollouts until the learner takes them, dropping the ones staler than
  ``max_staleness``; its ``capacity`` is sized from the run's batch (two rounds: the one the
  learner takes and the one sampled ahead), and a batch that does not fit is an error, never a
  wait.
- **The ecosystem's contract** (verl, OpenRLHF, slime, SkyRL, Tunix): bf16 weights, every engine
  updated at once, each engine host reading a version once, tensors streamed rather than
  gathered into one state dict, each tensor-parallel rank reading only its slice. Here:

  1. the learner packs its weights as bf16 **buckets** (``SYNC_BUCKET_BYTES`` of tensors each,
     in the model's order, each bucket a safetensors byte string) and puts each into Ray's object
     store from the learner rank that owns it (bucket ``i`` from rank ``i % ranks``: the learner
     hosts share the upload); the :class:`PolicyVersion` lists the buckets' object references;
  2. one :class:`HostReceiver` per engine host pulls every bucket once (Ray's object store moves
     it over the network to that host's shared memory; several gets in flight, each bucket
     written as a safetensors file into host memory, ``/dev/shm``, as soon as it is in);
     engines on that host share the copy;
  3. every engine loads the host's folder through vLLM's own worker-extension API
     (``LLM(worker_extension_cls=...)``, ``collective_rpc``): ``VLLMWeightLoader``
     (workloads/rl/engine_weights.py) runs on each vLLM worker (every tensor-parallel rank),
     memory-maps the files and hands ``reload_weights`` tensors that are views of them, so the
     family's ``load_weights`` (stacked QKV, TP slicing) copies out only the rank's slice: its
     pages are the only ones read. On vllm-torchtpu, whose linear weights are stored transposed,
     it clears the engine's "already flipped" marks first so that the engine's own hook flips
     the new weights, and refuses a worker without ``reload_weights`` rather than loading
     ``[n_out, n_in]`` into a transposed parameter (engine_weights.py says why).

  The engines load in parallel (the pool issues every load before waiting on any). vLLM 0.32's
  built-in weight-transfer backends (``distributed/weight_transfer``: NCCL, CUDA IPC, sharded
  RDT) are CUDA-only, and vllm-torchtpu's TPU worker offers no ``reload_weights`` of its own (its
  runner subclasses vLLM's GPU runner, which has it), so the transport here is Ray's and the
  loading is vLLM's.
- ``--weight-sync folder`` keeps the older path: the learner writes a bf16 safetensors folder
  under the run's storage (the bucket through its mount on GKE) and every engine loads it from
  there. Either way the run's **start folder** (the version the engines start, and Ray restarts
  them, from) is such a folder, and it is never deleted while the run lasts.

:class:`PolicyStore` and :class:`HostReceiver` are plain classes: in a Ray job they run as actors
(``ray.remote(PolicyStore)``); their methods are short and their results plain dataclasses.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

POLICY_DIR = "policy"
SYNC_BUCKET_BYTES = 256 * 1024**2
SYNC_DTYPE_NAME = "bfloat16"  # what crosses the network; the engine casts to its own dtype
BUCKET_FILE = "bucket-{:05d}.safetensors"
STAGED_VERSIONS_KEPT = 2  # per host: the newest, and the one an engine may still be loading
# Buckets a host receiver fetches at once (HostReceiver): each up to SYNC_BUCKET_BYTES of host
# memory while it is written.
STAGE_GETS_IN_FLIGHT = 4


@dataclass(frozen=True)
class WeightBucket:
    """One bucket of a published version: its place in the model's order, its bytes (a
    safetensors file's) in Ray's object store, and how many."""

    index: int
    ref: Any  # ray.ObjectRef of a numpy uint8 array
    nbytes: int


@dataclass(frozen=True)
class PolicyVersion:
    """Published weights: ``version`` updates, as a folder vLLM can load (``path``) or as
    buckets in Ray's object store (``buckets``)."""

    version: int
    path: str | None
    buckets: tuple[WeightBucket, ...] = ()
    nbytes: int = 0  # the weights' bytes (a folder's files, or the buckets')
    published_at: float = field(default_factory=time.time)


def version_folder(root: str, version: int) -> str:
    """Where the learner writes version ``version`` under the run's folder ``root``."""
    return f"{root.rstrip('/')}/{POLICY_DIR}/v{version:06d}"


def staleness(learner_version: int, rollout_version: int) -> int:
    """Updates the learner made since the weights that sampled a rollout."""
    return learner_version - rollout_version


@dataclass
class Taken:
    """What :meth:`PolicyStore.take` hands the learner."""

    items: list[Any]
    versions: list[int]
    dropped: int  # stale items discarded by this call
    max_staleness_seen: int  # of the items handed over (0 when none)


@dataclass(frozen=True)
class Put:
    """What :meth:`PolicyStore.put_many` did with a batch."""

    accepted: int
    stale: int  # refused: staler than the bound already
    full: int  # refused: no room (the store is sized from the batch: a bug if it happens)


class StoreFull(RuntimeError):
    """More rollouts than the store was sized for."""


class PolicyStore:
    """The newest published weights, and the sampled rollouts waiting for the learner."""

    def __init__(self, max_staleness: int = 1, capacity: int = 64) -> None:
        if max_staleness < 0 or capacity < 1:
            raise ValueError(f"max_staleness {max_staleness} / capacity {capacity}")
        self.max_staleness = max_staleness
        self.capacity = capacity
        self._latest: PolicyVersion | None = None
        self._offered: dict[int, dict[int, WeightBucket]] = {}
        self._queue: deque[tuple[int, Any]] = deque()
        self.dropped = 0
        self.refused = 0

    # -- weights ------------------------------------------------------------------------------

    def publish(
        self,
        version: int,
        path: str | None,
        buckets: tuple[WeightBucket, ...] = (),
        nbytes: int = 0,
    ) -> PolicyVersion:
        """Record version ``version`` (higher than any published before)."""
        if self._latest is not None and version <= self._latest.version:
            raise ValueError(
                f"policy version {version} published after {self._latest.version}: "
                "versions only go up"
            )
        ordered = tuple(sorted(buckets, key=lambda b: b.index))
        size = sum(b.nbytes for b in ordered) if ordered else nbytes
        self._latest = PolicyVersion(version, path, ordered, size)
        return self._latest

    def offer(self, version: int, buckets: list[WeightBucket]) -> int:
        """A learner rank's buckets of ``version`` (its object references, held here from now
        on); returns how many of the version's buckets are in."""
        offered = self._offered.setdefault(version, {})
        offered.update({b.index: b for b in buckets})
        return len(offered)

    def publish_offered(self, version: int, count: int) -> PolicyVersion:
        """Publish ``version`` from its ``count`` offered buckets (every rank has offered)."""
        offered = self._offered.pop(version, {})
        if sorted(offered) != list(range(count)):
            raise ValueError(f"version {version}: buckets {sorted(offered)} of {count} offered")
        for older in [v for v in self._offered if v < version]:
            del self._offered[older]
        return self.publish(version, None, tuple(offered.values()))

    def latest(self) -> PolicyVersion | None:
        return self._latest

    def learner_version(self) -> int:
        return -1 if self._latest is None else self._latest.version

    # -- rollouts -----------------------------------------------------------------------------

    def fresh(self, rollout_version: int, learner_version: int | None = None) -> bool:
        """Whether a rollout of ``rollout_version`` is within the bound (against the newest
        published version unless ``learner_version`` is given)."""
        current = self.learner_version() if learner_version is None else learner_version
        return staleness(current, rollout_version) <= self.max_staleness

    def put(self, version: int, item: Any) -> bool:
        """Queue ``item`` sampled with ``version``. False when it is refused: already stale
        (counted in ``refused``; resample with newer weights) or the queue is full."""
        return self.put_many([(version, item)]).accepted == 1

    def put_many(self, items: list[tuple[int, Any]]) -> Put:
        """Queue a round's ``(version, item)`` pairs in one call (stale ones refused)."""
        accepted = stale = full = 0
        for version, item in items:
            if not self.fresh(version):
                stale += 1
            elif len(self._queue) >= self.capacity:
                full += 1
            else:
                self._queue.append((version, item))
                accepted += 1
        self.refused += stale
        return Put(accepted, stale, full)

    def take(self, count: int, learner_version: int) -> Taken:
        """Up to ``count`` queued items, oldest first, within the staleness bound at
        ``learner_version``; staler ones are dropped (and counted)."""
        items: list[Any] = []
        versions: list[int] = []
        dropped = 0
        while self._queue and len(items) < count:
            version, item = self._queue.popleft()
            if staleness(learner_version, version) > self.max_staleness:
                dropped += 1
                continue
            items.append(item)
            versions.append(version)
        self.dropped += dropped
        seen = max((staleness(learner_version, v) for v in versions), default=0)
        return Taken(items, versions, dropped, seen)

    def queued(self) -> int:
        return len(self._queue)

    def stats(self) -> dict[str, int]:
        return {
            "learner_version": self.learner_version(),
            "queued": len(self._queue),
            "dropped": self.dropped,
            "refused": self.refused,
        }


# -- the host side ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Staged:
    """A version as one host holds it: a local folder of safetensors, and what staging took."""

    policy: PolicyVersion  # path: the host's folder; no buckets
    nbytes: int  # bytes pulled onto the host for it
    seconds: float  # the stage's wall time: the pulls and the writes, overlapped
    pull_s: float = 0.0  # from the first get to the last bucket in
    write_s: float = 0.0  # writing into host memory, summed over the buckets

    @property
    def version(self) -> int:
        return self.policy.version

    @property
    def path(self) -> str | None:
        return self.policy.path


def staging_root() -> Path:
    """Host memory when the host has it (``/dev/shm``: a Ray pod mounts a memory emptyDir
    there), else the temporary folder."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


class HostReceiver:
    """One per engine host: pulls each published version's buckets from Ray's object store once
    and keeps the newest versions as local safetensors folders for the host's engines. Buckets
    are fetched ``in_flight`` at a time, each written by its fetching thread once in (bucket
    ``i`` written while ``i+1..i+k`` come): one get at a time holds a node near the ~200-300
    MB/s ray-project/ray #42632 measured, and a write behind each get adds to every bucket.
    ``fetch`` is how a bucket's bytes come (Ray's get; a test passes its own)."""

    def __init__(
        self,
        name: str,
        in_flight: int = STAGE_GETS_IN_FLIGHT,
        fetch: Callable[[Any], Any] | None = None,
    ) -> None:
        if in_flight < 1:
            raise ValueError(f"in_flight {in_flight}: at least one get")
        self.root = staging_root() / name
        self.root.mkdir(parents=True, exist_ok=True)
        if fetch is None:
            import ray

            fetch = ray.get
        self.in_flight, self.fetch = in_flight, fetch
        self.staged: dict[int, Staged] = {}

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def stage(self, policy: PolicyVersion) -> Staged:
        """``policy``'s buckets as files in this host's memory (once per version), renamed into
        place once all are in: a failed get leaves no folder an engine could take for it."""
        if policy.version in self.staged:
            return self.staged[policy.version]
        if not policy.buckets:  # a folder version: every engine reads it where it is
            return Staged(policy, 0, 0.0)
        started = time.perf_counter()
        final = self.root / f"v{policy.version:06d}"
        partial = self.root / f".v{policy.version:06d}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            pulled = self._pull(policy.buckets, partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        shutil.rmtree(final, ignore_errors=True)
        partial.rename(final)
        nbytes, arrived, wrote = zip(*pulled, strict=True)
        done = replace(policy, path=str(final), buckets=())
        seconds = time.perf_counter() - started
        staged = Staged(done, sum(nbytes), seconds, max(arrived) - started, sum(wrote))
        self.staged[policy.version] = staged
        for old in sorted(self.staged)[:-STAGED_VERSIONS_KEPT]:
            shutil.rmtree(self.root / f"v{old:06d}", ignore_errors=True)
            del self.staged[old]
        return staged

    def _pull(
        self, buckets: tuple[WeightBucket, ...], folder: Path
    ) -> list[tuple[int, float, float]]:
        """Every bucket into ``folder``, ``in_flight`` gets at a time in the buckets' order: per
        bucket its bytes, when it arrived and its write's seconds. The first error is raised
        once the running gets have ended (the rest never start)."""

        def fetch_and_write(bucket: WeightBucket) -> tuple[int, float, float]:
            data = self.fetch(bucket.ref)
            arrived = time.perf_counter()
            with open(folder / BUCKET_FILE.format(bucket.index), "wb") as out:
                out.write(memoryview(data))
            return int(data.nbytes), arrived, time.perf_counter() - arrived

        with ThreadPoolExecutor(self.in_flight, thread_name_prefix="park-stage") as pool:
            futures = [pool.submit(fetch_and_write, bucket) for bucket in buckets]
            try:
                return [future.result() for future in futures]
            except BaseException:
                for future in futures:
                    future.cancel()
                raise

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.staged.clear()


# -- the engine side ----------------------------------------------------------------------------

_SAFETENSORS_DTYPES = {
    "BF16": "bfloat16",
    "F16": "float16",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


def _files(folder: str) -> list[Path]:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors in {folder}")
    return files


def stream_safetensors(folder: str) -> Iterator[tuple[str, Any]]:
    """Every tensor of a folder's safetensors files as ``(name, CPU tensor)``, file by file, in
    the files' order; each tensor a view of the memory-mapped file (nothing is read until a
    consumer touches it, and a consumer that copies out a slice reads only its pages)."""
    import torch

    for path in _files(folder):
        with open(path, "rb") as handle:
            mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
        (length,) = struct.unpack("<Q", mapped[:8])
        header = json.loads(bytes(mapped[8 : 8 + length]))
        base = 8 + length
        header.pop("__metadata__", None)
        for name, info in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            dtype = getattr(torch, _SAFETENSORS_DTYPES[info["dtype"]])
            start, stop = info["data_offsets"]
            count = (stop - start) // torch.empty((), dtype=dtype).element_size()
            flat = torch.frombuffer(mapped, dtype=dtype, count=count, offset=base + start)
            yield name, flat.view(info["shape"])


def folder_bytes(folder: str) -> int:
    return sum(path.stat().st_size for path in _files(folder))


def local_folder(uri: str) -> str:
    """``uri`` as a folder of this machine: a local path, the bucket through its mount, or a
    copy mirrored into the node's cache."""
    from workloads.train import storage

    local = storage.local_path(uri)
    if local is not None:
        return str(local)
    return str(storage.mirror(uri, keep=lambda name: name.endswith(".safetensors")))
