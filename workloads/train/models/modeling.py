"""The model a run trains, behind one interface: a Hugging Face causal LM or a GPT preset.

The loop needs a module to step, the unwrapped model (state dicts, export), its vocabulary,
sequence length and FLOPs per token, and a loss from token ids (and position ids, for
packed documents) and targets, computed inside the wrapped module's forward without
full-vocabulary logits (workloads.train.models.loss). Which model it is decides nothing else in the
loop.

The GPT presets stay for what a Hugging Face model does not do as cheaply: the overhead
benchmark's default (``tiny``, 240K parameters, a byte vocabulary, no tokenizer) and the
synthetic-token throughput runs the stack renders by ``--model-size``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from workloads.train.config import TrainConfig
from workloads.train.distributed.strategies import compile_blocks, parallelize, replicate, shard
from workloads.train.models import hf
from workloads.train.models.gpt import model_config
from workloads.train.models.gpt import train_flops_per_token as gpt_flops_per_token
from workloads.train.models.loss import install_loss_forward


@dataclass
class TrainModel:
    module: nn.Module  # what the optimizer and the forward use (DDP wrapper or FSDP2 root)
    inner: nn.Module  # the model itself, unwrapped
    vocab_size: int
    seq_len: int
    flops_per_token: float
    source: hf.HFSource | None = None  # a Hugging Face model's files, tokenizer and config

    @property
    def is_hf(self) -> bool:
        return self.source is not None

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None) -> torch.Tensor:
        """Token ids ``[B, T]`` → logits ``[B, T, vocab]`` (whole: for checks, not training)."""
        if self.source is None:
            logits: torch.Tensor = self.module(input_ids)
            return logits
        out = self.module(input_ids=input_ids, position_ids=position_ids, use_cache=False)
        hf_logits: torch.Tensor = out.logits
        return hf_logits

    def loss(
        self, input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor | None
    ) -> torch.Tensor:
        """The summed fp32 cross-entropy of ``labels`` (``-100``: none), computed inside the
        wrapped module's forward in chunks (workloads.train.models.loss), so DDP and FSDP2 see
        it."""
        if self.source is None:
            summed: torch.Tensor = self.module(input_ids, labels)
            return summed
        hf_summed: torch.Tensor = self.module(
            input_ids=input_ids, position_ids=position_ids, loss_labels=labels
        )
        return hf_summed


def build(
    cfg: TrainConfig,
    *,
    device: torch.device,
    mesh: DeviceMesh,
    dtype: torch.dtype,
    restoring: bool,
) -> TrainModel:
    """Build, place and fill the model for ``cfg``.

    ``restoring``: a checkpoint will overwrite the parameters, so a Hugging Face model skips
    its pretrained load or random init (only the buffers a checkpoint lacks are computed).
    """
    if not cfg.is_hf:
        return _build_gpt(cfg, device=device, mesh=mesh, dtype=dtype)
    source = hf.load_source(cfg)
    seq_len = hf.seq_len_for(cfg, source.config)
    model: Any = hf.meta_model(source.config)
    ties = hf.tie_groups(model)
    blocks = hf.block_modules(model)
    if cfg.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.compile:
        compile_blocks(blocks, device.type)
    if cfg.strategy == "fsdp2":
        shard(model, blocks, mesh=mesh, dtype=dtype)
    model.to_empty(device=device)
    hf.retie(model, ties)
    if restoring:
        hf.init_buffers(model)
    elif source.init == "pretrained":
        hf.load_pretrained(model, source.folder, source.spec)
    else:
        hf.init_from_config(model, cfg.seed)
    install_loss_forward(model)
    module: nn.Module = replicate(model, device) if cfg.strategy == "ddp" else model
    config: Any = source.config
    return TrainModel(
        module=module,
        inner=model,
        vocab_size=int(config.vocab_size),
        seq_len=seq_len,
        flops_per_token=hf.train_flops_per_token(model, config, seq_len),
        source=source,
    )


def _build_gpt(
    cfg: TrainConfig, *, device: torch.device, mesh: DeviceMesh, dtype: torch.dtype
) -> TrainModel:
    """A GPT preset, randomly initialized (a checkpoint, if any, overwrites it after)."""
    gpt = model_config(cfg.model_size, vocab_size=cfg.vocab_size, seq_len=cfg.seq_len)
    module = parallelize(
        gpt,
        strategy=cfg.strategy,
        device=device,
        mesh=mesh,
        dtype=dtype,
        seed=cfg.seed,
        compile=cfg.compile,
    )
    inner = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
    inner.checkpointing = cfg.activation_checkpointing
    return TrainModel(
        module=module,
        inner=inner,
        vocab_size=gpt.vocab_size,
        seq_len=gpt.block_size,
        flops_per_token=gpt_flops_per_token(gpt, gpt.block_size),
    )
