"""What the pinned serving engine accepts, and what a model costs on a slice: encoded once.

Read in the sources of vllm-torchtpu 0.29.0 (upstream vLLM 0.29.0 + vllm-torchtpu-core), torch_tpu
0.2.0 and Ray 2.60.0 Serve LLM (FACTS.md; file:line below):

- heads: vLLM refuses a TP that does not divide the attention heads (vllm/config/model.py:1411);
  for KV heads, QKVParallelLinear asserts KV % TP == 0 when TP < KV, else TP % KV == 0 and each
  chip holds a replicated KV head (vllm/model_executor/layers/linear.py:1043);
- TP on a slice (vllm-torchtpu): a multi-host slice runs the plugin's Ray executor, whose
  RayDistributedExecutorV2._slice_host_layout lists every chip of every TPU host of the Ray
  cluster as one slice (vllm_torchtpu/executors/ray_distributed_executor_v2.py:104-179, 361-389):
  TP must be every chip of the slice, and one RayService cluster may hold one such slice. A
  single host runs the multiprocess executor with torch_tpu's own world sizes (v6e: 1, 4, 8;
  torch_tpu _internal/utils/hardware.py:38-76); Ray Serve LLM still reserves the whole host per
  replica (ray/util/tpu.py get_tpu_worker_resources), so several single-host slices may serve;
- memory: the engine keeps `gpu_memory_utilization` (default 0.92, vllm/config/cache.py:111) of
  each chip's HBM; the TPU KV layout pads head_dim to 128 and 2·KV heads per chip to the dtype's
  packing (vllm_torchtpu/layers/adapter/attention.py:569-612); MLA stores one latent per token
  that TP does not split (vllm/v1/kv_cache_interface.py:546-555).
The other engine, vllm-tpu (JAX, tpu-inference), was not read: it keeps the generic rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from infra import catalog
from infra.model_facts import ModelFacts

DEFAULT_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py:111 (vLLM 0.29)
TPU_HEAD_ALIGNMENT = 128  # vllm_torchtpu/layers/adapter/attention.py:103-104
GIB = 1024**3


def executor(engine: str, tpu: catalog.TpuSlice) -> str:
    """Which vLLM executor serves a replica: `ray` across hosts, `mp` on one host."""
    return "ray" if tpu.multi_host else "mp"


def tensor_parallel_options(engine: str, tpu: catalog.TpuSlice) -> list[int]:
    """The TP sizes the engine accepts on one slice of this shape (module docstring)."""
    if engine == "vllm-torchtpu":
        if tpu.multi_host:
            return [tpu.chips]
        worlds = [n for n, _ in tpu.generation.torch_tpu_world_topologies]
        return [n for n in worlds if n <= tpu.chips and tpu.chips % n == 0] or [1]
    return [  # vllm-tpu: divisors of the chips, whole hosts past one (Serve LLM's host bundles)
        tp
        for tp in range(1, tpu.chips + 1)
        if tpu.chips % tp == 0 and (tp <= tpu.chips_per_host or tp % tpu.chips_per_host == 0)
    ]


def torch_tpu_topology(tpu: catalog.TpuSlice, tensor_parallel: int) -> str | None:
    """TORCH_TPU_TOPOLOGY for a single-host engine using fewer chips than its host: the TPU
    webhook injects the whole slice's topology, which torch_tpu would take (and fail); None
    when the slice's own topology is right."""
    if tpu.multi_host or tensor_parallel == tpu.chips:
        return None
    return dict(tpu.generation.torch_tpu_world_topologies).get(tensor_parallel)


def head_problems(facts: ModelFacts, tp: int) -> list[str]:
    """Why vLLM would refuse this TP for this model (empty: it accepts it)."""
    problems = []
    if facts.attention_heads % tp:
        problems.append(
            f"{facts.attention_heads} attention heads are not divisible by TP {tp} "
            "(vLLM refuses it: vllm/config/model.py:1411)"
        )
    for label, kv in (
        ("KV heads", facts.kv_heads),
        ("full-attention KV heads", facts.global_kv_heads),
    ):
        if not kv or facts.mla_kv_dim:
            continue  # MLA keeps one latent per token: no KV heads to split
        if (tp < kv and kv % tp) or (tp >= kv and tp % kv):
            problems.append(
                f"{kv} {label} and TP {tp}: vLLM needs KV divisible by TP, or TP by KV (each chip "
                "then holds a copy; vllm/model_executor/layers/linear.py:1043)"
            )
    return problems


def allowed_tensor_parallel(
    engine: str, tpu: catalog.TpuSlice, facts: ModelFacts | None
) -> list[int]:
    """TP sizes both the slice and (when its facts are known) the model allow."""
    options = tensor_parallel_options(engine, tpu)
    if facts is None:
        return options
    return [tp for tp in options if not head_problems(facts, tp)]


def _roundup(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def kv_bytes_per_token_layer(
    facts: ModelFacts, tp: int, kv_bytes: int, *, full_attention: bool = False
) -> int:
    """KV-cache bytes one token costs in one layer on one chip, in the TPU layout."""
    if facts.mla_kv_dim:
        return _roundup(facts.mla_kv_dim, TPU_HEAD_ALIGNMENT) * kv_bytes
    heads = facts.kv_heads
    head_dim = facts.head_dim
    if full_attention and facts.global_kv_heads:
        heads, head_dim = facts.global_kv_heads, facts.global_head_dim or head_dim
    per_chip = max(1, heads // tp)
    pack = max(1, 4 // kv_bytes)  # 32-bit lanes: 2 bf16 or 4 fp8 values per lane
    if head_dim == 64:  # the hd64 kernel shares the 128 lanes between K and V
        return _roundup(per_chip, pack) * TPU_HEAD_ALIGNMENT * kv_bytes
    return _roundup(2 * per_chip, pack) * _roundup(head_dim, TPU_HEAD_ALIGNMENT) * kv_bytes


@dataclass(frozen=True)
class Fit:
    """One model on one slice at its TP and context: what each chip holds."""

    tensor_parallel: int
    weights_gib: float  # per chip
    kv_bytes_per_token: int  # per chip, every layer
    kv_gib_per_sequence: float  # one max_model_len sequence, per chip
    usable_gib: float  # HBM x memory utilization
    sequences: int  # max_model_len sequences the KV cache holds at once
    idle_chips: int  # of the slice the replica reserves
    memory_utilization: float

    @property
    def fits(self) -> bool:
        return self.sequences >= 1


def fit(
    facts: ModelFacts,
    tpu: catalog.TpuSlice,
    tp: int,
    max_model_len: int,
    *,
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
    kv_cache_dtype: str | None = None,
    hybrid_kv_cache: bool = True,
) -> Fit:
    """Weights and KV cache per chip; `hybrid_kv_cache` False (disable_hybrid_kv_cache_manager)
    makes sliding-window layers hold full context too."""
    params = facts.params or 0
    weights = params * facts.dtype_bytes / tp
    kv_bytes = 1 if kv_cache_dtype and kv_cache_dtype.startswith("fp8") else facts.dtype_bytes
    sliding = facts.sliding_layers if facts.sliding_window else 0
    full = facts.layers - sliding
    per_token_full = kv_bytes_per_token_layer(facts, tp, kv_bytes, full_attention=True)
    per_token_sliding = kv_bytes_per_token_layer(facts, tp, kv_bytes)
    window = facts.sliding_window if hybrid_kv_cache and facts.sliding_window else max_model_len
    per_sequence = full * per_token_full * max_model_len + sliding * per_token_sliding * min(
        window, max_model_len
    )
    usable = tpu.generation.hbm_gib_per_chip * GIB * memory_utilization
    free = usable - weights
    sequences = max(0, math.floor(free / per_sequence)) if per_sequence else 0
    return Fit(
        tensor_parallel=tp,
        weights_gib=weights / GIB,
        kv_bytes_per_token=full * per_token_full + sliding * per_token_sliding,
        kv_gib_per_sequence=per_sequence / GIB,
        usable_gib=usable / GIB,
        sequences=sequences,
        idle_chips=tpu.chips - tp,
        memory_utilization=memory_utilization,
    )
