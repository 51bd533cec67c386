"""The serving fit per chip: usable HBM as the runtime reports it, the engine's reserve, expert
weights as vLLM places them, and the rules that refuse what does not fit (with what would).

The KV arithmetic itself is held against vLLM's classes in test_engine_vllm.py.
"""

from __future__ import annotations

import io
import json
import math

import pytest
from rich.console import Console

from infra import catalog, engine, model_facts
from infra.stack import from_values
from infra.tools.report import fit_table
from tests.conftest import ROOT
from tests.infra.serving_stack import serving_values
from tests.infra.stack_problems import problems_of

GIB = 1024**3
HOST = catalog.lookup("ct6e-standard-8t", "2x4")
SLICE = catalog.lookup("ct6e-standard-4t", "4x4")


def _stack(pool: str, **model) -> dict:
    return serving_values(pool, {"name": "m", **model})


def _facts(repo: str) -> model_facts.ModelFacts:
    facts = model_facts.from_catalogue(repo)
    assert facts is not None
    return facts


def test_usable_is_the_runtimes_hbm_times_utilization_less_weights_and_reserve():
    """Qwen3-30B-A3B at TP 16 on v6e: 33,550,237,696 B x 0.92 = 28.75 GiB usable; weights
    30,532,122,624 x 2 / 16; the reserve: one 2048-token batch, 256 x 151,936 fp32 logits
    twice, 0.5 GiB; each chip's single KV head pads to a bf16 pair: 2 x 128 x 2 B x 48
    layers = 24,576 B per token, 8192 tokens in 32 blocks of 256 = 192 MiB per sequence."""
    fitted = engine.fit(_facts("Qwen/Qwen3-30B-A3B"), SLICE, 16, 8192)
    usable = 33_550_237_696 * 0.92
    assert fitted.usable_gib == pytest.approx(usable / GIB) == pytest.approx(28.75, abs=0.01)
    assert fitted.weights_gib == pytest.approx(30_532_122_624 * 2 / 16 / GIB)
    assert fitted.sampler_gib == pytest.approx(256 * 151_936 * 4 * 2 / GIB)
    assert fitted.margin_gib == pytest.approx(0.5)
    assert fitted.max_num_batched_tokens == 2048 and fitted.block_size == 256
    assert fitted.kv_bytes_per_token == 24_576
    assert fitted.kv_gib_per_sequence == pytest.approx(192 / 1024)
    free = usable - (fitted.weights_gib + fitted.reserve_gib) * GIB
    assert fitted.sequences == int(free // (24_576 * 256)) // 32
    assert fitted.kv_cache_gib == pytest.approx(free / GIB)


def test_the_reserve_grows_with_the_batch_and_the_sequences_shrink():
    facts = _facts("Qwen/Qwen3-8B")
    small = engine.fit_served(facts, HOST, 8, 8192, {"max_num_batched_tokens": 512})
    large = engine.fit_served(facts, HOST, 8, 8192, {"max_num_batched_tokens": 8192})
    assert large.activations_gib == pytest.approx(16 * small.activations_gib)
    assert large.reserve_gib > small.reserve_gib and large.sequences < small.sequences


def test_engine_kwargs_the_fit_reads():
    settings = engine.EngineSettings.from_engine_kwargs(
        {
            "gpu_memory_utilization": 0.8,
            "max_num_seqs": 64,
            "block_size": 128,
            "kv_cache_dtype": "fp8",
            "disable_hybrid_kv_cache_manager": True,
            "async_scheduling": False,
        }
    )
    assert (settings.memory_utilization, settings.max_num_seqs, settings.block_size) == (
        0.8,
        64,
        128,
    )
    assert not settings.hybrid_kv_cache and not settings.async_scheduling
    assert settings.batched_tokens(8192) == 2048  # the default, chunked prefill on
    no_chunks = engine.EngineSettings.from_engine_kwargs({"enable_chunked_prefill": False})
    assert no_chunks.batched_tokens(8192) == 8192  # EngineArgs: at least max_model_len


def test_expert_parallel_charges_whole_experts_per_chip():
    """Mixtral's 8 experts at EP 16: the heaviest chip holds one whole expert (5.6B
    parameters), twice what params / 16 charged."""
    facts = _facts("mistralai/Mixtral-8x7B-Instruct-v0.1")
    ep = engine.fit(facts, SLICE, 16, 4096, expert_parallel=True)
    split = engine.fit(facts, SLICE, 16, 4096)
    dense = (facts.params or 0) - facts.expert_params
    assert ep.weights_gib == pytest.approx((dense * 2 / 16 + facts.expert_params * 2 / 8) / GIB)
    assert ep.weights_gib > 1.9 * split.weights_gib
    assert (ep.expert_parallel, ep.experts_per_chip) == (16, 1)
    prod = engine.fit(_facts("Qwen/Qwen3-30B-A3B"), SLICE, 16, 8192, expert_parallel=True)
    assert prod.experts_per_chip == 8  # 128 / 16: exactly params / TP


def test_expert_params_are_the_experts_transformers_builds():
    """expert_params (read from config.json) against the parameters of transformers' expert
    modules, built on the meta device from the committed configs."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    configs = json.loads((ROOT / "infra/data/models/configs.json").read_text())["models"]
    for repo in (
        "Qwen/Qwen3-30B-A3B",
        "deepseek-ai/DeepSeek-V2-Lite",
        "mistralai/Mixtral-8x7B-Instruct-v0.1",
    ):
        config = dict(configs[repo]["config"])
        built = transformers.CONFIG_MAPPING[config.pop("model_type")](**config)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(built)
        experts = sum(
            p.numel()
            for name, p in model.named_parameters()
            if ".experts." in name and "shared_expert" not in name
        )
        assert _facts(repo).expert_params == experts, repo


def test_mixtral_at_ep_16_is_refused_and_names_what_is_allowed():
    found = problems_of(
        _stack(
            "slice",
            source="mistralai/Mixtral-8x7B-Instruct-v0.1",
            tensorParallelSize=16,
            enableExpertParallel=True,
        )
    )
    message = found["park:serving.models[0].enableExpertParallel"]
    assert "tensorParallelSize 16" in message and "EP 16" in message and "8 experts" in message
    assert "at most 8" in message and "enableExpertParallel false" in message


def test_prods_moe_at_ep_16_passes():
    values = _stack(
        "slice",
        source="Qwen/Qwen3-30B-A3B-Instruct-2507",
        tensorParallelSize=16,
        enableExpertParallel=True,
    )
    plan = from_values(values, "dev")
    assert plan.serving and plan.serving.models[0].fit and plan.serving.models[0].fit.fits


def test_a_misfit_names_the_budget_and_a_context_that_fits():
    """Llama-3.1-70B at TP 8 with gpu_memory_utilization 0.7 at 131072 tokens: the weights and
    reserve leave less than one sequence's KV; the advice is a context that does fit."""
    values = _stack(
        "host",
        source="meta-llama/Llama-3.1-70B-Instruct",
        tensorParallelSize=8,
        maxModelLen=131072,
        engineKwargs={"gpu_memory_utilization": 0.7},
    )
    values["park:hfToken"] = "hf_x"
    message = problems_of(values)["park:serving.models[0].maxModelLen"]
    assert "31.25 GiB as the runtime reports it" in message and "engine reserve" in message
    shorter = int(message.split("maxModelLen ")[1].split(" fits")[0])
    facts = _facts("meta-llama/Llama-3.1-70B")
    settings = engine.EngineSettings(memory_utilization=0.7)
    assert engine.fit(facts, HOST, 8, shorter, settings=settings).fits
    assert not engine.fit(facts, HOST, 8, shorter + 256, settings=settings).fits
    assert shorter < 131072


def test_a_model_too_big_for_the_slice_points_at_a_larger_one():
    """Qwen3-235B-A22B at TP 16 leaves under half a GiB per chip past its weights: a
    40960-token context does not fit; a 4x8 slice (TP 32) holds it."""
    values = _stack(
        "slice", source="Qwen/Qwen3-235B-A22B", tensorParallelSize=16, maxModelLen=40960
    )
    message = problems_of(values)["park:serving.models[0].maxModelLen"]
    assert "a larger slice fits it: ct6e-standard-4t 4x8 (TP 32)" in message
    facts = _facts("Qwen/Qwen3-235B-A22B")
    assert engine.fit(facts, catalog.lookup("ct6e-standard-4t", "4x8"), 32, 40960).fits


def test_gemma_4_e2b_caches_only_its_own_layers():
    fitted = engine.fit(_facts("google/gemma-4-E2B-it"), HOST, 1, 8192)
    assert fitted.cache_layers == 15  # 35 layers, the last 20 reuse earlier layers' KV
    # 12 sliding layers (1 KV head x 256) and 3 full (1 x 512), K and V in bf16; on TPU every
    # layer's page is padded to the widest (infra.kv_cache._tpu_uniform_page)
    assert fitted.kv_bytes_per_token == 15 * 2 * 512 * 2


def test_the_fit_table_shows_usable_reserve_and_kv():
    values = _stack("host", source="google/gemma-3-27b-it", tensorParallelSize=8)
    values["park:hfToken"] = "hf_x"
    plan = from_values(values, "dev")
    table = fit_table(plan)
    assert table is not None
    out = Console(file=io.StringIO(), width=250)
    out.print(table)
    text = out.file.getvalue()  # type: ignore[attr-defined]
    fitted = plan.serving.models[0].fit  # type: ignore[union-attr]
    assert "31.25 GiB" in text and "reserve" in text and "KV cache" in text
    assert f"{fitted.reserve_gib:.2f} GiB" in text and f"{fitted.kv_cache_gib:.1f} GiB" in text
    assert math.isclose(fitted.usable_gib, 31.25 * 0.92, abs_tol=0.01)
