"""Export a trained model as a Hugging Face folder that transformers and vLLM load.

The folder: ``config.json`` (with the export dtype), the weights as safetensors, one file
``model.safetensors`` or, past ``--export-max-shard-size``, ``model-0000i-of-0000n.safetensors``
with ``model.safetensors.index.json``, the tokenizer (its chat template included),
``generation_config.json`` and ``park_export.json`` (run, step, loss, source). It is written
under ``<storage-path>/<run-name>/export/`` (``final/`` at the end of a run, ``step_N/`` for
``--export-every``), straight to the bucket on GKE, where serving reads it through the GCS FUSE
mount.

No worker holds the whole model: the weights are planned into shard files from their shapes
alone, then gathered one tensor at a time (``DTensor.full_tensor``, a collective every rank
joins), and only the rank that owns a file (file ``i`` belongs to rank ``i % world``) keeps
its tensors, as CPU copies in the export dtype, until it writes that file. The peak per worker
is one shard file plus one full tensor; several ranks write files at once. ``park_export.json``
(workloads/protocol.py EXPORT_MARKER) is written last, by rank 0 once every rank has written
its files: a folder without it is an export still being written (or a failed one), and a
serving replica started with the run waits for it (workloads/serve/wait.py).
"""

from __future__ import annotations

import copy
import json
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from workloads import protocol
from workloads.train import storage
from workloads.train.models import hf

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
MARKER_NAME = protocol.EXPORT_MARKER
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def export_dtype(choice: str, compute_dtype: torch.dtype) -> torch.dtype:
    """``auto``: the precision it was trained in (bf16 on TPU/GPU, fp32 on CPU)."""
    if choice == "auto":
        return torch.bfloat16 if compute_dtype == torch.bfloat16 else torch.float32
    return DTYPES[choice]


def owned_tensors(
    state: Mapping[str, torch.Tensor], keys: list[str], rank: int, owner: int, dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """The whole tensors of `keys`, on the CPU in `dtype`, on `owner`'s rank (empty on the
    others). Every rank calls it with the same keys: a sharded tensor is gathered
    (``DTensor.full_tensor``, a collective), one key after the other."""
    from torch.distributed.tensor import DTensor

    tensors: dict[str, torch.Tensor] = {}
    for key in keys:
        tensor = state[key]
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if rank == owner:
            tensors[key] = full.detach().to(device="cpu", dtype=dtype).contiguous()
        del full
    return tensors


def plan_shards(sizes: list[tuple[str, int]], max_bytes: int) -> list[list[str]]:
    """Tensors into files in order, a new file when the next would pass ``max_bytes`` (a tensor
    larger than that gets a file of its own), as ``save_pretrained`` does."""
    shards: list[list[str]] = [[]]
    used = 0
    for name, size in sizes:
        if shards[-1] and used + size > max_bytes:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += size
    return shards


def shard_names(count: int) -> list[str]:
    if count == 1:
        return [WEIGHTS_NAME]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def _rank_world() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier(group: dist.ProcessGroup | None) -> None:
    if dist.is_initialized():
        dist.barrier(group=group)


@torch.no_grad()
def export_model(
    model: nn.Module,
    destination: str,
    *,
    source: hf.HFSource,
    dtype: torch.dtype,
    max_shard_bytes: int,
    metadata: dict[str, Any],
    group: dist.ProcessGroup | None = None,
) -> str:
    """Write the model (unwrapped: not the DDP wrapper) as a Hugging Face folder at
    ``destination``; every rank calls this. Returns ``destination``."""
    from safetensors.torch import save as safetensors_bytes
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    rank, world = _rank_world()
    started = time.perf_counter()
    if rank == 0:
        storage.remove_folder(destination)  # an older export of the same name goes first
    _barrier(group)

    tied = hf.tied_export_keys(model)
    state: dict[str, torch.Tensor] = {
        key: value
        for key, value in get_model_state_dict(model).items()
        if isinstance(value, torch.Tensor) and key not in tied
    }
    itemsize = torch.empty((), dtype=dtype).element_size()
    sizes = [(key, int(tensor.numel()) * itemsize) for key, tensor in state.items()]
    shards = plan_shards(sizes, max_shard_bytes)
    names = shard_names(len(shards))
    weight_map: dict[str, str] = {}
    for index, (keys, name) in enumerate(zip(shards, names, strict=True)):
        owner = index % world
        tensors = owned_tensors(state, keys, rank, owner, dtype)
        weight_map.update(dict.fromkeys(keys, name))
        if rank == owner:
            storage.write_bytes(
                storage.join(destination, name), safetensors_bytes(tensors, {"format": "pt"})
            )
        del tensors
    if rank == 0:
        _write_side_files(model, destination, source, dtype, weight_map, sizes, names)
    _barrier(group)  # every rank's shard files are written
    if rank == 0:
        body = json.dumps(metadata, indent=2, sort_keys=True) + "\n"
        storage.write_bytes(storage.join(destination, MARKER_NAME), body.encode())
        seconds = time.perf_counter() - started
        print(f"exported {len(state)} tensors, {len(names)} file(s), {seconds:.1f}s: {destination}")
    return destination


def _write_side_files(
    model: nn.Module,
    destination: str,
    source: hf.HFSource,
    dtype: torch.dtype,
    weight_map: dict[str, str],
    sizes: list[tuple[str, int]],
    names: list[str],
) -> None:
    from transformers import GenerationConfig

    config = copy.deepcopy(source.config)
    config.architectures = [hf.architecture_of(model)]
    config.use_cache = True  # training turned it off; generation wants it
    config.dtype = str(dtype).removeprefix("torch.")
    with tempfile.TemporaryDirectory(prefix="park-export-") as scratch:
        folder = Path(scratch)
        source.tokenizer.save_pretrained(folder)
        generation = source.folder / "generation_config.json"
        if generation.exists():
            (folder / "generation_config.json").write_bytes(generation.read_bytes())
        else:
            GenerationConfig.from_model_config(config).save_pretrained(folder)
        if len(names) > 1:
            index = {
                "metadata": {"total_size": sum(size for _, size in sizes)},
                "weight_map": dict(sorted(weight_map.items())),
            }
            (folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
        config.save_pretrained(folder)
        storage.upload_folder(folder, destination)
