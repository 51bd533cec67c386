"""FP32 numerics and the weight layout for rollouts on vllm-torchtpu, without the package: the
patch table against the names read in its source (tests/data/vllm_torchtpu_source.json), the
replacement math against torch's own fp32 log-softmax and against the engine's bf16 math as read,
the sampling-noise bias the patch removes, and the refusal of a bare ``load_weights`` into
transposed parameters. Nothing here imports vLLM (the fast tier); the patching itself, on stand-in
classes and vLLM's real reload, is in test_rl_engine_weights.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from workloads.rl import engine_weights, tpu_patches

RECORDED = json.loads(
    (Path(__file__).parents[1] / "data" / "vllm_torchtpu_source.json").read_text()
)


def test_the_patch_table_targets_exactly_the_names_read_in_the_source() -> None:
    methods = RECORDED["methods"]
    assert {f"{p.module}.{p.cls}.{p.method}" for p in tpu_patches.PATCHES} == set(methods)
    for patch in tpu_patches.PATCHES:
        read = methods[f"{patch.module}.{patch.cls}.{patch.method}"]
        assert list(patch.params) == read["params"]
        assert f'backend="{tpu_patches.COMPILE_BACKEND}"' in read["decorator"]
    assert tpu_patches.SOURCE["commit"] == RECORDED["commit"]
    # verl's patch expects the same parameters of the same method
    sample = next(p for p in tpu_patches.PATCHES if p.method == "sample_from_logits")
    assert list(sample.params) == RECORDED["verl_plugin"]["sample_from_logits_expected_params"]
    flipped = RECORDED["attributes"][
        "vllm_torchtpu.layers.adapter.linear_common.WEIGHT_FLIPPED_ATTR"
    ]
    assert flipped["value"] == engine_weights.FLIPPED_ATTR


def _engine_bf16_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """The engine's math as read (recorded "math"): normalised in the logits' dtype, then cast."""
    return (logits.gather(-1, ids) - torch.logsumexp(logits, -1, keepdim=True)).to(torch.float32)


def test_fp32_logprobs_are_torchs_fp32_log_softmax_and_the_engines_bf16_are_not() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(8, 32000, generator=generator) * 4).to(torch.bfloat16)
    ids = torch.randint(0, 32000, (8, 1), generator=generator)
    out_ids, logprobs, ranks = tpu_patches.fp32_gather_logprobs(logits, ids, max_logprobs=5)

    want = torch.log_softmax(logits.float(), dim=-1)
    assert logprobs.dtype == torch.float32 and out_ids.dtype == torch.int32
    assert torch.equal(logprobs[:, :1], want.gather(-1, ids))
    assert torch.equal(out_ids[:, :1].long(), ids)
    top = torch.topk(logits, 5, dim=-1).indices
    assert torch.equal(out_ids[:, 1:].long(), top)
    assert torch.equal(logprobs[:, 1:], want.gather(-1, top))
    assert torch.equal(ranks, (logits >= logits.gather(-1, ids)).sum(-1, dtype=torch.int32))

    engine = _engine_bf16_logprobs(logits, ids)
    error = (engine - want.gather(-1, ids)).abs().max().item()
    assert error > 0.01, f"bf16 normalisation should lose digits here, lost only {error}"


def _gumbel_max_tail_share(u: torch.Tensor, logits: torch.Tensor) -> float:
    """How often the engine's Gumbel-max draw (recorded "math", temperature 1) picks token 1."""
    clamped = torch.clamp(u, min=torch.finfo(u.dtype).tiny, max=1.0 - torch.finfo(u.dtype).eps)
    noisy = logits + -torch.log(-torch.log(clamped))
    return float((noisy.argmax(-1) == 1).float().mean())


def test_bf16_sampling_noise_starves_the_tail_and_fp32_noise_does_not() -> None:
    logits = torch.tensor([0.0, -7.0])
    want = torch.softmax(logits, 0)[1].item()  # ~9.1e-4
    draws = 400_000
    generator = torch.Generator().manual_seed(0)
    bf16 = torch.rand((draws, 2), dtype=torch.bfloat16, generator=generator)
    fp32 = tpu_patches.fp32_uniform(bf16, generator)
    assert fp32.dtype == torch.float32 and fp32.shape == bf16.shape
    assert abs(_gumbel_max_tail_share(fp32, logits) - want) < 5 * (want / draws) ** 0.5
    assert _gumbel_max_tail_share(bf16, logits) < want / 3  # ~1.7e-4 with this seed


def test_on_this_machine_the_engine_is_absent_and_nothing_is_patched(monkeypatch) -> None:
    monkeypatch.setattr(tpu_patches, "_report", None)
    assert not tpu_patches.engine_present()
    report = tpu_patches.apply()
    assert report.engine == "vllm" and report.applied == [] and report.refused == []
    assert "no patches" in report.line()


class _FlippedLinear(torch.nn.Module):
    """A layer as vllm-torchtpu leaves it after loading: weight [n_in, n_out], marked."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight.t().contiguous(), requires_grad=False)
        setattr(self, engine_weights.FLIPPED_ATTR, True)


class _Model(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.o_proj = _FlippedLinear(weight)
        self.loaded: list[str] = []

    def load_weights(self, weights: Any) -> None:
        for name, tensor in weights:
            self.loaded.append(name)
            self.get_parameter(name).data.copy_(tensor)  # what a bare load would do


class _TpuRunner:
    """Stands in for vllm-torchtpu's runner (its module is the engine's)."""

    __module__ = "vllm_torchtpu.runner.tpu_runner"

    def __init__(self, model: _Model) -> None:
        self.model = model


def test_a_bare_load_into_transposed_parameters_is_refused_naming_the_engine() -> None:
    square = torch.arange(16.0).reshape(4, 4)
    model = _Model(square)
    worker = SimpleNamespace(model_runner=_TpuRunner(model))
    new = torch.arange(16.0).reshape(4, 4) + 100
    with pytest.raises(engine_weights.LayoutRefused, match=r"vllm-torchtpu.*o_proj.*transposed"):
        engine_weights.load_into(worker, iter([("o_proj.weight", new)]))
    assert model.loaded == []  # nothing written
    assert torch.equal(model.o_proj.weight, square.t())
