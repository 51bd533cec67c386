"""The training step against references nobody here wrote: the chunked loss against each
Hugging Face family's own logits, gradient accumulation and DDP / FSDP2 / HSDP on two gloo
ranks against one plain model on the whole global batch, activation checkpointing by the
number of times PyTorch runs each block."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tests.workloads.train_fixtures import (  # noqa: F401  (fixtures)
    gloo_world1,
    rendezvous,
    run_ranks,
    tiny_llama_folder,
    tiny_tokenizer,
)
from workloads.train.config import TrainConfig
from workloads.train.inputs.batches import IGNORE, Batch
from workloads.train.models.loss import hf_head, install_loss_forward
from workloads.train.testing import TINY_LLAMA, cpu_run, decoder_shape, process_group

SHAPE = decoder_shape(
    hidden=32, intermediate=64, layers=2, heads=2, kv_heads=1, positions=64, vocab=300, head_dim=16
)


def _hf_config(family: str) -> Any:
    import transformers

    extra: dict[str, dict[str, Any]] = {
        "llama": {},
        "qwen2": {"tie_word_embeddings": True},
        "qwen3": {},
        "mistral": {"sliding_window": None},
        "gemma": {},
        # A cap small enough to bend the logits of a random model, and tied embeddings.
        "gemma2": {"final_logit_softcapping": 2.0, "attn_logit_softcapping": None},
        "gemma3_text": {"final_logit_softcapping": 2.0, "tie_word_embeddings": True},
        # Per-layer inputs 8 wide, not 256: Gemma 4's 262,144-row table is 32x smaller.
        "gemma4_text": {
            "final_logit_softcapping": 2.0,
            "global_head_dim": 16,
            "hidden_size_per_layer_input": 8,
        },
        "cohere": {"logit_scale": 0.5},
        "granite": {"logits_scaling": 4.0},
    }
    klass = transformers.AutoConfig.for_model(family).__class__
    return klass(**SHAPE, **extra[family])


def _hf_model(family: str) -> Any:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = _hf_config(family)
    config.initializer_range = 0.2  # logits large enough for the caps and scales to matter
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def _batch(rows: int, seq: int, vocab: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Ids, labels with about a third ignored (counts differ by row) and packed positions."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, seq), generator=generator)
    labels = torch.randint(0, vocab, (rows, seq), generator=generator)
    labels[torch.rand((rows, seq), generator=generator) < 0.35] = IGNORE
    half = seq // 2
    positions = torch.cat([torch.arange(half), torch.arange(seq - half)]).repeat(rows, 1)
    return ids, labels, positions


def _reference_loss(
    model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, positions: Any
) -> torch.Tensor:
    """The unchunked loss of the model's own forward (logits in full, as before)."""
    logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits
    return F.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum"
    )


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    out = {}
    for name, param in model.named_parameters():
        grad = param.grad
        assert grad is not None, name
        out[name] = (grad.full_tensor() if isinstance(grad, DTensor) else grad).detach().clone()
    return out


@pytest.mark.parametrize(
    "family",
    [
        "llama",
        "qwen2",
        "qwen3",
        "mistral",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gemma4_text",
        "cohere",
        "granite",
    ],
)
def test_chunked_loss_equals_the_families_own_logits(family: str) -> None:
    model = _hf_model(family)
    assert hf_head(model) is not None  # the chunked path, not the full-logits fallback
    ids, labels, positions = _batch(2, 12, 300)

    expected = _reference_loss(model, ids, labels, positions)
    expected.backward()
    expected_grads = _grads(model)
    model.zero_grad(set_to_none=True)

    install_loss_forward(model, chunk_tokens=5)  # 24 tokens: 4 chunks of 5 and one of 4
    actual = model(input_ids=ids, position_ids=positions, loss_labels=labels)
    actual.backward()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    for name, grad in _grads(model).items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    # Without the loss labels it is still the model's own forward.
    logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits
    assert logits.shape == (2, 12, 300)


def test_the_head_transform_matters_so_the_test_above_can_fail() -> None:
    model = _hf_model("gemma2")
    hidden = torch.randn(4, 32)
    head = hf_head(model)
    assert head is not None
    assert not torch.allclose(head(hidden), model.lm_head(hidden), atol=1e-3)
    assert head(hidden).abs().max() <= 2.0  # the cap


@contextlib.contextmanager
def _saved_sizes(sizes: list[int]) -> Iterator[None]:
    """Record the size of every tensor autograd keeps for backward."""

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        sizes.append(tensor.numel())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield


def test_no_full_vocabulary_logits_are_kept_for_backward() -> None:
    model = _hf_model("llama")
    ids, labels, positions = _batch(2, 32, 300)
    full = ids.numel() * 300
    unchunked: list[int] = []
    with _saved_sizes(unchunked):
        _reference_loss(model, ids, labels, positions)
    assert max(unchunked) >= full  # the old way keeps [tokens, vocab] logits

    install_loss_forward(model, chunk_tokens=16)
    chunked: list[int] = []
    with _saved_sizes(chunked):
        model(input_ids=ids, position_ids=positions, loss_labels=labels).backward()
    assert max(chunked) < full / 2


def test_gpt_preset_loss_is_its_logits_loss_in_chunks() -> None:
    from workloads.train.models.gpt import GPT, init_weights, model_config

    cfg = model_config("tiny", seq_len=24)
    model = GPT(cfg)
    init_weights(model, cfg, seed=0)
    ids, labels, _ = _batch(2, 24, cfg.vocab_size)
    expected = F.cross_entropy(
        model(ids).flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="sum"
    )
    expected.backward()
    expected_grads = _grads(model)
    model.zero_grad(set_to_none=True)
    model.loss_chunk_tokens = 7
    model.checkpointing = True
    calls = _count_calls(list(model.blocks))
    actual = model(ids, labels)
    actual.backward()
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5)
    for name, grad in _grads(model).items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)
    assert calls == [2] * len(model.blocks)  # forward, and again in backward


def _count_calls(blocks: list[nn.Module]) -> list[int]:
    calls = [0] * len(blocks)
    for index, block in enumerate(blocks):

        def hook(*_: Any, index: int = index) -> None:
            calls[index] += 1

        block.register_forward_pre_hook(hook)  # a recompute may stop before the block ends
    return calls


def _train_config(**overrides: Any) -> TrainConfig:
    run = dict(model=TINY_LLAMA, init="config", seq_len=16, global_batch_size=4, strategy="fsdp2")
    return cpu_run(**(run | overrides))


@pytest.mark.usefixtures("gloo_world1")
@pytest.mark.parametrize("model", ["park:tiny-llama", None])
def test_activation_checkpointing_recomputes_every_block_under_fsdp2(
    model: str | None, tiny_llama_folder: Path
) -> None:
    from workloads.train.distributed.strategies import build_mesh
    from workloads.train.models import modeling

    mesh = build_mesh("cpu", 1)
    grads, counts = [], []
    for checkpointing in (False, True):
        cfg = _train_config(model=model, activation_checkpointing=checkpointing)
        built = modeling.build(
            cfg, device=torch.device("cpu"), mesh=mesh, dtype=torch.float32, restoring=False
        )
        built.module.train()
        inner: Any = built.inner
        blocks = inner.model.layers if model else inner.blocks
        calls = _count_calls(list(blocks))
        ids, labels, positions = _batch(2, 16, 200)
        built.loss(ids, labels, positions if model else None).backward()
        grads.append(_grads(built.inner))
        counts.append(calls)
    blocks = 2 if model else 4  # tiny-llama's layers, the tiny preset's blocks
    assert counts == [[1] * blocks, [2] * blocks]
    for name, grad in grads[1].items():
        torch.testing.assert_close(grad, grads[0][name], rtol=1e-4, atol=1e-6, msg=name)


# ---- two gloo ranks ---------------------------------------------------------------------------


def _gemma_folder(root: Path, tokenizer: Any) -> Path:
    config = _hf_config("gemma2")
    config.vocab_size = len(tokenizer)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(config, name, getattr(tokenizer, name))
    folder = root / "gemma2"
    config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _plain_copy(built: Any, cfg: TrainConfig) -> nn.Module:
    """The same weights in one unwrapped, unsharded model on this process."""
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from workloads.train.models.gpt import GPT, model_config

    if built.source is None:
        plain: nn.Module = GPT(model_config("tiny", seq_len=cfg.seq_len))
    else:
        config = copy.deepcopy(built.source.config)
        config.use_cache = False
        plain = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    weights = {
        name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
        for name, p in built.inner.named_parameters()
    }
    missing, unexpected = plain.load_state_dict(weights, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing), (missing, unexpected)
    return plain


def _distributed_worker(rank: int, meet: str, strategy: str, gemma: str) -> None:
    from workloads.train.distributed.strategies import build_mesh
    from workloads.train.models import modeling
    from workloads.train.run.step import forward_backward

    dist.init_process_group(
        "gloo", init_method=meet, rank=rank, world_size=2, timeout=timedelta(seconds=300)
    )
    slices = 2 if strategy == "hsdp" else 1
    mesh = build_mesh("cpu", 2, slices)
    for model in ("park:tiny-llama", gemma, None):
        cfg = _train_config(
            model=model,
            num_workers=2,
            global_batch_size=8,
            strategy="ddp" if strategy == "ddp" else "fsdp2",
        )
        built = modeling.build(
            cfg, device=torch.device("cpu"), mesh=mesh, dtype=torch.float32, restoring=False
        )
        if model:
            install_loss_forward(built.inner, chunk_tokens=5)  # 64 tokens: 13 chunks
        else:
            gpt: Any = built.inner
            gpt.loss_chunk_tokens = 5
        ids, labels, packed = _batch(8, 16, 200, seed=1)
        positions = packed if model else None  # the presets count positions per row
        reference = _plain_copy(built, cfg)
        if model:
            expected = _reference_loss(reference, ids, labels, positions)
        else:
            logits = reference(ids).flatten(0, 1)
            expected = F.cross_entropy(
                logits, labels.flatten(), ignore_index=IGNORE, reduction="sum"
            )
        (expected / (labels != IGNORE).sum()).backward()
        expected_grads = _grads(reference)

        mine = slice(4 * rank, 4 * rank + 4)
        rows = labels[mine]
        batch = Batch(
            ids[mine],
            rows,
            None if positions is None else positions[mine],
            int((rows != IGNORE).sum()),
        )
        for micro in (4, 1):  # the whole share at once, then four accumulated passes
            built.module.zero_grad(set_to_none=True)
            forward_backward(
                built,
                batch,
                micro_batch=micro,
                world_size=2,
                device=torch.device("cpu"),
                counts_vary=True,
                amp=contextlib.nullcontext(),
            )
            for name, grad in _grads(built.inner).items():
                torch.testing.assert_close(
                    grad,
                    expected_grads[name],
                    rtol=1e-4,
                    atol=1e-6,
                    msg=f"{strategy} {model} micro-batch {micro}: {name}",
                )
    # Both ranks done; no destroy_process_group: the process ends now (run_ranks), taking the
    # group with it, one place fewer to hang.
    dist.barrier()


@pytest.mark.torch
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2", "hsdp"])
def test_accumulated_micro_batches_on_two_ranks_give_one_device_gradients(
    strategy: str, tmp_path: Path, tiny_llama_folder: Path, tiny_tokenizer: Any
) -> None:
    """DDP (loss inside its forward, no_sync), FSDP2 (head chunks inside the root's forward)
    and HSDP on two gloo ranks, one pass or four accumulated micro-batches, each with the
    chunked loss: the gradients of one plain model on the whole global batch."""
    gemma = _gemma_folder(tmp_path, tiny_tokenizer)
    run_ranks(_distributed_worker, (rendezvous(tmp_path), strategy, str(gemma)))


def test_micro_batches_split_rows_and_keep_counts() -> None:
    from workloads.train.run.step import micro_batches

    ids, labels, positions = _batch(4, 8, 50)
    batch = Batch(ids, labels, positions, int((labels != IGNORE).sum()))
    parts = micro_batches(batch, 2)
    assert [p.input_ids.shape for p in parts] == [torch.Size([2, 8])] * 2
    assert sum(p.n_targets for p in parts) == batch.n_targets
    assert torch.equal(torch.cat([p.position_ids for p in parts]), positions)  # type: ignore[misc]
    assert micro_batches(batch, 4) == [batch]
    with pytest.raises(ValueError, match="does not divide"):
        micro_batches(batch, 3)


def test_sdpa_backends_put_the_tpu_flash_kernel_first(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.nn.attention import SDPBackend

    from workloads.train.distributed.strategies import sdpa_backends

    before = torch._C._get_sdp_priority_order()
    with sdpa_backends("cpu"):  # CPU and GPU: PyTorch's own choice, untouched
        assert torch._C._get_sdp_priority_order() == before
        assert torch.backends.cuda.mem_efficient_sdp_enabled()
    with sdpa_backends("tpu"):
        order = torch._C._get_sdp_priority_order()
        first = [SDPBackend.FLASH_ATTENTION, SDPBackend.OVERRIDEABLE, SDPBackend.MATH]
        assert order[:3] == [int(b.value) for b in first]
        assert not torch.backends.cuda.mem_efficient_sdp_enabled()
    monkeypatch.setenv("PARK_TPU_SDPA_BACKENDS", "overrideable,math")
    with sdpa_backends("tpu"):
        assert not torch.backends.cuda.flash_sdp_enabled()
    monkeypatch.setenv("PARK_TPU_SDPA_BACKENDS", "splash")
    with pytest.raises(ValueError, match="PARK_TPU_SDPA_BACKENDS: SPLASH"):
        sdpa_backends("tpu")


@pytest.mark.torch  # eight training steps
def test_loop_with_micro_batches_learns_as_without(tmp_path: Path) -> None:
    """Same losses, step by step, whether a step runs as one pass or as four."""
    from workloads.train.distributed.runenv import LocalEnv
    from workloads.train.run.loop import train

    run = dict(seq_len=32, global_batch_size=8, steps=4, report_every=1, checkpoint_every=0)
    base = cpu_run(**run, model_size="tiny", lr=1e-2, warmup_steps=1)
    losses = []
    for micro in (None, 2):
        with process_group():
            env = LocalEnv(tmp_path / f"micro-{micro}")
            train(replace(base, micro_batch_size=micro), env)
        losses.append([r["loss"] for r in env.reports])
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    assert losses[0][-1] < losses[0][0]
