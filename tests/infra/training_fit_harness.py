"""The trainer's step under PyTorch's own memory accounting (shared by the training-fit tests).

Builds a catalogue model's real transformers class the way workloads/train/models/modeling.py
``_build_hf`` does (fp32 on meta, activation checkpointing, FSDP2's ``shard``, ``to_empty``,
the chunked loss installed, DDP's ``replicate``), and runs the trainer's own
``workloads.train.run.step.forward_backward`` (micro-batches, gradient sync, the loss) and AdamW.

Under fake tensors (``FakeTensorMode``, a fake process group) nothing is allocated, so full
8B models run on a laptop CPU; ``MemTracker`` (DDP) and ``FSDPMemTracker`` (FSDP2) count every
tensor storage as PyTorch creates and frees it. What is not the trainer's own, and why:

- FSDP2: one untracked step first (AdamW's moments come into being), then the next step's
  forward and backward are tracked; its optimizer step is not: with DTensor parameters under
  fake tensors the tracker keeps every per-parameter temporary of ``AdamW.step`` alive until
  the step returns (a real-tensor run of the same step peaks at two temporaries, the fake one
  at about twenty-five). The optimizer's share is held against the real CPU run instead.
- DDP: measured on a fake group of one (per-chip memory does not depend on the world size),
  tracked from its construction on (its gradient buckets count); its shape check across ranks
  and its one-time bucket rebuild (which only reorders the same buckets) read tensor data,
  which fake tensors have not, so they are skipped; torch's own ``noop_hook`` stands for the
  in-place all-reduce, which the fake group completes without a tensor.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tests.conftest import ROOT
from workloads.train.testing import process_group

CONFIGS = json.loads((ROOT / "infra/data/models/configs.json").read_text())["models"]
CPU = torch.device("cpu")


def text_config(repo: str, layers: int | None = None) -> Any:
    """The catalogued config.json as transformers builds it (a multimodal model's text part),
    optionally with fewer layers and otherwise its real widths and vocabulary."""
    import transformers

    entry = CONFIGS[repo]
    raw = copy.deepcopy(entry["config"])
    config = transformers.CONFIG_MAPPING[raw.pop("model_type")](**raw)
    if entry["kind"] != "causal":
        config = config.get_text_config()
    if layers is not None:
        config.num_hidden_layers = layers
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:layers]
    return config


@dataclass(frozen=True)
class Step:
    """The trainer step a measurement runs: strategy, recompute, micro-batch, length, passes."""

    strategy: str
    activation_checkpointing: bool
    micro_batch: int
    seq_len: int
    accumulation_steps: int = 1


@dataclass(frozen=True)
class Measured:
    peak: int  # bytes: the tracker's total at its peak
    categories: dict[str, int]  # the tracker's breakdown at that peak


def build(
    config: Any, *, strategy: str, activation_checkpointing: bool, num_slices: int = 1
) -> Any:
    """modeling._build_hf up to sharding, on meta (the mesh is made here, outside any fake
    mode, which its constructor cannot run under; ``num_slices`` > 1: HSDP's 2-D mesh);
    :func:`place` does the rest."""
    from workloads.train.distributed.strategies import build_mesh, shard
    from workloads.train.models import hf

    model: Any = hf.meta_model(config)
    model._park_ties = hf.tie_groups(model)
    blocks = hf.block_modules(model)
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if strategy == "fsdp2":
        mesh = build_mesh("cpu", dist.get_world_size(), num_slices)
        shard(model, blocks, mesh=mesh, dtype=torch.bfloat16)
    return model


def place(model: Any) -> Any:
    from workloads.train.models import hf
    from workloads.train.models.loss import install_loss_forward

    model.to_empty(device=CPU)
    hf.retie(model, model._park_ties)
    install_loss_forward(model)
    return model


def train_model(module: Any, inner: Any, config: Any, seq_len: int) -> Any:
    """The loop's TrainModel around the module (``source`` only marks it a Hugging Face one)."""
    from workloads.train.models.modeling import TrainModel

    return TrainModel(module, inner, int(config.vocab_size), seq_len, 0.0, source=object())  # type: ignore[arg-type]


class _Parts(list[Any]):
    """The micro-batches, calling ``between`` before each (the trackers refuse a module's second
    forward in one round of per-module statistics; their peak is kept across rounds)."""

    def __init__(self, parts: list[Any], between: Any) -> None:
        super().__init__(parts)
        self._between = between

    def __iter__(self) -> Iterator[Any]:
        for part in super().__iter__():
            if self._between is not None:
                self._between()
            yield part


def step(
    model: Any,
    strategy: str,
    batch: Any,
    micro_batch: int,
    world_size: int,
    between: Any = None,
) -> None:
    """One optimizer step's forward and backward passes: the loop's own."""
    from unittest import mock

    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from workloads.train.distributed.strategies import autocast
    from workloads.train.run import step as trainer_step

    split = trainer_step.micro_batches

    def real_split(batch: Any, size: int) -> Any:
        with unset_fake_temporarily():  # it counts targets in the (real) token ids
            return _Parts(split(batch, size), between)

    amp = autocast(strategy, CPU, torch.bfloat16)
    with mock.patch.object(trainer_step, "micro_batches", real_split):
        trainer_step.forward_backward(
            model,
            batch,
            micro_batch=micro_batch,
            world_size=world_size,
            device=CPU,
            counts_vary=False,
            amp=amp,
        )


def make_batch(vocab: int, rows: int, seq_len: int) -> Any:
    from workloads.train.inputs.batches import Batch

    ids = torch.randint(0, vocab, (rows, seq_len))
    return Batch(input_ids=ids, labels=ids.clone(), position_ids=None, n_targets=ids.numel())


class _KeepBuckets:
    """DDP's reducer without its one-time bucket rebuild (see the module docstring)."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False


def measure(config: Any, run: Step, *, world_size: int = 8, num_slices: int = 1) -> Measured:
    """The tracker's peak over a step of the trainer, under fake tensors."""
    strategy, activation_checkpointing = run.strategy, run.activation_checkpointing
    micro_batch, seq_len, accumulation_steps = run.micro_batch, run.seq_len, run.accumulation_steps
    from torch._subclasses.fake_tensor import FakeTensorMode

    with process_group("fake", world_size=world_size if strategy == "fsdp2" else 1):
        model = build(
            config,
            strategy=strategy,
            activation_checkpointing=activation_checkpointing,
            num_slices=num_slices,
        )
        # real token ids (the step counts targets in them), everything else fake
        batch = make_batch(config.vocab_size, micro_batch * accumulation_steps, seq_len)
        with FakeTensorMode(allow_non_fake_inputs=True):
            place(model)
            if strategy == "ddp":
                return _measure_ddp(model, config, batch, micro_batch, seq_len)
            return _measure_fsdp(model, config, batch, micro_batch, seq_len, world_size)


def _measure_fsdp(
    model: Any, config: Any, batch: Any, micro: int, seq_len: int, world: int
) -> Measured:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

    from workloads.train.distributed.strategies import build_optimizer

    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.1)
    trainer = train_model(model, model, config, seq_len)
    step(trainer, "fsdp2", batch, micro, world)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    tracker = FSDPMemTracker(model, optimizer)
    with tracker:
        step(trainer, "fsdp2", batch, micro, world, tracker.reset_mod_stats)
        peak = tracker.get_tracker_snapshot("peak")[CPU]
    return _result(peak)


def _measure_ddp(model: Any, config: Any, batch: Any, micro: int, seq_len: int) -> Measured:
    import torch.nn.parallel.distributed as ddp_module
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

    from workloads.train.distributed.strategies import build_optimizer, replicate

    tracker = MemTracker()
    tracker.track_external(model)
    check = ddp_module._verify_param_shape_across_processes
    ddp_module._verify_param_shape_across_processes = lambda *args, **kwargs: None
    try:
        with tracker:
            module = replicate(model, CPU)
            module.register_comm_hook(None, noop_hook)
            module.reducer = _KeepBuckets(module.reducer)  # type: ignore[assignment]
            optimizer = build_optimizer(module, lr=1e-4, weight_decay=0.1)
            trainer = train_model(module, model, config, seq_len)
            for _ in range(2):
                step(trainer, "ddp", batch, micro, 1, tracker.reset_mod_stats)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            peak = tracker.get_tracker_snapshot("peak")[CPU]
    finally:
        ddp_module._verify_param_shape_across_processes = check
    return _result(peak)


def _result(peak: dict[Any, int]) -> Measured:
    return Measured(
        peak=int(peak["Total"]),
        categories={str(getattr(k, "value", k)): int(v) for k, v in peak.items() if v},
    )


def measure_real(config: Any, run: Step) -> Measured:
    """The tracker's peak over two real steps (forward, backward, AdamW) on this CPU, one gloo
    rank, real tensors: the optimizer step included, nothing skipped."""
    strategy, activation_checkpointing = run.strategy, run.activation_checkpointing
    micro_batch, seq_len, accumulation_steps = run.micro_batch, run.seq_len, run.accumulation_steps
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    from workloads.train.distributed.strategies import build_optimizer, replicate

    torch.manual_seed(0)
    with process_group():
        model = build(config, strategy=strategy, activation_checkpointing=activation_checkpointing)
        place(model)
        with torch.no_grad():
            for param in model.parameters():
                param.normal_(0, 0.02)
        batch = make_batch(config.vocab_size, micro_batch * accumulation_steps, seq_len)
        tracker: MemTracker
        if strategy == "fsdp2":
            module: Any = model
            optimizer = build_optimizer(module, lr=1e-4, weight_decay=0.1)
            tracker = FSDPMemTracker(module, optimizer)
        else:
            tracker = MemTracker()
            tracker.track_external(model)
        with tracker:
            if strategy == "ddp":
                module = replicate(model, CPU)
                optimizer = build_optimizer(module, lr=1e-4, weight_decay=0.1)
            trainer = train_model(module, model, config, seq_len)
            for _ in range(2):
                step(trainer, strategy, batch, micro_batch, 1, tracker.reset_mod_stats)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            peak = tracker.get_tracker_snapshot("peak")[CPU]
    return _result(peak)
