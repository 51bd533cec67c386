"""A decoder-only transformer LM (GPT-2 shape, pre-norm, untied head) sized by a preset.

The model is built on the meta device and materialized by the strategy, so weights are filled
by :func:`init_weights`, which works on plain tensors and on FSDP2's DTensor shards alike
(each shard draws its own values; replicas draw the same). The head is not tied to the token
embedding: tying breaks when parameters are swapped by ``to_empty``/``fully_shard``, and an
untied head is what Llama-style models do anyway.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from workloads.train.config import LOSS_CHUNK_TOKENS
from workloads.train.models.loss import chunked_cross_entropy


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the model; ``block_size`` is the longest sequence it has positions for."""

    vocab_size: int
    n_layer: int
    n_head: int
    d_model: int
    block_size: int
    mlp_ratio: int = 4

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


# GPT-2's vocabulary (50257) padded to a multiple of 128 for matrix units.
_GPT2_VOCAB = 50304

PRESETS: dict[str, ModelConfig] = {
    # ~240K parameters, byte-level vocabulary: tests and CPU smoke runs.
    "tiny": ModelConfig(vocab_size=256, n_layer=4, n_head=4, d_model=64, block_size=128),
    # ~30M: a quick real run on one accelerator.
    "small": ModelConfig(vocab_size=_GPT2_VOCAB, n_layer=6, n_head=6, d_model=384, block_size=512),
    # GPT-2 small and medium shapes (124M / 350M with tied weights; more here, untied).
    "gpt2-small": ModelConfig(
        vocab_size=_GPT2_VOCAB, n_layer=12, n_head=12, d_model=768, block_size=1024
    ),
    "gpt2-medium": ModelConfig(
        vocab_size=_GPT2_VOCAB, n_layer=24, n_head=16, d_model=1024, block_size=1024
    ),
    # ~1.0B: 16 layers of width 2048.
    "1b": ModelConfig(vocab_size=_GPT2_VOCAB, n_layer=16, n_head=32, d_model=2048, block_size=2048),
}


def model_config(
    size: str, *, vocab_size: int | None = None, seq_len: int | None = None
) -> ModelConfig:
    """The preset for ``size`` with the run's vocabulary and sequence length applied."""
    if size not in PRESETS:
        raise ValueError(f"unknown model size {size!r}; choose from {', '.join(PRESETS)}")
    cfg = PRESETS[size]
    if vocab_size is not None:
        cfg = replace(cfg, vocab_size=vocab_size)
    if seq_len is not None:
        cfg = replace(cfg, block_size=seq_len)
    if cfg.d_model % cfg.n_head:
        raise ValueError(f"d_model {cfg.d_model} is not a multiple of n_head {cfg.n_head}")
    return cfg


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    """One pre-norm transformer block: the unit FSDP2 shards and gathers."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Token + learned position embeddings, ``n_layer`` blocks, final norm, linear head.

    ``checkpointing``: recompute each block in backward (non-reentrant; no dropout, so no RNG
    state to keep), keeping only the blocks' inputs; ``loss_chunk_tokens``: tokens per chunk
    of the loss (workloads.train.models.loss).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm_f = nn.LayerNorm(cfg.d_model, bias=False)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.checkpointing = False
        self.loss_chunk_tokens = LOSS_CHUNK_TOKENS

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids ``[B, T]`` → final normalized hidden states ``[B, T, d_model]``."""
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        for block in self.blocks:
            if self.checkpointing and torch.is_grad_enabled():
                x = checkpoint(block, x, use_reentrant=False, preserve_rng_state=False)
            else:
                x = block(x)
        normed: torch.Tensor = self.norm_f(x)
        return normed

    def forward(self, idx: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids ``[B, T]`` → logits ``[B, T, vocab]``; with ``labels`` (``-100``: no
        target) the summed fp32 cross-entropy instead, without full logits."""
        if labels is None:
            logits: torch.Tensor = self.lm_head(self.hidden(idx))
            return logits
        return chunked_cross_entropy(self.hidden(idx), labels, self.lm_head, self.loss_chunk_tokens)


# ---- initialization ----------------------------------------------------------------------


def _init_std(name: str, cfg: ModelConfig) -> float | None:
    """GPT-2's scheme: N(0, 0.02), residual projections scaled by 1/sqrt(2·layers); norms 1."""
    if ".norm" in name or name.startswith("norm"):
        return None
    if name.endswith("proj.weight"):
        return 0.02 / math.sqrt(2 * cfg.n_layer)
    return 0.02


def _local_shard(param: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The tensor this rank holds and which shard it is (replicas share the same key)."""
    from torch.distributed.tensor import DTensor

    if isinstance(param, DTensor):
        coordinate = param.device_mesh.get_coordinate() or ()
        key = tuple(c for c, p in zip(coordinate, param.placements, strict=False) if p.is_shard())
        return param.to_local(), key
    return param, ()


@torch.no_grad()
def init_weights(model: nn.Module, cfg: ModelConfig, seed: int) -> None:
    """Fill every parameter (or its local shard) deterministically from ``seed``.

    Values are drawn on the CPU with a generator keyed by (seed, parameter, shard), then copied
    to the device, so the result does not depend on the device's RNG support.
    """
    for raw_name, param in model.named_parameters():
        name = raw_name.removeprefix("module.").removeprefix("_orig_mod.")
        local, shard = _local_shard(param)
        if local.numel() == 0:
            continue
        std = _init_std(name, cfg)
        if std is None:
            local.fill_(1.0)
            continue
        key = zlib.crc32(f"{seed}/{name}/{shard}".encode())
        generator = torch.Generator().manual_seed(key)
        values = torch.empty(local.shape, dtype=torch.float32).normal_(0, std, generator=generator)
        local.copy_(values)


# ---- size and cost -----------------------------------------------------------------------


def count_params(cfg: ModelConfig, *, non_embedding: bool = False) -> int:
    """Parameters of the model; ``non_embedding`` leaves out the two lookup tables."""
    with torch.device("meta"):
        model = GPT(cfg)
    total = sum(p.numel() for p in model.parameters())
    if non_embedding:
        total -= model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    return total


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Forward + backward FLOPs per token: 6·N (matmul weights) + 12·L·d·T (attention).

    The PaLM paper's estimate (appendix B); embedding lookups are not matmuls and are excluded,
    the head is included.
    """
    return 6.0 * count_params(cfg, non_embedding=True) + 12.0 * cfg.n_layer * cfg.d_model * seq_len
