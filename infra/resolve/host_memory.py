"""Host memory per TPU pod, before anything runs: what a host holds besides the chips' HBM.

As far as the sources say: DCP's FileSystemWriter copies each tensor to the host ahead of
writing it (per_thread_copy_ahead, 10 MB by default, at least one tensor; torch/distributed/
checkpoint/filesystem.py _OverlappingCpuLoader / _SerialCpuLoader); HuggingFaceStorageReader
reads one slice at a time from memory-mapped safetensors (page cache: reclaimable;
hf_storage.py read_data); the exporter holds each shard it owns twice (tensors and the
safetensors bytes; workloads/train/outputs/export.py); gcsfuse holds about 64 MiB per file it
streams and its metadata caches. Processes (training ranks, engine workers, Ray's node) are named
allowances. Held against the pod's memory request (catalog pod_memory_gib); part of the disk
plan (infra.resolve.disk.DiskPlan.memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra import model_facts
from infra.resolve.types import ServingPlan, TrainingPlan

GIB = 1024**3
MIB = 1024**2

GCSFUSE_STREAMING_BUFFER_BYTES = 64 * MIB  # per file open for a streaming write (gcsfuse 2.9.1)
GCSFUSE_METADATA_BYTES = 1152 * MIB  # stat 1024 MiB + type 128 MiB caches (gcsfuse v3 on ct6e)
TRAIN_PROCESS_BYTES = 8 * GIB  # one training worker: Python, torch, torch_tpu, Ray (allowance)
ENGINE_PROCESS_BYTES = 16 * GIB  # one vLLM engine worker host process (allowance)
RAY_NODE_PROCESS_BYTES = 4 * GIB  # raylet, agents, dashboard on one node (allowance)
DCP_COPY_AHEAD_BYTES = 10 * 1000**2  # FileSystemWriter per_thread_copy_ahead default (10 MB)


@dataclass(frozen=True)
class Item:
    """One use of disk or memory: what it is, how many bytes, why this many."""

    name: str
    bytes: int
    note: str = ""


@dataclass(frozen=True)
class HostMemory:
    """What one pod holds in the host's memory, against its memory request."""

    role: str
    pool: str
    items: tuple[Item, ...]
    request_bytes: int

    @property
    def total_bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.request_bytes


def _largest_tensor_bytes(facts: model_facts.ModelFacts | None) -> int | None:
    """The largest single tensor of a model in fp32 (the embedding or the LM head)."""
    if facts is None:
        return None
    return facts.vocab_size * facts.hidden_size * 4


def training_memory(training: TrainingPlan) -> HostMemory:
    """A training host: its ranks' processes; DCP's save copies each tensor to the host ahead of
    writing it, 10 MB ahead (FileSystemWriter, per_thread_copy_ahead) but at least one whole
    tensor; HuggingFaceStorageReader reads one slice at a time from memory-mapped files (page
    cache, reclaimable); an export holds one shard twice (tensors and safetensors bytes) on
    each rank that owns one; gcsfuse holds 64 MiB per file it streams."""
    tpu, spec = training.pool.slice, training.spec
    ranks = tpu.chips_per_host
    shard = max(training.workers, 1) if spec.strategy == "fsdp2" else 1
    largest = _largest_tensor_bytes(training.facts.facts)
    staging = max((largest or 0) // shard, DCP_COPY_AHEAD_BYTES)
    items = [
        Item("training processes", ranks * TRAIN_PROCESS_BYTES, f"{ranks} ranks (allowance)"),
        Item("ray node processes", RAY_NODE_PROCESS_BYTES),
        Item("DCP save staging", ranks * staging, "one tensor shard per rank"),
        Item(
            "gcsfuse buffers",
            ranks * GCSFUSE_STREAMING_BUFFER_BYTES + GCSFUSE_METADATA_BYTES,
            "streaming writes + metadata caches",
        ),
    ]
    if training.export_path:
        from workloads.train.config_rules import parse_size

        shard = parse_size(spec.export_max_shard_size)
        weights = model_facts.weights_bytes(training.facts.facts) or shard * ranks
        owners = min(ranks, math.ceil(weights / shard))  # shards go round-robin to ranks
        items.append(
            Item(
                "export shards",
                owners * 2 * min(shard, weights),
                f"{owners} rank(s) each hold one shard, as tensors and as bytes",
            )
        )
    return HostMemory("training-worker", training.pool.name, tuple(items), tpu.pod_memory_gib * GIB)


def serving_memory(serving: ServingPlan) -> HostMemory:
    """A serving host: one engine worker per chip, the Ray node, gcsfuse's caches (the weights
    themselves are read through the page cache from the file cache: reclaimable)."""
    tpu = serving.pool.slice
    items = (
        Item("engine workers", tpu.chips_per_host * ENGINE_PROCESS_BYTES, "allowance per chip"),
        Item("ray node processes", RAY_NODE_PROCESS_BYTES),
        Item("gcsfuse metadata caches", GCSFUSE_METADATA_BYTES),
    )
    return HostMemory("serving-worker", serving.pool.name, items, tpu.pod_memory_gib * GIB)
