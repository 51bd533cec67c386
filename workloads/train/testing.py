"""Small, quick setups of the trainer, for the tests and the benchmarks (which cannot import
``tests/``): a CPU run's config, a decoder config of any size, a process group of this process.

One definition, so that "a tiny CPU run" or "a small Llama with the tiny tokenizer" is built
the same way everywhere and each caller states only what its run changes. The worker never
imports this module; torch and transformers are imported by the functions that need them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from workloads.protocol import free_port
from workloads.train.config import TrainConfig
from workloads.train.config_rules import BUILTIN_PREFIX

TINY_LLAMA = BUILTIN_PREFIX + "tiny-llama"
FACTS = BUILTIN_PREFIX + "facts"


def cpu_run(**fields: Any) -> TrainConfig:
    """A run on this machine's CPU with one worker unless ``fields`` say otherwise; every other
    field as given or TrainConfig's default (the GPT ``tiny`` preset on synthetic tokens)."""
    where: dict[str, Any] = {"accelerator": "cpu", "num_workers": 1}
    return TrainConfig(**(where | fields))


def facts_sft(**fields: Any) -> TrainConfig:
    """:func:`cpu_run` of ``park:tiny-llama`` (random weights from its config) fine-tuned on
    the shipped facts chats: what ``park local`` trains, at whatever size ``fields`` give."""
    run: dict[str, Any] = {"model": TINY_LLAMA, "data": FACTS, "objective": "sft"}
    return cpu_run(**(run | fields))


def decoder_shape(
    *,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    positions: int,
    layers: int | None = None,
    vocab: int | None = None,
    tokenizer: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    """Keyword arguments of a transformers decoder config (Llama, Qwen, Mistral and Gemma
    name these fields alike): its sizes, and a tokenizer's vocabulary size (unless ``vocab``)
    and special ids. ``layers`` None keeps the config's own count; ``extra``: the family's own
    fields (``head_dim``, ``tie_word_embeddings``, ...)."""
    shape: dict[str, Any] = {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": positions,
    }
    if layers is not None:
        shape["num_hidden_layers"] = layers
    if tokenizer is not None:
        shape |= {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in _IDS}
    if vocab is not None or tokenizer is not None:
        shape["vocab_size"] = vocab if vocab is not None else len(tokenizer)
    return shape | extra


_IDS = ("bos", "eos", "pad")


@contextlib.contextmanager
def process_group(
    backend: str = "gloo",
    *,
    world_size: int = 1,
    rank: int = 0,
    port: int | None = None,
    device: Any = None,
) -> Iterator[None]:
    """The default process group the loop's collectives use, destroyed on leaving.

    ``fake``: this one process stands for rank ``rank`` of any world (real shards and gathered
    buffers, no traffic). ``gloo``/``nccl``: the ranks meet on ``port`` of this machine (a free
    one when this process is the whole world); ``device``: nccl's device of this rank."""
    import torch.distributed as dist

    if backend == "fake":
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    else:
        if port is None and world_size != 1:
            raise ValueError(f"{world_size} ranks need the port they meet on")
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port or free_port()}",
            rank=rank,
            world_size=world_size,
            device_id=device,
        )
    try:
        yield
    finally:
        dist.destroy_process_group()
