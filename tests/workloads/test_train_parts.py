"""The loop's parts on their own: model, data, metrics, learning-rate schedule."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from workloads.train.distributed.strategies import compute_dtype, lr_at
from workloads.train.inputs.batches import DataError, TokenBatches, make_batches, open_shards
from workloads.train.models.gpt import (
    GPT,
    PRESETS,
    count_params,
    init_weights,
    model_config,
    train_flops_per_token,
)
from workloads.train.run.metrics import format_line, mfu, parse_line, peak_tflops

# ---- model ------------------------------------------------------------------------------------


def test_tiny_is_a_few_hundred_thousand_parameters() -> None:
    assert 100_000 < count_params(PRESETS["tiny"]) < 500_000


@pytest.mark.parametrize(
    ("size", "low", "high"),
    [("gpt2-small", 120e6, 170e6), ("gpt2-medium", 350e6, 420e6), ("1b", 0.9e9, 1.2e9)],
)
def test_presets_have_their_advertised_size(size: str, low: float, high: float) -> None:
    assert low < count_params(PRESETS[size]) < high


def test_flops_per_token_follows_6n_plus_attention() -> None:
    cfg = PRESETS["gpt2-small"]
    n = count_params(cfg, non_embedding=True)
    assert n == count_params(cfg) - cfg.vocab_size * cfg.d_model - cfg.block_size * cfg.d_model
    assert train_flops_per_token(cfg, 1024) == 6 * n + 12 * 12 * 768 * 1024


def test_model_is_causal() -> None:
    cfg = model_config("tiny", seq_len=16)
    model = GPT(cfg)
    init_weights(model, cfg, seed=0)
    tokens = torch.randint(0, cfg.vocab_size, (2, 16))
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % cfg.vocab_size
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    assert a.shape == (2, 16, cfg.vocab_size)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_init_is_deterministic_and_untrained_loss_is_ln_vocab() -> None:
    cfg = model_config("tiny", seq_len=32)
    models = [GPT(cfg), GPT(cfg), GPT(cfg)]
    for model, seed in zip(models, (1, 1, 2), strict=True):
        init_weights(model, cfg, seed=seed)
    same = [
        torch.equal(p, q)
        for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True)
    ]
    assert all(same)
    assert not torch.equal(models[0].tok_emb.weight, models[2].tok_emb.weight)
    assert torch.equal(models[0].norm_f.weight, torch.ones(cfg.d_model))
    tokens = torch.randint(0, cfg.vocab_size, (4, 32))
    with torch.no_grad():
        logits = models[0](tokens)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.05


def test_model_config_overrides() -> None:
    cfg = model_config("gpt2-small", vocab_size=1000, seq_len=256)
    assert (cfg.vocab_size, cfg.block_size, cfg.n_layer) == (1000, 256, 12)
    with pytest.raises(ValueError, match="unknown model size"):
        model_config("huge")


# ---- data -------------------------------------------------------------------------------------


def test_batches_are_a_pure_function_of_seed_step_rank() -> None:
    def make(rank: int) -> TokenBatches:
        return make_batches(
            "synthetic", vocab_size=256, seq_len=16, batch_size=3, seed=5, rank=rank
        )

    x1, y1 = make(0).batch(7)
    x2, y2 = make(0).batch(7)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == y1.shape == (3, 16)
    assert torch.equal(x1[:, 1:], y1[:, :-1]), "targets are inputs shifted by one"
    assert not torch.equal(make(1).batch(7)[0], x1)
    assert not torch.equal(make(0).batch(8)[0], x1)


def test_synthetic_tokens_are_mostly_predictable() -> None:
    x, y = make_batches(
        "synthetic", vocab_size=256, seq_len=64, batch_size=32, seed=0, rank=0
    ).batch(1)
    follows = (y == (x * 5 + 3) % 256).float().mean().item()
    assert 0.85 < follows < 0.95
    assert int(x.max()) < 256


def test_token_files_bin_npy_txt_and_folders(tmp_path: Path) -> None:
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "a.bin")
    np.save(tmp_path / "b.npy", np.arange(2000, 3000, dtype=np.int32))
    (tmp_path / "c.txt").write_text("hello world " * 50)

    assert [len(s) for s in open_shards(str(tmp_path))] == [1000, 1000, 600]
    x, y = make_batches(
        str(tmp_path / "a.bin"), vocab_size=1000, seq_len=8, batch_size=4, seed=0, rank=0
    ).batch(3)
    assert torch.equal(y, x + 1), "windows of a counting sequence"
    text = make_batches(
        str(tmp_path / "c.txt"), vocab_size=256, seq_len=8, batch_size=2, seed=0, rank=0
    ).batch(1)[0]
    assert set(text.flatten().tolist()) <= set(b"helo wrd")


def test_remote_files_are_copied_once_per_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gs:// path, through pyarrow's local filesystem (same code, another URI scheme)."""
    from workloads.train.inputs import batches

    remote = tmp_path / "bucket" / "tokens"
    remote.mkdir(parents=True)
    np.arange(500, dtype=np.uint16).tofile(remote / "part-0.bin")
    np.arange(500, 900, dtype=np.uint16).tofile(remote / "part-1.bin")
    (remote / "README.md").write_text("not tokens")
    monkeypatch.setattr(batches, "CACHE_DIR", tmp_path / "cache")

    first = batches._cache_gcs(f"file://{remote}")
    assert [p.name for p in first] == ["00000-part-0.bin", "00001-part-1.bin"]
    assert np.array_equal(np.fromfile(first[1], dtype=np.uint16), np.arange(500, 900))
    stamp = first[0].stat().st_mtime_ns
    assert batches._cache_gcs(f"file://{remote}") == first
    assert first[0].stat().st_mtime_ns == stamp, "copied again"


def test_data_errors_are_clear(tmp_path: Path) -> None:
    np.arange(70_000, 70_100, dtype=np.int64).astype(np.uint16).tofile(tmp_path / "big.bin")
    with pytest.raises(DataError, match="beyond the model's vocabulary"):
        make_batches(
            str(tmp_path / "big.bin"), vocab_size=256, seq_len=8, batch_size=2, seed=0, rank=0
        ).batch(1)
    with pytest.raises(DataError, match="no such file"):
        open_shards(str(tmp_path / "missing.bin"))
    with pytest.raises(DataError, match="shorter than seq_len"):
        make_batches(
            str(tmp_path / "big.bin"), vocab_size=70_000, seq_len=500, batch_size=2, seed=0, rank=0
        )


# ---- metrics ----------------------------------------------------------------------------------


def test_mfu_and_peaks() -> None:
    assert peak_tflops("TPU-V6E") is None  # the catalog's, by --peak-tflops-per-device
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("cpu") is None
    # 1e12 FLOP per token at 918 tokens/s on one v6e chip is 100%.
    assert mfu(1e12, 918.0, 1, 918.0) == pytest.approx(1.0)
    assert mfu(1e12, 918.0, 2, 918.0) == pytest.approx(0.5)
    assert mfu(1e12, 918.0, 1, None) is None


def test_progress_lines_parse_behind_rays_prefix() -> None:
    line = format_line("PARK_METRICS ", {"step": 3, "loss": 1.5, "mfu": None})
    assert line.startswith("PARK_METRICS {")
    assert parse_line(line) == ("PARK_METRICS", {"step": 3, "loss": 1.5, "mfu": None})
    assert parse_line(f"(RayTrainWorker pid=12, ip=10.0.0.1) {line}") == parse_line(line)
    assert parse_line('PARK_RESULT {"final_step": 3}') == ("PARK_RESULT", {"final_step": 3})
    assert parse_line("loss went down") is None


# ---- schedule and precision -------------------------------------------------------------------


def test_lr_warms_up_then_decays_to_a_tenth() -> None:
    lrs = [lr_at(s, base_lr=1.0, warmup_steps=10, total_steps=100) for s in range(1, 101)]
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))
    assert lrs[-1] == pytest.approx(0.1)


def test_linear_and_constant_schedules() -> None:
    linear = [
        lr_at(s, base_lr=1.0, warmup_steps=0, total_steps=10, min_ratio=0.0, schedule="linear")
        for s in range(1, 11)
    ]
    assert linear[4] == pytest.approx(0.5) and linear[-1] == pytest.approx(0.0)
    assert lr_at(50, base_lr=2.0, warmup_steps=10, total_steps=100, schedule="constant") == 2.0


def test_bf16_on_accelerators_fp32_on_cpu() -> None:
    assert compute_dtype("auto", "tpu") == torch.bfloat16
    assert compute_dtype("auto", "cpu") == torch.float32
    assert compute_dtype("bf16", "cpu") == torch.bfloat16
    assert compute_dtype("fp32", "tpu") == torch.float32
