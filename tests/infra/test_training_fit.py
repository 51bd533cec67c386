"""The training memory model's own rules, without running a step (fast).

The shapes it reads from ModelFacts are held against transformers' own models (built on meta
from the committed config.json files); what fits is held against the hardware's HBM for the
cases the issue names (DDP of an 8B model or FSDP2 of a 32B model on 8 v6e chips refused, the
shipped stacks accepted). The proof against PyTorch's accounting is test_training_fit_torch.py.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest

from infra import catalog, model_facts, model_lookup
from infra.resolve import training_fit
from infra.resolve.training_fit import GIB, best_micro_batch, describe, estimate, shapes

V6E = catalog.GENERATIONS["v6e"].runtime_hbm_bytes_per_device  # 31.25 GiB


def facts(repo: str) -> model_facts.ModelFacts:
    found = model_lookup.lookup(repo).facts
    assert found is not None, repo
    return found


def on_v6e(chips: int, strategy: str = "fsdp2", ac: bool = False, **kw: Any) -> dict[str, Any]:
    """The fit's arguments for ``chips`` v6e chips of one slice, sharded over all of them."""
    sharded = dict(strategy=strategy, world_size=chips, shard_size=chips, usable_bytes=V6E)
    return sharded | {"activation_checkpointing": ac} | kw


def fsdp(
    repo: str, *, chips: int, per_chip: int, seq_len: int, ac: bool = False, **kw: Any
) -> training_fit.TrainingFit:
    """The best micro-batch of ``repo`` on ``chips`` v6e chips (FSDP2 unless ``strategy=``)."""
    strategy = kw.pop("strategy", "fsdp2")
    settings = on_v6e(chips, strategy, ac, seq_len=seq_len, **kw)
    return best_micro_batch(facts(repo), per_chip_batch=per_chip, **settings)


@pytest.mark.parametrize(
    "repo",
    ["Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B", "meta-llama/Llama-3.2-1B", "google/gemma-3-1b-it"],
)
def test_block_and_root_sizes_are_transformers_own(repo: str) -> None:
    """A decoder block's and the root's parameter counts, from ModelFacts, against the model
    transformers builds from the same config.json."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.infra.training_fit_harness import text_config
    from workloads.train.models import hf

    transformers.logging.set_verbosity_error()
    with warnings.catch_warnings(), torch.device("meta"):
        warnings.simplefilter("ignore")
        model = hf.meta_model(text_config(repo))
    block = sum(p.numel() for p in hf.block_modules(model)[0].parameters())
    total = sum(p.numel() for p in model.parameters())
    s = shapes(facts(repo))
    assert s.block == block
    assert s.root == total - s.layers * block


def test_without_the_mlp_width_blocks_share_what_the_embedding_leaves() -> None:
    known = facts("Qwen/Qwen3-1.7B")
    guessed = shapes(dataclasses.replace(known, intermediate_size=None))
    assert abs(guessed.block - shapes(known).block) / shapes(known).block < 0.01


def test_the_shipped_stacks_fit_and_the_docstring_says_by_how_much() -> None:
    """dev and prod as their stack files plan them (infra.resolve), as the module docstring
    records them; dev's 4 sequences fit only because the stack recomputes activations."""
    from infra.stack import from_file
    from tests.conftest import ROOT

    doc = " ".join((training_fit.__doc__ or "").split())
    for name in ("dev", "prod"):
        run = from_file(ROOT / "stacks" / f"Pulumi.{name}.yaml").training
        assert run is not None and run.fit is not None
        assert run.fit.fits
        assert describe(run.fit) in doc
    assert not fsdp("Qwen/Qwen3-1.7B", chips=8, per_chip=4, seq_len=2048, pinned=4).fits


def test_ddp_of_an_8b_model_on_8_chips_is_refused_at_any_micro_batch() -> None:
    fit = fsdp("Qwen/Qwen3-8B", chips=8, per_chip=1, seq_len=512, strategy="ddp")
    assert not fit.fits
    assert fit.states_bytes > 16 * 8e9  # 16+ bytes a parameter, whole on the chip


def test_fsdp2_of_a_32b_model_on_8_chips_is_refused() -> None:
    fit = fsdp("Qwen/Qwen3-32B", chips=8, per_chip=1, seq_len=1024, ac=True)
    assert not fit.fits
    assert fit.micro_batch == 1  # the smallest tried, so the caller can say by how much


def test_best_micro_batch_is_the_largest_divisor_that_fits_or_the_pin() -> None:
    best = fsdp("Qwen/Qwen3-1.7B", chips=8, per_chip=12, seq_len=2048)
    assert 12 % best.micro_batch == 0 and best.fits
    larger = [m for m in (12, 6, 4, 3, 2) if m > best.micro_batch]
    for micro in larger:
        assert not fsdp("Qwen/Qwen3-1.7B", chips=8, per_chip=12, seq_len=2048, pinned=micro).fits
    pinned = fsdp("Qwen/Qwen3-1.7B", chips=8, per_chip=12, seq_len=2048, pinned=3)
    assert (pinned.micro_batch, pinned.accumulation_steps) == (3, 4)


def _one(**overrides: Any) -> training_fit.TrainingFit:
    settings = on_v6e(8, micro_batch=2, accumulation_steps=1, seq_len=2048) | overrides
    return estimate(facts("Qwen/Qwen3-1.7B"), **settings)


def test_what_each_setting_changes() -> None:
    base = _one()
    assert _one(activation_checkpointing=True).activations_bytes < base.activations_bytes / 5
    assert _one(shard_size=16, world_size=16).states_bytes < base.states_bytes
    assert _one(strategy="ddp").states_bytes > 4 * base.states_bytes
    # the loss's logits depend on the chunk, not on the micro-batch...
    assert _one(micro_batch=4).logits_bytes == base.logits_bytes
    # ...and without chunks they are the whole micro-batch's
    assert _one(loss_chunk_tokens=None).logits_bytes > 3 * base.logits_bytes
    # accumulating keeps the sharded fp32 gradients between micro-batches
    assert _one(accumulation_steps=2).grads_bytes > base.grads_bytes
    assert base.total_bytes == base.peak_bytes + base.reserve_bytes
    assert base.reserve_bytes == int(V6E * training_fit.RUNTIME_RESERVE_FRACTION)
    assert 2 * GIB < base.reserve_bytes < 3 * GIB


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="strategy 'zero3'"):
        _one(strategy="zero3")


# ---- the benchmark's GPU section: its pure parts (it runs only where CUDA is) ------------------


def test_gpu_memory_section_measures_each_shipped_stack_as_planned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torch")
    from benchmarks import train_memory, train_overhead
    from infra.stack import from_file
    from tests.conftest import ROOT

    dev = train_memory.gpu_memory_settings("dev")
    run = from_file(ROOT / "stacks" / "Pulumi.dev.yaml").training
    assert run is not None and run.fit is not None
    assert (dev["model"], dev["strategy"]) == (run.spec.model, run.spec.strategy)
    assert (dev["world_size"], dev["micro_batch"]) == (run.workers, run.micro_batch)
    assert dev["accumulation_steps"] == run.accumulation_steps
    assert dev["activation_checkpointing"] == run.spec.activation_checkpointing
    assert dev["estimate_peak_gib"] == round(run.fit.peak_bytes / GIB, 2)
    prod = train_memory.gpu_memory_settings("prod")
    assert (prod["world_size"], prod["seq_len"]) == (16, 4096)
    record = train_memory.gpu_memory_record(dev, int(dev["estimate_peak_gib"] * GIB / 2))
    assert record["estimate_over_measured"] == pytest.approx(2.0, abs=0.01)
    # without CUDA the section says so and runs nothing (no Ray either)
    monkeypatch.setattr(train_memory.torch.cuda, "is_available", lambda: False)
    assert train_overhead.main(["--gpu-memory"]) == {"gpu_memory": "no GPU on this machine"}
