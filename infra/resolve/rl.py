"""The resolve step of `park:rl`: a GRPO job's learner and rollout sides, computed once.

The learner is a training run in all but its data: one Ray Train worker per chip of one slice
of its TPU pool, its batch the step's completions (promptsPerStep x groupSize), its sequences a
prompt and its completion (maxPromptTokens + maxResponseTokens). Its fit is the training fit
(infra.resolve.training.fit_training) of exactly that run, plus, with klCoef > 0, the frozen
reference policy the learner holds beside it (workloads/rl/parts.py builds it like the policy: fp32
weights, sharded over the slice under FSDP2, whole under DDP); its forward runs without
gradients, below the step's peak. The micro-batch is then the largest that fits with it.

The rollout side is vLLM engines as Ray actors (not Serve LLM replicas, so no slice-wide
placement group): each engine takes `tensorParallelSize` chips, as many engines as the slices
hold (chips / TP per slice, every slice of the pool). TP follows the serving rules
(infra.engine: the TP sizes torch_tpu forms on one host, and the model's heads); unset, it is
the smallest allowed TP whose engine fits (infra.engine.fit_served at maxModelLen = prompt +
response), so the slice holds the most engines. An engine's TP stays on one host: it loads
each version from a folder in its host's memory (infra.rules.rl refuses a wider one). A GPU
pool of park:gpuPools is accepted too: TP then divides a node's GPUs, and the memory fit (a TPU
model) is not computed.

The weight sync per learner step is estimated here too (:class:`SyncEstimate`): the bytes of the
scheme the job runs (workloads/rl/sync.py: bf16 buckets through Ray's object store, pulled once
by each rollout host) against the scheme it replaced (an fp32 folder every tensor-parallel worker
of every engine read whole, one engine after another), and its seconds phase by phase
(:class:`SyncPhases`: publish, pull, write, reload), each phase's rate from a named source.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from infra import engine, images, model_facts, model_lookup, names
from infra.model_facts import FactsLookup
from infra.resolve import disk, training_fit
from infra.resolve.training import fit_training, micro_batches
from infra.resolve.training_fit import TrainingFit
from infra.resolve.types import (
    CHECKPOINTS_PREFIX,
    DCN_GBPS_PER_CHIP,
    RL_JOB_NAME,
    ROLLOUT_ENGINE,
    SYNC_BYTES_PER_PARAM,
    WORKLOAD_IMAGE,
    GpuPoolPlan,
    PoolPlan,
    RlPlan,
    RolloutPlan,
    SyncEstimate,
)
from infra.schema.models import RlConfig, StackConfig, TrainingConfig
from workloads import protocol
from workloads.rl.sync import SYNC_BUCKET_BYTES

# The rates of the weight sync's phases, in bytes per second, each with its source.
PULL_BYTES_PER_S = 250e6
"""A node pulling from Ray's object store: ray-project/ray #42632 (FACTS.md) measured 200-300
MB/s per node with one get at a time, "higher only with many objects in flight". The receiver
keeps several gets in flight (workloads/rl/sync.py HostReceiver), but no source gives a rate for
that, so none is credited."""
SEND_BYTES_PER_S = 2.5e9
"""A node serving other nodes' pulls: in #42632 one node sent 2-3 GB/s in all to ten nodes
pulling at 200-300 MB/s each; no more is counted on from a learner host."""
PUBLISH_BYTES_PER_S = 400e6
"""The learner packing and putting its bf16 buckets (cast, safetensors bytes, ``ray.put``), one
bucket after another: benchmarks/rl_sync.py's publish phase, 0.785 s for 317 MB (158M params) in
its 2026-12-02 run on a quieter 2-core machine (under load average ~30, 2026-12-07: 32-170
MB/s). On TPU each gathered tensor's copy from the chip to the host comes on top, unmeasured."""
WRITE_BYTES_PER_S = 1.5e9
"""A receiver writing buckets into host memory (``/dev/shm``): the same 2026-12-02 run staged
317 MB (a local get, then the write) in 0.194 s; under load, 2026-12-07, 0.08-0.72 GB/s. Faster
than the pull, so only the last bucket's write adds to the stage."""
RELOAD_BYTES_PER_S = 4.0e9
"""vLLM's ``reload_weights`` of a bf16 checkpoint into a running engine: vllm-project/vllm #49459
measured Qwen3-8B (16.4 GB) in 3.72 s and Qwen3-4B (8.0 GB) in 1.90 s on one H200 at TP 1, about
4.2-4.4 GB/s. A GPU, not a TPU (vllm-torchtpu reloads through its GPU runner's code); a wider
engine is not credited with more (the same PR: Qwen3.5-27B at TP 4, 6.59 s)."""
SYNC_RATES = (
    f"pull {PULL_BYTES_PER_S / 1e6:g} MB/s per rollout host (ray-project/ray #42632, one get at "
    f"a time; concurrent gets not credited), learner hosts sending at most "
    f"{SEND_BYTES_PER_S / 1e9:g} GB/s each (#42632), publish {PUBLISH_BYTES_PER_S / 1e6:g} MB/s "
    f"and host-memory write {WRITE_BYTES_PER_S / 1e9:g} GB/s (benchmarks/rl_sync.py, 2-core CPU), "
    f"vLLM reload {RELOAD_BYTES_PER_S / 1e9:g} GB/s per engine (vllm-project/vllm #49459, H200)"
)


@dataclass(frozen=True)
class SyncPhases:
    """One weight sync per learner step, phase by phase, in seconds: the bytes of a version
    over the rates above. The phases follow one another, except the receiver's writes, which
    overlap its pulls (bucket ``i`` is written while ``i+1..`` come): the stage takes the
    slower of the two and then the last bucket's write."""

    version_bytes: int
    publish_s: float
    """The learner puts every bucket, one after another (each tensor's gather is a collective
    of every rank, so the learner hosts do not share it): version / PUBLISH_BYTES_PER_S."""
    pull_s: float
    """Every rollout host pulls the version, all at once: version / PULL_BYTES_PER_S, or the
    learner hosts' sending if slower: version x rollout hosts / (learner hosts x
    SEND_BYTES_PER_S)."""
    write_s: float
    """The receiver writes the version into host memory: version / WRITE_BYTES_PER_S."""
    last_write_s: float
    """The last bucket's write, after its pull: min(bucket, version) / WRITE_BYTES_PER_S."""
    reload_s: float
    """Every engine loads the staged version through vLLM, all at once: version /
    RELOAD_BYTES_PER_S."""

    @property
    def stage_s(self) -> float:
        return max(self.pull_s, self.write_s) + self.last_write_s

    @property
    def total_s(self) -> float:
        return self.publish_s + self.stage_s + self.reload_s


def sync_phases(params: int, learner_hosts: int, rollout_hosts: int) -> SyncPhases:
    """The phases of one sync of a ``params`` model from ``learner_hosts`` to
    ``rollout_hosts`` (each pulls the version once)."""
    version = params * SYNC_BYTES_PER_PARAM
    pull = version / PULL_BYTES_PER_S
    send = version * rollout_hosts / (learner_hosts * SEND_BYTES_PER_S)
    return SyncPhases(
        version_bytes=version,
        publish_s=version / PUBLISH_BYTES_PER_S,
        pull_s=max(pull, send),
        write_s=version / WRITE_BYTES_PER_S,
        last_write_s=min(SYNC_BUCKET_BYTES, version) / WRITE_BYTES_PER_S,
        reload_s=version / RELOAD_BYTES_PER_S,
    )


def sync_estimate(
    facts: model_facts.ModelFacts, learner: PoolPlan, rollout: RolloutPlan
) -> SyncEstimate:
    """The sync's bytes, and its seconds (:class:`SyncPhases`) where the engines are on a TPU
    generation the rates were reasoned for (None on a GPU rollout pool)."""
    params = training_fit.shapes(facts).params
    seconds = None
    if rollout.tpu is not None and learner.slice.generation.name in DCN_GBPS_PER_CHIP:
        seconds = sync_phases(params, learner.slice.hosts, rollout.hosts).total_s
    return SyncEstimate(
        params=params,
        rollout_hosts=rollout.hosts,
        learner_hosts=learner.slice.hosts,
        engines=rollout.engines,
        tensor_parallel=rollout.tensor_parallel,
        seconds=seconds,
    )


def learner_training(spec: RlConfig) -> TrainingConfig:
    """The learner as the training fit sees it: the step's completions, prompt + response long."""
    return TrainingConfig(
        enabled=True,
        model=spec.model or None,
        strategy=spec.strategy,
        global_batch_size=spec.prompts_per_step * spec.group_size,
        micro_batch_size=spec.micro_batch_size,
        seq_len=max(spec.max_prompt_tokens + spec.max_response_tokens, 8),
        activation_checkpointing=spec.activation_checkpointing,
    )


def reference_bytes(facts: model_facts.ModelFacts, spec: RlConfig, chips: int) -> int:
    """A chip's share of the frozen reference policy (klCoef > 0): fp32 weights like the
    policy's master copy, sharded over the slice under FSDP2."""
    if not spec.kl_coef:
        return 0
    shard = chips if spec.strategy == "fsdp2" else 1
    return training_fit.shapes(facts).params * 4 // shard


def learner_fit(
    facts: model_facts.ModelFacts, spec: RlConfig, learner: PoolPlan
) -> TrainingFit | None:
    """The learner's step per chip with the reference in it, at the pinned micro-batch or the
    largest that fits (the training fit's own choice when there is no reference)."""
    training, tpu = learner_training(spec), learner.slice
    reference = reference_bytes(facts, spec, tpu.devices)
    fit = fit_training(facts, training, tpu, 1)
    if fit is None or not reference:
        return fit
    share = training.global_batch_size // tpu.devices
    micros = [spec.micro_batch_size] if spec.micro_batch_size else range(share, 0, -1)
    candidates = []
    for micro in micros:
        if share % micro:
            continue
        pinned = fit_training(facts, training, tpu, 1, pinned=micro)
        if pinned is not None:
            candidates.append(replace(pinned, params_bytes=pinned.params_bytes + reference))
    return next((f for f in candidates if f.fits), candidates[-1] if candidates else None)


def _engine_fit(facts: FactsLookup, pool: PoolPlan, tp: int, spec: RlConfig) -> engine.Fit | None:
    if facts.facts is None:
        return None
    kwargs = {"gpu_memory_utilization": spec.gpu_memory_utilization}
    length = spec.max_prompt_tokens + spec.max_response_tokens
    return engine.fit_served(facts.facts, pool.slice, tp, length, kwargs)


def resolve_rollout(
    spec: RlConfig, facts: FactsLookup, tpu: PoolPlan | None, gpu: GpuPoolPlan | None
) -> RolloutPlan:
    length = spec.max_prompt_tokens + spec.max_response_tokens
    if tpu is not None:
        options = tuple(engine.allowed_tensor_parallel(ROLLOUT_ENGINE, tpu.slice, facts.facts))
        tp = spec.tensor_parallel_size
        if tp is None:  # an engine reads its weights on its own host: one host's TP first
            local = [t for t in options if t <= tpu.slice.devices_per_host]
            fitting = [t for t in local if (f := _engine_fit(facts, tpu, t, spec)) and f.fits]
            tp = (fitting or local or list(options) or [tpu.slice.devices])[0]
        fit = _engine_fit(facts, tpu, tp, spec) if tp in options else None
        return RolloutPlan(
            kind="tpu",
            pool_name=tpu.name,
            tpu=tpu,
            gpu=None,
            tensor_parallel=tp,
            options=options,
            groups=tpu.slices,
            engines_per_group=tpu.slice.devices // tp if tp else 0,
            hosts=tpu.total_hosts,
            max_model_len=length,
            fit=fit,
            torch_tpu_topology=engine.torch_tpu_topology(tpu.slice, tp) if tp in options else None,
        )
    assert gpu is not None
    count = gpu.spec.accelerator_count
    heads = facts.facts
    options = tuple(
        t
        for t in range(1, count + 1)
        if count % t == 0 and (heads is None or not engine.head_problems(heads, t))
    )
    tp = spec.tensor_parallel_size or (options or (1,))[0]
    return RolloutPlan(
        kind="gpu",
        pool_name=gpu.spec.name,
        tpu=None,
        gpu=gpu,
        tensor_parallel=tp,
        options=options,
        groups=gpu.spec.nodes,
        engines_per_group=count // tp,
        hosts=gpu.spec.nodes,
        max_model_len=length,
        fit=None,
        torch_tpu_topology=None,
    )


def resolve_rl(
    spec: StackConfig,
    tpu_pools: dict[str, PoolPlan],
    gpu_pools: dict[str, GpuPoolPlan],
    stack_names: names.StackNames,
    *,
    partial: bool = False,
) -> RlPlan | None:
    """The RlPlan of park:rl; None when it is off (or, with `partial`, when a pool it names
    is missing: the rules say so)."""
    rl = spec.rl
    if not rl.enabled:
        return None
    learner = tpu_pools.get(rl.learner_pool)
    tpu, gpu = tpu_pools.get(rl.rollout_pool), gpu_pools.get(rl.rollout_pool)
    if learner is None or (tpu is None and gpu is None):
        if partial:
            return None
        raise KeyError(f"park:rl: no pool {rl.learner_pool!r} or {rl.rollout_pool!r}")
    facts = (
        model_lookup.lookup(rl.model)
        if rl.model
        else FactsLookup(None, (), "park:rl.model is not set")
    )
    workers, hosts = learner.slice.devices, learner.slice.hosts  # a worker per device
    fit = learner_fit(facts.facts, rl, learner) if facts.facts is not None else None
    share = (rl.prompts_per_step * rl.group_size) // workers
    micro, accumulation = micro_batches(fit, rl.micro_batch_size, share)
    run_name = f"{spec.stack}-{RL_JOB_NAME}"
    storage = f"gs://{stack_names.bucket}/{CHECKPOINTS_PREFIX}"
    model_path = rl.model
    if rl.model and disk.needs_staging(rl.model) and rl.init != "config":
        model_path = disk.staged_path(spec.storage.mount_path, rl.model)
    rollout = resolve_rollout(rl, facts, tpu, gpu)
    return RlPlan(
        spec=rl,
        learner=learner,
        workers=workers,
        hosts=hosts,
        rollout=rollout,
        image=rl.image or images.default_ref(stack_names.registry_url, WORKLOAD_IMAGE),
        run_name=run_name,
        storage_path=storage,
        export_path=protocol.training_export_path(storage, run_name) if rl.export else None,
        model_path=model_path,
        facts=facts,
        fit=fit,
        micro_batch=micro,
        accumulation_steps=accumulation,
        sync=sync_estimate(facts.facts, learner, rollout) if facts.facts is not None else None,
    )
