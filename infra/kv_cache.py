"""The KV cache as vLLM reserves it for one request, per chip: the arithmetic of its spec classes.

Read in vLLM 0.29.0 (what vllm-torchtpu 0.29.0 ships) and checked unchanged in the installed
vLLM 0.32 (vllm/v1/kv_cache_interface.py, vllm/v1/core/kv_cache_utils.py):

- a layer's spec holds `max(1, kv_heads // TP)` heads per chip (vllm/model_executor/models/*);
  a page is `block_size` tokens of K and V (`AttentionSpec.page_size_bytes`); MLA stores one
  latent of kv_lora_rank + qk_rope_head_dim per token, no V (`MLAAttentionSpec`);
- full attention reserves `cdiv(max_model_len, block_size)` pages per request
  (`FullAttentionSpec.max_memory_usage_bytes`); a sliding layer
  `cdiv(min(window - 1 + in_flight_tokens, max_model_len), block_size) + 1`
  (`SlidingWindowSpec.max_admission_blocks_per_request`), where in_flight_tokens is
  `VllmConfig.max_in_flight_tokens` = concurrent batches x max_num_batched_tokens: 2 batches
  with async scheduling, which vLLM turns on by default for every executor the TPU engine uses;
- KV-shared layers (`kv_sharing_target_layer_name`, Gemma 3n/4) get no spec and hold nothing;
- a hybrid model (full + sliding layers, `get_kv_cache_groups`): pages are made one size by
  multiplying the smaller pages' block size (`unify_kv_cache_spec_page_size`), then layers are
  split into groups of equal size, padding the last group of a kind
  (`_get_kv_cache_groups_uniform_page_size`: the group size is the smallest kind's layer count,
  or the largest's when that is under 1.5x); one block id spans one page of every layer of a
  group, so a block costs group size x page (`_get_kv_cache_bytes_per_block`, layer-outer
  layouts as on TPU) and a request takes the sum of its groups' blocks
  (`get_max_concurrency_for_kv_cache_config`). With the hybrid manager off
  (`disable_hybrid_kv_cache_manager`) sliding layers hold full context
  (`unify_hybrid_kv_cache_specs`).

The TPU layout (vllm-torchtpu 0.29 `PallasAttentionBackend.get_kv_cache_shape` and
`PallasMLAttentionBackend`, applied by `kv_cache_spec_normalizer.normalize_kv_cache_specs_
for_tpu` as the page's padded size) pads on top: head_dim up to 128 lanes, 2 x KV heads up to
the dtype's 32-bit packing (2 bf16, 4 fp8); head_dim 64 shares the 128 lanes between K and V;
an MLA latent pads to 128; and when layers' pages differ (Gemma 4's 512-wide full-attention
layers beside 256-wide sliding ones) every layer's page is padded to the widest
(`_tpu_uniform_page`). `layout="generic"` gives vLLM's own arithmetic, which the tests hold
against vLLM's classes; the difference between the two is tested on its own.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from infra.model_facts import ModelFacts

Layout = Literal["tpu", "generic"]
TPU_HEAD_ALIGNMENT = 128  # vllm_torchtpu/layers/adapter/attention.py TPU_HEAD_SIZE_ALIGNMENT


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class LayerCache:
    """One kind of cache-holding layer (one vLLM KVCacheSpec) and how many layers have it."""

    kv_heads: int  # per chip
    head_dim: int
    sliding_window: int | None  # None: the layer keeps the whole context
    mla: bool
    count: int

    def bytes_per_token(self, kv_bytes: int, layout: Layout = "tpu") -> int:
        """One token of this layer's K and V on one chip."""
        if self.mla:
            width = self.head_dim if layout == "generic" else _up(self.head_dim, TPU_HEAD_ALIGNMENT)
            return width * kv_bytes
        if layout == "generic":
            return 2 * self.kv_heads * self.head_dim * kv_bytes
        pack = max(1, 4 // kv_bytes)  # 32-bit lanes: 2 bf16 or 4 fp8 values per lane
        if self.head_dim == 64:  # the hd64 kernel shares the 128 lanes between K and V
            return _up(self.kv_heads, pack) * TPU_HEAD_ALIGNMENT * kv_bytes
        return _up(2 * self.kv_heads, pack) * _up(self.head_dim, TPU_HEAD_ALIGNMENT) * kv_bytes


def _up(value: int, multiple: int) -> int:
    return cdiv(value, multiple) * multiple


def layer_caches(facts: ModelFacts, tp: int, *, hybrid: bool = True) -> list[LayerCache]:
    """The model's cache-holding layers by kind, as vLLM's model classes build their specs:
    KV-shared layers hold none; Gemma 4's full-attention layers use global_head_dim (and
    their own KV heads where the config gives them); sliding layers keep a window only with
    the hybrid KV cache manager on."""
    own = facts.layers - facts.kv_shared_layers
    if facts.mla_kv_dim:
        return [LayerCache(1, facts.mla_kv_dim, None, True, own)] if own > 0 else []
    types = facts.layer_types or (
        ("sliding",) * (facts.sliding_layers if facts.sliding_window else 0)
        + ("full",) * (facts.layers - (facts.sliding_layers if facts.sliding_window else 0))
    )
    kinds: Counter[tuple[int, int, int | None]] = Counter()
    for kind in types[:own]:
        if kind == "sliding" and facts.sliding_window:
            heads, head_dim = facts.kv_heads, facts.head_dim
            window = facts.sliding_window if hybrid else None
        else:
            heads = facts.global_kv_heads or facts.kv_heads
            head_dim = facts.global_head_dim or facts.head_dim
            window = None
        kinds[(max(1, heads // tp), head_dim, window)] += 1
    return [LayerCache(h, d, w, False, n) for (h, d, w), n in kinds.items()]


@dataclass(frozen=True)
class KvPlan:
    """What one max_model_len request costs in blocks, and what a block costs, on one chip."""

    bytes_per_token: int  # every cache-holding layer, one token (no block rounding)
    bytes_per_block: int  # one block id: a page of every layer of the widest group
    blocks_per_sequence: int  # summed over the groups
    block_size: int
    groups: int
    padding_layers: int  # layers the grouping adds (vLLM warns "Add N padding layers")

    @property
    def bytes_per_sequence(self) -> int:
        return self.blocks_per_sequence * self.bytes_per_block

    def sequences(self, kv_cache_bytes: int) -> int:
        """max_model_len requests the cache holds at once (vLLM's maximum concurrency)."""
        if kv_cache_bytes <= 0 or not self.blocks_per_sequence:
            return 0
        return (kv_cache_bytes // self.bytes_per_block) // self.blocks_per_sequence


def _blocks(cache: LayerCache, block_size: int, max_model_len: int, in_flight: int) -> int:
    """Blocks one request holds in one layer of this kind (the spec's max_memory_usage)."""
    if cache.sliding_window is None:
        return cdiv(max_model_len, block_size)
    tokens = min(cache.sliding_window - 1 + in_flight, max_model_len)
    return cdiv(tokens, block_size) + 1


def plan(
    caches: list[LayerCache],
    *,
    kv_bytes: int,
    block_size: int,
    max_model_len: int,
    in_flight_tokens: int,
    layout: Layout = "tpu",
) -> KvPlan:
    """vLLM's grouping and per-request blocks for these layers (module docstring)."""
    caches = [c for c in caches if c.count]
    per_token = [c.bytes_per_token(kv_bytes, layout) for c in caches]
    hybrid = len({c.sliding_window for c in caches}) > 1
    if layout == "tpu" and len(set(per_token)) > 1:
        per_token = [_tpu_uniform_page(per_token, hybrid)] * len(per_token)
    total = sum(p * c.count for p, c in zip(per_token, caches, strict=True))
    if not caches:
        return KvPlan(0, 0, 0, block_size, 0, 0)
    if not hybrid:
        # one attention type (UniformTypeKVCacheSpecs or a uniform spec): one group of all
        blocks = _blocks(caches[0], block_size, max_model_len, in_flight_tokens)
        return KvPlan(total, total * block_size, blocks, block_size, 1, 0)
    pages = [p * block_size for p in per_token]
    page = max(pages)
    counts = [c.count for c in caches]
    group_size = min(counts) if max(counts) >= 1.5 * min(counts) else max(counts)
    blocks = groups = padding = 0
    for cache, own_page in zip(caches, pages, strict=True):
        # a smaller page that divides the largest takes a bigger block; else it is padded
        ratio = page // own_page if page % own_page == 0 else 1
        n = cdiv(cache.count, group_size)
        groups += n
        padding += n * group_size - cache.count
        blocks += n * _blocks(cache, block_size * ratio, max_model_len, in_flight_tokens)
    return KvPlan(total, group_size * page, blocks, block_size, groups, padding)


def _tpu_uniform_page(per_token: list[int], hybrid: bool) -> int:
    """vllm-torchtpu 0.29 gives every attention layer one page size when their native pages
    differ (runner/kv_cache_manager.py _update_attention_page_size_padded: every spec's
    page_size_padded is the widest native page, not vLLM's block-size scaling); with the
    hybrid manager, groups whose native pages cannot share one array are budgeted the sum of
    the distinct native pages (_pad_native_attention_regions)."""
    widest = max(per_token)
    if hybrid and any(widest % p for p in per_token):
        return max(widest, sum(set(per_token)))
    return widest


def tpu_block_size(facts: ModelFacts, max_model_len: int, max_num_seqs: int) -> int:
    """The block size vllm-torchtpu 0.29 picks when the stack sets none
    (TpuPlatform.update_block_size_for_backend): the attention backend's page size
    (PallasAttentionBackend.get_page_size: 16 past 8192 tokens, else next power of two of
    max_model_len / 16 within 16..256; MLA 1024), raised to the smallest page whose page table
    fits half the 1 MiB SMEM (get_tpu_min_page_size)."""
    if facts.mla_kv_dim:
        size = 1024
    elif max_model_len > 8192:
        size = 16
    else:
        size = min(256, max(16, (1 << (max_model_len - 1).bit_length()) // 16))
    pages_per_request = 1024 * 1024 // 2 // max_num_seqs // 4
    smallest = 1 << (cdiv(max_model_len, pages_per_request) - 1).bit_length()
    return max(size, smallest)
