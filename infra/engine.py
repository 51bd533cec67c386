"""What the pinned serving engine accepts, and what a model costs on a slice: encoded once.

Read in the sources of vllm-torchtpu 0.29.0 (upstream vLLM 0.29.0 + vllm-torchtpu-core), torch_tpu
0.2.0 and Ray 2.60.0 Serve LLM (FACTS.md; file:line below; the vllm-torchtpu and -core 0.29.0
wheels as PyPI serves them for Python 3.12):

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
- memory (vllm_torchtpu/worker/tpu_worker.py determine_available_memory, utils.
  compute_hbm_budget): after a profile pass the KV cache gets `limit x gpu_memory_utilization -
  used`, where limit is the chip's HBM as the runtime reports it (catalog: 31.25 GiB on v6e) and
  used is everything then resident: the weights, and every compiled program's "bottom-of-HBM
  program-region reservation" (tpu_runner.profile_run compiles the backbone at the largest
  token bucket, max_num_batched_tokens, and the sampling subgraphs at max_num_seqs rows, "so
  their reservations are visible to vLLM's available-memory probe"). `reserve` models that:
  one batch's activations, the sampler's fp32 logits, and a margin (RUNTIME_MARGIN_BYTES) for
  what no source sizes (program code, collectives' buffers). Programs compiled after the
  sizing (capture_model's bucket ladder) live in the 1 - gpu_memory_utilization left over.
- weights: dense layers split by TP (VocabParallelEmbedding / ParallelLMHead too, the vocab
  padded to 64 first; a KV projection TP replicates past the KV heads is not added); with
  enable_expert_parallel vLLM's EP size is TP x DP and determine_expert_map (fused_moe/
  expert_map_manager.py) gives rank r `E // EP (+1 for r < E % EP)` whole experts: the heaviest
  chip holds ceil(E / EP), and past E ranks hold none (refused: infra.rules.workloads).
- the KV cache: infra.kv_cache (vLLM's spec classes, the TPU layout on top).
- engine defaults a stack does not set: max_num_batched_tokens 2048 (EngineArgs.
  get_batch_defaults for Ray Serve LLM's OPENAI_API_SERVER usage context: the TPU plugin is an
  out-of-tree platform whose get_device_total_memory raises, so the generic branch applies),
  max_num_seqs 256, chunked prefill and async scheduling on (2 batches in flight).
The other engine, vllm-tpu (JAX, tpu-inference), was not read: it keeps the same rules, and
preview says so (its record's `fit_assumes`, infra.engines).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from infra import catalog, engines, kv_cache
from infra.model_facts import ModelFacts

DEFAULT_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py:111 (vLLM 0.29)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048  # module docstring: Serve LLM's usage context on TPU
DEFAULT_MAX_NUM_SEQS = 256  # EngineArgs.get_batch_defaults, same branch
ASYNC_IN_FLIGHT_BATCHES = 2  # VllmConfig.max_concurrent_batches with async scheduling
SAMPLER_FP32_COPIES = 2  # max_num_seqs x vocab fp32 logits and one same-shaped temporary
# What `used` holds beyond the weights, activations and logits: the profile programs' code and
# the runtime's collectives buffers. No source sizes it: a margin, not a measurement.
RUNTIME_MARGIN_BYTES = 512 * 1024**2
GIB = 1024**3


def tensor_parallel_options(engine: str, tpu: catalog.TpuSlice) -> list[int]:
    """The TP sizes the engine accepts on one slice of this shape (module docstring), by how
    its record says TP is formed (infra.engines)."""
    record = engines.get(engine)
    devices, per_host = tpu.devices, tpu.devices_per_host  # a TP rank is a runtime device
    if tpu.multi_host and record.tp_across_hosts == "whole_slice":
        return [devices]
    if not tpu.multi_host and record.tp_on_one_host == "runtime_worlds":
        worlds = [n for n, _ in tpu.generation.torch_tpu_world_topologies]
        return [n for n in worlds if n <= devices and devices % n == 0] or [1]
    return [  # divisors of the devices, whole hosts past one (Serve LLM's host bundles)
        tp
        for tp in range(1, devices + 1)
        if devices % tp == 0 and (tp <= per_host or tp % per_host == 0)
    ]


def tensor_parallel_rule(engine: str, tpu: catalog.TpuSlice) -> str:
    """Why tensor_parallel_options allows what it does, for a refusal's message."""
    record = engines.get(engine)
    if tpu.multi_host and record.tp_across_hosts == "whole_slice":
        return "its Ray executor takes every chip of the slice"
    if not tpu.multi_host and record.tp_on_one_host == "runtime_worlds":
        return "torch_tpu forms a single-host slice of these chip counts only"
    return "divisors of the chips, whole hosts past one"


def torch_tpu_topology(tpu: catalog.TpuSlice, tensor_parallel: int) -> str | None:
    """TORCH_TPU_TOPOLOGY for a single-host engine using fewer chips than its host: the TPU
    webhook injects the whole slice's topology, which torch_tpu would take (and fail); None
    when the slice's own topology is right."""
    if tpu.multi_host or tensor_parallel == tpu.devices:
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


@dataclass(frozen=True)
class EngineSettings:
    """The engine arguments a fit depends on, resolved as the engine resolves them."""

    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION
    kv_cache_dtype: str | None = None
    hybrid_kv_cache: bool = True  # False: disable_hybrid_kv_cache_manager
    expert_parallel: bool = False
    max_num_batched_tokens: int | None = None  # None: the engine's default for max_model_len
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    block_size: int | None = None  # None: the engine's choice (kv_cache.tpu_block_size)
    async_scheduling: bool = True

    @classmethod
    def from_engine_kwargs(
        cls, kwargs: Mapping[str, Any], *, expert_parallel: bool = False
    ) -> EngineSettings:
        """From a served model's engineKwargs (and its own enableExpertParallel key)."""
        chunked = kwargs.get("enable_chunked_prefill", True) is not False
        tokens = kwargs.get("max_num_batched_tokens")
        return cls(
            memory_utilization=float(
                kwargs.get("gpu_memory_utilization", DEFAULT_MEMORY_UTILIZATION)
            ),
            kv_cache_dtype=kwargs.get("kv_cache_dtype"),
            hybrid_kv_cache=not kwargs.get("disable_hybrid_kv_cache_manager", False),
            expert_parallel=expert_parallel,
            max_num_batched_tokens=int(tokens) if tokens else (None if chunked else -1),
            max_num_seqs=int(kwargs.get("max_num_seqs") or DEFAULT_MAX_NUM_SEQS),
            block_size=int(kwargs["block_size"]) if kwargs.get("block_size") else None,
            async_scheduling=kwargs.get("async_scheduling", True) is not False,
        )

    def pinned(self, max_model_len: int) -> EngineSettings:
        """These settings with max_num_batched_tokens settled to the number the engine would
        take: the one number the fit costs and the rendered engine_kwargs pin (with
        max_num_seqs), so the engine cannot settle on another (infra.plan.ray.service)."""
        return replace(self, max_num_batched_tokens=self.batched_tokens(max_model_len))

    def batched_tokens(self, max_model_len: int) -> int:
        """max_num_batched_tokens as EngineArgs settles it (without chunked prefill, -1 here:
        at least max_model_len)."""
        if self.max_num_batched_tokens is None:
            return min(DEFAULT_MAX_NUM_BATCHED_TOKENS, self.max_num_seqs * max_model_len)
        if self.max_num_batched_tokens < 0:
            return max(max_model_len, DEFAULT_MAX_NUM_BATCHED_TOKENS)
        return self.max_num_batched_tokens


@dataclass(frozen=True)
class Fit:
    """One model on one slice at its TP and context: what each chip holds."""

    tensor_parallel: int
    weights_gib: float  # per chip (the heaviest chip under expert parallel)
    kv_bytes_per_token: int  # per chip, every layer holding cache, TPU layout
    kv_gib_per_sequence: float  # what one max_model_len request reserves, per chip
    usable_gib: float  # runtime HBM x memory utilization
    sequences: int  # max_model_len requests the KV cache holds at once
    idle_devices: int  # of the slice the replica reserves
    memory_utilization: float
    runtime_hbm_gib: float = 0.0  # one chip's HBM as the runtime reports it
    activations_gib: float = 0.0  # reserve: one batch of max_num_batched_tokens
    sampler_gib: float = 0.0  # reserve: fp32 logits of max_num_seqs rows
    margin_gib: float = 0.0  # reserve: RUNTIME_MARGIN_BYTES
    expert_parallel: int = 0  # EP size (0: off)
    experts_per_chip: int = 0  # routed experts the heaviest chip holds (0: dense or no EP)
    max_model_len: int = 0
    max_num_batched_tokens: int = 0
    block_size: int = 0
    cache_layers: int = 0  # layers holding KV (KV-shared ones hold none)
    sliding_tokens: int | None = None  # tokens a sliding layer keeps per request
    padding_layers: int = 0  # layers vLLM's hybrid grouping adds
    settings: EngineSettings = EngineSettings()

    @property
    def reserve_gib(self) -> float:
        """The engine's own work beyond the weights (module docstring)."""
        return self.activations_gib + self.sampler_gib + self.margin_gib

    @property
    def kv_cache_gib(self) -> float:
        """What the engine hands the KV cache: usable less weights and reserve."""
        return self.usable_gib - self.weights_gib - self.reserve_gib

    @property
    def fits(self) -> bool:
        return self.sequences >= 1


def weight_bytes(facts: ModelFacts, tp: int, expert_parallel: bool) -> tuple[float, int, int]:
    """(bytes on the heaviest chip, EP size, experts it holds) for the stored parameters."""
    params, width = facts.params or 0, facts.dtype_bytes
    if not (expert_parallel and facts.moe and facts.expert_params):
        return params * width / tp, (tp if expert_parallel and facts.moe else 0), 0
    experts = math.ceil(facts.experts / tp)  # EP = TP x DP, DP 1 on one slice
    dense = (params - facts.expert_params) * width / tp
    return dense + facts.expert_params * width * experts / facts.experts, tp, experts


def activation_bytes(facts: ModelFacts, tp: int, tokens: int) -> int:
    """One decoder layer's live tensors for a batch of `tokens` on one chip (XLA reuses the
    buffers layer to layer): residual, hidden and norm output; q, k, v and attention output;
    the MLP's gate, up and activation (a routed MoE runs top-k experts per token, each chip
    sized for every token: conservative)."""
    heads = facts.attention_heads // tp
    kv = max(1, facts.kv_heads // tp)
    head_dim = max(facts.head_dim, facts.global_head_dim or 0)
    dense = (facts.intermediate_size or 4 * facts.hidden_size) // tp
    routed = facts.experts_per_token * (facts.moe_intermediate_size or 0)
    width = 3 * facts.hidden_size + (2 * heads + 2 * kv) * head_dim + 3 * max(dense, routed)
    return tokens * width * facts.dtype_bytes


def sampler_bytes(facts: ModelFacts, max_num_seqs: int) -> int:
    """The sampling subgraphs' fp32 logits over the whole vocabulary (gathered across TP)."""
    return max_num_seqs * facts.vocab_size * 4 * SAMPLER_FP32_COPIES


def fit(
    facts: ModelFacts,
    tpu: catalog.TpuSlice,
    tp: int,
    max_model_len: int,
    *,
    memory_utilization: float = DEFAULT_MEMORY_UTILIZATION,
    kv_cache_dtype: str | None = None,
    hybrid_kv_cache: bool = True,
    expert_parallel: bool = False,
    settings: EngineSettings | None = None,
) -> Fit:
    """Weights, the engine's reserve and the KV cache per chip (module docstring);
    `settings` (EngineSettings.from_engine_kwargs) wins over the keyword shorthands."""
    settings = settings or EngineSettings(
        memory_utilization=memory_utilization,
        kv_cache_dtype=kv_cache_dtype,
        hybrid_kv_cache=hybrid_kv_cache,
        expert_parallel=expert_parallel,
    )
    weights, ep, experts = weight_bytes(facts, tp, settings.expert_parallel)
    kv_dtype = settings.kv_cache_dtype or ""
    kv_bytes = 1 if kv_dtype.startswith("fp8") else facts.dtype_bytes
    tokens = settings.batched_tokens(max_model_len)
    in_flight = tokens * (ASYNC_IN_FLIGHT_BATCHES if settings.async_scheduling else 1)
    block = settings.block_size or kv_cache.tpu_block_size(
        facts, max_model_len, settings.max_num_seqs
    )
    caches = kv_cache.layer_caches(facts, tp, hybrid=settings.hybrid_kv_cache)
    layout = kv_cache.plan(
        caches,
        kv_bytes=kv_bytes,
        block_size=block,
        max_model_len=max_model_len,
        in_flight_tokens=in_flight,
    )
    runtime = tpu.generation.runtime_hbm_bytes_per_device
    usable = runtime * settings.memory_utilization
    activations = activation_bytes(facts, tp, tokens)
    sampler = sampler_bytes(facts, settings.max_num_seqs)
    free = int(usable - weights - activations - sampler - RUNTIME_MARGIN_BYTES)
    window = next((c.sliding_window for c in caches if c.sliding_window), None)
    return Fit(
        tensor_parallel=tp,
        weights_gib=weights / GIB,
        kv_bytes_per_token=layout.bytes_per_token,
        kv_gib_per_sequence=layout.bytes_per_sequence / GIB,
        usable_gib=usable / GIB,
        sequences=layout.sequences(free),
        idle_devices=tpu.devices - tp,
        memory_utilization=settings.memory_utilization,
        runtime_hbm_gib=runtime / GIB,
        activations_gib=activations / GIB,
        sampler_gib=sampler / GIB,
        margin_gib=RUNTIME_MARGIN_BYTES / GIB,
        expert_parallel=ep,
        experts_per_chip=experts,
        max_model_len=max_model_len,
        max_num_batched_tokens=tokens,
        block_size=block,
        cache_layers=sum(c.count for c in caches),
        sliding_tokens=min(window - 1 + in_flight, max_model_len) if window else None,
        padding_layers=layout.padding_layers,
        settings=settings,
    )


def fit_served(
    facts: ModelFacts,
    tpu: catalog.TpuSlice,
    tp: int,
    max_model_len: int,
    engine_kwargs: Mapping[str, Any],
    *,
    expert_parallel: bool = False,
) -> Fit:
    """The fit of a served model as its stack configures the engine."""
    settings = EngineSettings.from_engine_kwargs(engine_kwargs, expert_parallel=expert_parallel)
    return fit(facts, tpu, tp, max_model_len, settings=settings)


# How long one max-length stream may take on a loaded engine: the serving drain windows
# (infra.plan.ray.service) are read from it. No decode rate is measured on a TPU here, so it is
# bounded: decode is memory-bound (a step's FLOPs at max_num_seqs rows are a fraction of a ms on
# a v6e chip), and one step reads at most every byte of a device's usable HBM, the weights and a
# full KV cache, once. STEP_OVERHEAD covers what shares a step beside that read (a chunked
# prefill's compute, sampling, the host's scheduling): a stated allowance, not a measurement.
STEP_OVERHEAD = 1.5
DRAIN_FLOOR_S = 120  # never shorter: Serve's own default is 20 s (ray/serve/_private/constants.py)


def decode_step_ceiling_s(tpu: catalog.TpuSlice, memory_utilization: float) -> float:
    """The longest a decode step takes on this slice's devices (the bound above)."""
    known = [g.hbm_bytes_per_s_per_device for g in catalog.GENERATIONS.values()]
    bandwidth = tpu.generation.hbm_bytes_per_s_per_device or min(b for b in known if b)
    usable = tpu.generation.runtime_hbm_bytes_per_device * memory_utilization
    return usable / bandwidth * STEP_OVERHEAD


def max_stream_s(tpu: catalog.TpuSlice, max_model_len: int, memory_utilization: float) -> int:
    """Seconds one stream of max_model_len tokens may take, decoded one token per step, at
    least DRAIN_FLOOR_S: what a drain must wait before it cuts a stream."""
    step = decode_step_ceiling_s(tpu, memory_utilization)
    return max(DRAIN_FLOOR_S, math.ceil(max_model_len * step))


@dataclass(frozen=True)
class Advice:
    """What would fit instead of a fit that does not (for the misfit message)."""

    max_model_len: int | None  # the longest context that fits at this TP; None: none
    tensor_parallel: tuple[int, ...]  # other TPs of this slice that fit this context
    slices: tuple[str, ...]  # larger slices of this generation that fit it, with their TP


def expert_parallel_problem(facts: ModelFacts, tp: int) -> str | None:
    """Why expert parallel at this TP spreads experts thinner than one per chip, if it does."""
    if not facts.moe or tp <= facts.experts:
        return None
    return (
        f"expert parallel at TP {tp} is EP {tp} (TP x DP), more than the {facts.experts} "
        f"experts: vLLM's determine_expert_map gives ranks {facts.experts}..{tp - 1} no expert "
        "while each of the others holds a whole one"
    )


def advise(
    fitted: Fit, facts: ModelFacts, engine: str, tpu: catalog.TpuSlice, *, limit: int = 2
) -> Advice:
    """Shorter maxModelLen, another TP, a larger slice: each tried with the same settings."""

    def refit(slice_: catalog.TpuSlice, tp: int, length: int) -> Fit:
        return fit(facts, slice_, tp, length, settings=fitted.settings)

    def usable_tps(slice_: catalog.TpuSlice) -> list[int]:
        options = allowed_tensor_parallel(engine, slice_, facts)
        if fitted.settings.expert_parallel:
            options = [t for t in options if not expert_parallel_problem(facts, t)]
        return options

    tp, length = fitted.tensor_parallel, fitted.max_model_len
    low, high = 0, length - 1  # the longest context under the asked one that fits
    while low < high:
        middle = (low + high + 1) // 2
        if refit(tpu, tp, middle).fits:
            low = middle
        else:
            high = middle - 1
    shorter = low - low % 256 if low >= 256 else low
    others = tuple(t for t in usable_tps(tpu) if t != tp and refit(tpu, t, length).fits)
    larger = []
    for candidate in sorted(catalog.all_slices(), key=lambda s: (s.chips, s.machine_type)):
        if candidate.generation != tpu.generation or candidate.chips <= tpu.chips:
            continue
        fitting = [t for t in usable_tps(candidate) if refit(candidate, t, length).fits]
        if fitting:
            larger.append(f"{candidate.machine_type} {candidate.topology} (TP {max(fitting)})")
        if len(larger) == limit:
            break
    return Advice(shorter or None, others, tuple(larger))
