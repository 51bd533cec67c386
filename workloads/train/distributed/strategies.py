"""Data parallelism: DDP or FSDP2, on whatever device the worker has (tpu, cuda, cpu).

Both strategies start from a model on the meta device (no memory until it is placed), so one
path serves a tiny CPU test and a 1B model on TPU, for the GPT presets and for Hugging Face
models alike. FSDP2 shards each block, then the root, on a DeviceMesh (1-D ``dp``; with
several TPU slices 2-D ``(replicate, shard)``, i.e. HSDP: shard over a slice's ICI, replicate
over DCN), with bf16 parameters for compute and fp32 gradient reduction on TPU/GPU. Ray's
``prepare_model("fsdp")`` only knows CUDA, so ``fully_shard`` is called here directly; tensor
or sequence parallelism can later add mesh dimensions and DTensor plans without changing the
loop.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from workloads.train.models.gpt import GPT, ModelConfig, init_weights


def compute_dtype(precision: str, device_type: str) -> torch.dtype:
    """bf16 where the device has bf16 matrix units (TPU, recent GPUs), else fp32."""
    if precision == "bf16":
        return torch.bfloat16
    if precision == "fp32":
        return torch.float32
    if device_type == "tpu":
        return torch.bfloat16
    if device_type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def build_mesh(device_type: str, world_size: int, num_slices: int = 1) -> DeviceMesh:
    """The data-parallel mesh; needs the default process group to be up."""
    if num_slices > 1:
        if world_size % num_slices:
            raise ValueError(f"{world_size} workers do not split into {num_slices} slices")
        return init_device_mesh(
            device_type,
            (num_slices, world_size // num_slices),
            mesh_dim_names=("replicate", "shard"),
        )
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=("dp",))


def compile_blocks(blocks: list[nn.Module], device_type: str) -> None:
    """Compile each block in place (smaller graphs, works under both DDP and FSDP2)."""
    backend = "tpu" if device_type == "tpu" else "inductor"
    for block in blocks:
        block.compile(backend=backend)


def shard(
    model: nn.Module, blocks: list[nn.Module], *, mesh: DeviceMesh, dtype: torch.dtype
) -> None:
    """FSDP2 in place: every block, then the root (which keeps embeddings, final norm, head).

    Mixed precision: parameters are gathered in ``dtype`` (bf16 on TPU/GPU) for compute while
    the sharded fp32 copy is what the optimizer updates, and gradients are reduced in fp32.
    """
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def replicate(model: nn.Module, device: torch.device) -> DistributedDataParallel:
    """DDP around a model already on its device."""
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def parallelize(
    cfg: ModelConfig,
    *,
    strategy: str,
    device: torch.device,
    mesh: DeviceMesh,
    dtype: torch.dtype,
    seed: int,
    compile: bool = False,
) -> nn.Module:
    """Build the model on meta, shard or replicate it, place it on ``device``, fill weights."""
    with torch.device("meta"):
        model = GPT(cfg)
    blocks = list(model.blocks)
    if compile:
        compile_blocks(blocks, device.type)
    if strategy == "fsdp2":
        shard(model, blocks, mesh=mesh, dtype=dtype)
    elif strategy != "ddp":
        raise ValueError(f"unknown strategy {strategy!r}")
    model.to_empty(device=device)
    init_weights(model, cfg, seed)
    if strategy == "ddp":
        return replicate(model, device)
    return model


def autocast(
    strategy: str, device: torch.device, dtype: torch.dtype
) -> contextlib.AbstractContextManager[None]:
    """DDP keeps fp32 weights and runs matmuls in bf16 under autocast; FSDP2 casts by policy."""
    if strategy == "ddp" and dtype != torch.float32:
        return torch.autocast(device_type=device.type, dtype=dtype)
    return contextlib.nullcontext()


def build_optimizer(model: nn.Module, *, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW with decay on matrices only (not on norms' scales)."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(
    step: int,
    *,
    base_lr: float,
    warmup_steps: int,
    total_steps: int,
    min_ratio: float = 0.1,
    schedule: str = "cosine",
) -> float:
    """Linear warmup to ``base_lr``, then cosine or linear decay to ``min_ratio · base_lr`` at
    the last step, or constant."""
    if warmup_steps and step <= warmup_steps:
        return base_lr * step / warmup_steps
    if schedule == "constant":
        return base_lr
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    if schedule == "linear":
        return base_lr * (1 - (1 - min_ratio) * progress)
    return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


# SDPA backends on TPU, in priority order; PARK_TPU_SDPA_BACKENDS (e.g. "OVERRIDEABLE,MATH",
# what Google's samples use) replaces it without a new image if a kernel misbehaves on a slice.
TPU_SDPA_BACKENDS = ("FLASH_ATTENTION", "OVERRIDEABLE", "MATH")


def sdpa_backends(device_type: str) -> contextlib.AbstractContextManager[None]:
    """On TPU, torch_tpu's flash-attention kernel first; elsewhere PyTorch's own choice
    (flash / memory-efficient / math), unchanged.

    Read in torch_tpu 0.2.0 (the wheel; attention on the ``tpu`` device is compiled code, so
    the C++ facts are its symbols and messages in
    ``csrc/common/glue_2_13_0/libpywrap_2_13_0_common.so``):

    - ``FLASH_ATTENTION`` is ``torch_tpu::AtenScaledDotProductFlashAttention(q, k, v,
      attn_mask?, ...)`` → ``CreateFlashAttentionKernel`` (``csrc/ops/scaled_dot_product_
      attention/flash_attention_kernel.cc``): a Mosaic kernel, tiled with an online softmax
      (no ``T x T`` scores kept for backward), that skips blocks above the diagonal when
      causal and otherwise takes the mask as a bias ("Causal mask and attn bias are mutually
      exclusive"). ``AtenFusedSdpChoice`` takes it when "inputs have static shapes", "dropout_p
      is in [0.0, 1.0)" and "attn_mask does not require gradient" — true of both masks the
      trainer makes: causal (no mask) and Hugging Face's boolean block-diagonal mask for packed
      documents (position ids restarting).
    - ``OVERRIDEABLE`` is ``AtenScaledDotProductFusedAttentionOverrideable`` →
      ``ScaledDotProductFusedAttentionShlo``, attention written as StableHLO for XLA (an online
      softmax only where ``IsSdpaSequenceAlignedAndLarge``); it also takes a mask
      (``_internal/compile/fx_passes/detect_causal_mask.py:160-183``). Google's samples and
      torch_tpu's own ``SingleTraceTrainer`` (``_internal/optimizers/single_trace_trainer.py:
      100-103``) run ``[OVERRIDEABLE, MATH]``: it stays as the fallback, then MATH.
    - The Pallas splash kernel (``_internal/ops/splash_attention.py:441-560``, public as the
      experimental ``torch.tpu.ops.splash_sdpa``) is not an SDPA backend, and takes only
      causal, full or sliding-window masks (``segment_ids=None`` at line 194): not packed
      documents, so not used here.

    Not yet run on a v6e slice: ``PARK_TPU_SDPA_BACKENDS`` overrides the order."""
    if device_type != "tpu":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = os.environ.get("PARK_TPU_SDPA_BACKENDS", ",".join(TPU_SDPA_BACKENDS))
    backends = []
    for name in filter(None, (n.strip().upper() for n in names.split(","))):
        if not isinstance(getattr(SDPBackend, name, None), SDPBackend):
            raise ValueError(f"PARK_TPU_SDPA_BACKENDS: {name} is not a torch SDPBackend")
        backends.append(getattr(SDPBackend, name))
    return sdpa_kernel(backends, set_priority=True)
