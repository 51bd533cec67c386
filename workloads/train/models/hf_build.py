"""Hugging Face causal LMs in the trainer: build on the meta device, and fill with weights.

Build order, the same for DDP and FSDP2 and for TPU, GPU and CPU: the model is created on the
meta device (no memory), sharded (FSDP2: ``fully_shard`` on each decoder block named in the
model's ``_no_split_modules``, then the root; bf16 parameters and fp32 gradient reduction on
TPU/GPU; a 2-D mesh is HSDP across slices), moved to the device with ``to_empty``, and filled:

- ``--init pretrained``: ``torch.distributed.checkpoint`` reads the safetensors through
  ``HuggingFaceStorageReader``; each rank reads only the slices of its own shards, so no worker
  holds the whole model (safetensors files are memory-mapped);
- ``--init config``: each module's own ``_init_weights`` (so each family's scheme, e.g. Gemma's
  norms) runs on a CPU copy of that one module, seeded by (seed, module name); every rank copies
  out the slice it holds. The weights depend on the seed only, not on the world size, the
  strategy or the device's random number generator.
"""

from __future__ import annotations

import copy
import json
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from workloads.train.models import model_rules


class ModelError(ValueError):
    """A model source that cannot be trained; the message names the flag."""


# ---- building ---------------------------------------------------------------------------------


def meta_model(config: Any) -> nn.Module:
    """The model on the meta device (shapes only), fp32, SDPA attention, no KV cache."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(config)
    config.use_cache = False
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation="sdpa", dtype=torch.float32
        )
    wanted = (getattr(config, "architectures", None) or [None])[0]
    if wanted and architecture_of(model) != wanted:
        raise ModelError(
            f"transformers builds {architecture_of(model)} for this config, not {wanted} "
            "(workloads/train/models/model_rules.py and the installed transformers disagree)"
        )
    return model


def block_modules(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks FSDP2 shards one by one (the model's ``_no_split_modules``)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ModelError(
            f"{type(model).__name__} names no decoder block class (_no_split_modules); "
            "the trainer cannot shard it block by block"
        )
    return blocks


def tie_groups(model: nn.Module) -> list[list[str]]:
    """Parameter names that share one tensor (tied embeddings), first name the one kept."""
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def retie(model: nn.Module, groups: list[list[str]]) -> None:
    """Point every tied name at its group's first parameter again (``to_empty`` splits them)."""
    for first, *others in groups:
        param = model.get_parameter(first)
        for name in others:
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, param)


def tied_export_keys(model: nn.Module) -> set[str]:
    """Keys a Hugging Face checkpoint leaves out because they are tied to another one."""
    tied = getattr(model, "all_tied_weights_keys", None)
    if isinstance(tied, dict):
        return {k for k in tied if isinstance(k, str)}
    return {name for group in tie_groups(model) for name in group[1:]}


def architecture_of(model: nn.Module) -> str:
    """The transformers class name (FSDP2 wraps it in a class named ``FSDP<name>``)."""
    from transformers import PreTrainedModel

    for klass in type(model).__mro__:
        if issubclass(klass, PreTrainedModel) and not klass.__name__.startswith("FSDP"):
            return klass.__name__
    return type(model).__name__


# ---- filling ----------------------------------------------------------------------------------


def _local_view(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """The tensor this rank holds and where it sits in the full tensor."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if isinstance(tensor, DTensor):
        shape, offset = compute_local_shape_and_global_offset(
            tensor.shape, tensor.device_mesh, tensor.placements
        )
        where = tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))
        return tensor.to_local(), where
    return tensor, tuple(slice(None) for _ in tensor.shape)


def _cpu_twin(module: nn.Module) -> nn.Module:
    """A shallow copy of one module with its own parameters and buffers as zeroed CPU tensors
    of full size and no children: what its ``_init_weights`` needs, and no more memory. A
    block FSDP2 wrapped is copied as its own class (``copy.copy`` of the wrapper class calls
    the block's ``__init__`` again): Gemma 4's decoder layers hold a buffer of their own."""
    from torch.distributed.fsdp import FSDPModule

    klass = next(k for k in type(module).__mro__ if not issubclass(k, FSDPModule))
    twin = cast(nn.Module, object.__new__(klass))
    twin.__dict__.update(module.__dict__)
    twin._modules = {}
    twin._parameters = {
        name: None if p is None else nn.Parameter(torch.zeros(p.shape, dtype=torch.float32))
        for name, p in module._parameters.items()
    }
    twin._buffers = {
        name: None if b is None else torch.zeros(b.shape, dtype=b.dtype)
        for name, b in module._buffers.items()
    }
    return twin


def _owners(model: nn.Module) -> Iterator[tuple[str, nn.Module, Any]]:
    """Every module with parameters or buffers of its own, with the PreTrainedModel whose
    ``_init_weights`` applies to it (the innermost enclosing one: composite models differ)."""
    from transformers import PreTrainedModel

    def walk(prefix: str, module: nn.Module, owner: Any) -> Iterator[tuple[str, nn.Module, Any]]:
        if isinstance(module, PreTrainedModel):
            owner = module
        if module._parameters or module._buffers:
            yield prefix, module, owner
        for name, child in module._modules.items():
            if child is not None:
                yield from walk(f"{prefix}.{name}" if prefix else name, child, owner)

    yield from walk("", model, model)


@torch.no_grad()
def init_from_config(model: nn.Module, seed: int) -> None:
    """Random weights by each module's own ``_init_weights``, the same on every rank layout."""
    done: set[int] = set()  # a tied parameter is filled once, by the first module owning it
    for name, module, owner in _owners(model):
        twin = _cpu_twin(module)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(zlib.crc32(f"{seed}/{name}".encode()))
            owner._init_weights(twin)
        for attr, param in module._parameters.items():
            if param is None or id(param) in done:
                continue
            done.add(id(param))
            local, where = _local_view(param)
            full = twin._parameters[attr]
            if local.numel() and full is not None:
                local.copy_(full[where])
        _copy_buffers(module, twin)


def _copy_buffers(module: nn.Module, twin: nn.Module) -> None:
    rope = getattr(module, "rope_init_fn", None)
    frequencies = twin._buffers.get("inv_freq")
    if frequencies is not None and callable(rope) and not frequencies.any():
        # transformers 4's _init_weights leaves rotary frequencies alone: compute them here.
        twin._buffers["inv_freq"] = rope(module.config, None)[0]
        if "original_inv_freq" in twin._buffers:
            twin._buffers["original_inv_freq"] = twin._buffers["inv_freq"]
    for attr, buffer in module._buffers.items():
        computed = twin._buffers.get(attr)
        if buffer is not None and computed is not None:
            buffer.copy_(computed)


@torch.no_grad()
def init_buffers(model: nn.Module) -> None:
    """Recompute buffers (rotary frequencies): ``to_empty`` leaves them as garbage, and a
    checkpoint does not hold the non-persistent ones."""
    for _, module, owner in _owners(model):
        if not module._buffers:
            continue
        twin = _cpu_twin(module)
        # Parameters on the meta device: an _init_weights that also fills them (Gemma 3's
        # scaled embedding) runs without allocating them.
        twin._parameters = {
            name: None if p is None else nn.Parameter(torch.empty(p.shape, device="meta"))
            for name, p in module._parameters.items()
        }
        owner._init_weights(twin)
        _copy_buffers(module, twin)


def checkpoint_keys(folder: Path) -> set[str]:
    """Tensor names in a folder's safetensors (index file, else the files' headers)."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        return set(json.loads(index.read_text())["weight_map"])
    from safetensors import safe_open

    keys: set[str] = set()
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            keys.update(handle.keys())
    return keys


def load_pretrained(model: nn.Module, folder: Path, spec: str) -> None:
    """Read the folder's safetensors into the (sharded or replicated) model in place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        set_model_state_dict,
    )

    state = get_model_state_dict(model)
    available = checkpoint_keys(folder)
    layout = model_rules.layout_of(set(state), available)
    for key in tied_export_keys(model):
        if layout.checkpoint_key(key) not in available:
            state.pop(key, None)  # tied to a tensor that is loaded
    missing = sorted(k for k in state if layout.checkpoint_key(k) not in available)
    if missing:
        raise ModelError(
            f"--model {spec}: {len(missing)} weights of {architecture_of(model)} are not in its "
            f"safetensors, e.g. {', '.join(missing[:3])}"
        )
    init_buffers(model)  # first: the load then overwrites the persistent ones (Gemma 4's)
    # The same tensors under the checkpoint's names: DCP fills them in place.
    named = {layout.checkpoint_key(key): value for key, value in state.items()}
    dcp.load(
        named,
        storage_reader=HuggingFaceStorageReader(str(folder)),
        planner=DefaultLoadPlanner(allow_partial_load=True),
    )
    # Not strict: a tied key (lm_head.weight) left out above is filled through its twin.
    set_model_state_dict(
        model,
        {key: named[layout.checkpoint_key(key)] for key in state},
        options=StateDictOptions(strict=False),
    )


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def train_flops_per_token(model: nn.Module, config: Any, seq_len: int) -> float:
    """6·N (matmul weights, the head included, the input embedding lookup not) + 12·L·H·T
    (attention scores and values; H = heads x head_dim), as for the GPT presets."""
    embedding = model.get_input_embeddings().weight.numel()  # type: ignore[operator]
    tied = bool(tie_groups(model))
    matmul = count_params(model) - embedding + (embedding if tied else 0)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    # Gemma 4's layers differ in head_dim (its config refuses a global one): layer by layer.
    layers = getattr(text, "per_layer_config", None) or [text] * int(text.num_hidden_layers)
    width = 0
    for layer in layers:
        heads = int(layer.num_attention_heads)
        width += heads * int(getattr(layer, "head_dim", None) or layer.hidden_size // heads)
    return 6.0 * matmul + 12.0 * width * seq_len
