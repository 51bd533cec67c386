"""Rules of `park:rl`, on the resolved plan (infra.resolve.rl): both pools, both sides' fit.

- the pools: the learner's a TPU pool, the rollout's a TPU or GPU pool, two different pools,
  neither the training's nor the serving's (a slice runs one workload), none queued (Kueue
  admits a job on one queue, and the RL job holds two pools);
- the workload's own rules (workloads/rl/config.py: group size, rewards, data, batch), each
  named by its stack key;
- the model: one the trainer trains and the pinned vLLM serves, with enough positions;
- the learner's fit: the training memory model (infra.resolve.training_fit) of the learner's step;
- the engines: a TP the serving rules allow (infra.engine), and an engine that fits.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pydantic.alias_generators import to_camel

from infra import engine
from infra.resolve import StackPlan
from infra.resolve.rl import learner_training, reference_bytes
from infra.resolve.training import fit_training
from infra.resolve.training_fit import GIB, TrainingFit
from infra.resolve.types import ROLLOUT_ENGINE, RlPlan
from infra.rules.workload_flags import POOL_FLAGS, refused_field, stack_key
from infra.rules.workloads import servable_problems, training_refusal
from infra.schema.errors import ConfigProblem

KEY = "park:rl"
# The engines' flags the plan sets from the rollout pool: a refusal of one is the pool's problem.
_ROLLOUT_FLAGS = {"rollout_accelerator", "rollout_engines", "rollout_torch_tpu_topology"}


def check_rl(plan: StackPlan) -> list[ConfigProblem]:
    spec = plan.spec.rl
    if not spec.enabled:
        return []
    problems = _pool_problems(plan)
    rl = plan.rl
    if problems or rl is None:
        return problems
    problems += _workload_problems(rl)
    problems += _model_problems(plan, rl)
    problems += _learner_fit(rl)
    problems += _rollout_problems(rl)
    return problems


def _pool_problems(plan: StackPlan) -> list[ConfigProblem]:
    spec, config = plan.spec.rl, plan.spec
    tpu = [p.name for p in config.tpu_pools]
    gpu = [g.name for g in config.gpu_pools]
    problems = []
    if spec.learner_pool not in tpu:
        allowed = ", ".join(tpu) or "(none)"
        problems.append(
            ConfigProblem(
                f"{KEY}.learnerPool",
                spec.learner_pool,
                f"must name a TPU pool of park:tpuPools (the learner trains with torch_tpu); "
                f"allowed: {allowed}",
            )
        )
    if spec.rollout_pool not in tpu + gpu:
        allowed = ", ".join(tpu + gpu) or "(none)"
        problems.append(
            ConfigProblem(
                f"{KEY}.rolloutPool",
                spec.rollout_pool,
                f"must name a pool of park:tpuPools or park:gpuPools; allowed: {allowed}",
            )
        )
    elif spec.rollout_pool == spec.learner_pool:
        others = ", ".join(n for n in tpu + gpu if n != spec.learner_pool) or "(none)"
        problems.append(
            ConfigProblem(
                f"{KEY}.rolloutPool",
                spec.rollout_pool,
                "must differ from park:rl.learnerPool: the engines and the learner each hold "
                f"their own slices; allowed: {others}",
            )
        )
    problems += _same_slice_shape(plan)
    for other, section in (("training", config.training), ("serving", config.serving)):
        if not section.enabled:
            continue
        for key, name in (("learnerPool", spec.learner_pool), ("rolloutPool", spec.rollout_pool)):
            if name == section.pool:
                problems.append(
                    ConfigProblem(
                        f"{KEY}.{key}",
                        name,
                        f"is park:{other}.pool: a slice runs one workload; give RL its own pool",
                    )
                )
    queued = {p.name for p in config.tpu_pools if len(p.rungs()) > 1}
    queued |= {p.name for p in config.tpu_pools if p.rungs()[0].capacity == "queued"}
    queued |= {g.name for g in config.gpu_pools if g.capacity == "queued"}
    for key, name in (("learnerPool", spec.learner_pool), ("rolloutPool", spec.rollout_pool)):
        if name in queued:
            problems.append(
                ConfigProblem(
                    f"{KEY}.{key}",
                    name,
                    "a queued or laddered pool: Kueue admits a job through one pool's queue, and "
                    "the RL job holds two; allowed: a pool of one on-demand, spot, reservation "
                    "or flex-start capacity",
                )
            )
    return problems


def _same_slice_shape(plan: StackPlan) -> list[ConfigProblem]:
    """Two TPU pools of one slice shape: the learner's TorchTrainer reserves its slice by Ray's
    head resource (`TPU-<pod type>-head`, ray/util/tpu.py), which the rollout slice advertises
    too, so the learner could take the engines' slice. The engines are pinned to theirs
    (infra/plan/rl.py ROLLOUT_RESOURCE); the learner has no such pin in Ray 2.60."""
    spec = plan.spec.rl
    pools = {p.name: p for p in plan.tpu_pools}
    learner, rollout = pools.get(spec.learner_pool), pools.get(spec.rollout_pool)
    if learner is None or rollout is None or learner.name == rollout.name:
        return []
    if learner.slice.ray_pod_type != rollout.slice.ray_pod_type:
        return []
    return [
        ConfigProblem(
            f"{KEY}.rolloutPool",
            spec.rollout_pool,
            f"its slices are {rollout.slice.ray_pod_type}, like the learner's: the learner "
            "reserves a slice by Ray's head resource of that shape and could take the engines' "
            "slice; allowed: a rollout pool of another slice shape (e.g. a smaller topology) "
            "or a GPU pool",
        )
    ]


def _workload_problems(rl: RlPlan) -> list[ConfigProblem]:
    """The entrypoint's flags through the workload's own rules, named by their stack key."""
    from infra.plan.rl import rl_flags
    from workloads.flags import ConfigError as RlError
    from workloads.rl.config import RLRunConfig
    from workloads.rl.config_check import validate

    fields = rl_flags(rl)
    try:
        validate(RLRunConfig.from_dict(fields))
    except RlError as err:
        message = str(err)
        field = refused_field(message)
        value: Any = fields.get(field)
        if field in POOL_FLAGS:
            key, value = f"{KEY}.learnerPool", rl.spec.learner_pool
        elif field in _ROLLOUT_FLAGS:
            key, value = f"{KEY}.rolloutPool", rl.spec.rollout_pool
        elif field == "num_workers" or field == "prompts_per_step":
            key, value = f"{KEY}.promptsPerStep", rl.spec.prompts_per_step
        elif field in ("rewards", "reward_weights"):
            key = f"{KEY}.{to_camel(field)}"
            value = getattr(rl.spec, field)
        elif field:
            key = f"{KEY}.{stack_key(RLRunConfig, field)}"
        else:
            key = KEY
        return [ConfigProblem(key, value, f"the RL workload refuses it: {message}")]
    return []


def _model_problems(plan: StackPlan, rl: RlPlan) -> list[ConfigProblem]:
    spec, key = rl.spec, f"{KEY}.model"
    if not spec.model:
        return []  # the workload's own rule says it is required
    if rl.facts.error:
        return [ConfigProblem(key, spec.model, rl.facts.error)]
    facts = rl.facts.facts
    if facts is None:
        return []  # a warning: the fits did not run
    problems = []
    refusal = training_refusal(facts)
    if refusal:
        problems.append(ConfigProblem(key, spec.model, f"the learner refuses it: {refusal}"))
    problems += [
        ConfigProblem(key, spec.model, f"the rollout engines refuse it: {m}")
        for m in servable_problems(facts)
    ]
    length = rl.seq_len
    if facts.max_positions and length > facts.max_positions:
        problems.append(
            ConfigProblem(
                f"{KEY}.maxResponseTokens",
                spec.max_response_tokens,
                f"maxPromptTokens {spec.max_prompt_tokens} + maxResponseTokens "
                f"{spec.max_response_tokens} = {length} tokens, but {spec.model} has "
                f"{facts.max_positions} positions; allowed: a sum of at most {facts.max_positions}",
            )
        )
    if facts.gated and plan.spec.hf_token is None:
        problems.append(
            ConfigProblem(
                "park:hfToken",
                None,
                f"{spec.model} (park:rl.model) is gated on the Hugging Face hub: set "
                "park:hfToken as a secret",
            )
        )
    return problems


def _breakdown(fit: TrainingFit) -> str:
    return (
        f"{fit.total_bytes / GIB:.1f} GiB per chip (states {fit.states_bytes / GIB:.1f} + "
        f"activations {fit.activations_bytes / GIB:.1f} + logits {fit.logits_bytes / GIB:.1f} + "
        f"reserve {fit.reserve_bytes / GIB:.1f})"
    )


def _learner_fit(rl: RlPlan) -> list[ConfigProblem]:
    """The learner's step against a chip's memory (the training fit), and what would fit."""
    fit, facts = rl.fit, rl.facts.facts
    if fit is None or fit.fits or facts is None:
        return []
    spec, tpu = rl.spec, rl.learner.slice
    training = learner_training(spec)
    would = []
    for change, overrides in (
        ("activationCheckpointing true", {"activation_checkpointing": True}),
        ("strategy fsdp2", {"strategy": "fsdp2"}),
        ("microBatchSize unset", {"pinned": None}),
    ):
        other = fit_training(facts, training, tpu, 1, **overrides)
        changed = spec.model_copy(update={"strategy": overrides.get("strategy", spec.strategy)})
        reference = reference_bytes(facts, changed, tpu.devices)
        if other is not None and other.total_bytes + reference <= other.usable_bytes:
            other = replace(other, params_bytes=other.params_bytes + reference)
            if other != fit:
                would.append(f"{change} (micro-batch {other.micro_batch}, {_breakdown(other)})")
    if spec.kl_coef:
        other = fit_training(facts, training, tpu, 1)
        if other is not None and other.fits:
            would.append(f"klCoef 0, no reference policy ({_breakdown(other)})")
    key: str = f"{KEY}.model"
    value: object = spec.model
    if spec.micro_batch_size is not None:
        key, value = f"{KEY}.microBatchSize", spec.micro_batch_size
    return [
        ConfigProblem(
            key,
            value,
            f"the learner does not fit a {tpu.generation.name} chip: {spec.model}"
            + (f" and its frozen reference (klCoef {spec.kl_coef})" if spec.kl_coef else "")
            + " under "
            f"{spec.strategy} on {rl.workers} chips ({KEY}.learnerPool {rl.learner.name}), "
            f"{rl.seq_len}-token sequences (maxPromptTokens + maxResponseTokens), micro-batch "
            f"{fit.micro_batch} x {fit.accumulation_steps} needs {_breakdown(fit)}, but the "
            f"runtime gives {fit.usable_bytes / GIB:.2f} GiB; "
            + (
                "would fit: " + "; ".join(would)
                if would
                else "allowed: fewer promptsPerStep x groupSize per chip, shorter sequences, "
                "a larger learner slice or a smaller model"
            ),
        )
    ]


def _rollout_problems(rl: RlPlan) -> list[ConfigProblem]:
    rollout, spec = rl.rollout, rl.spec
    key = f"{KEY}.tensorParallelSize"
    tp = rollout.tensor_parallel
    where = (
        f"a {rollout.tpu.slice.machine_type} {rollout.tpu.slice.topology} slice on {ROLLOUT_ENGINE}"
        if rollout.tpu
        else f"a {rollout.gpu.spec.machine_type} node ({rollout.gpu.spec.accelerator_count} GPUs)"
        if rollout.gpu
        else "the rollout pool"
    )
    wide = _wider_than_a_host(rl)
    if wide:
        return wide
    if tp not in rollout.options:
        return [
            ConfigProblem(
                key,
                tp,
                f"not a TP the serving rules allow for {spec.model} on {where}; allowed: "
                f"{', '.join(map(str, rollout.options)) or 'none (use another rollout pool)'}",
            )
        ]
    fit = rollout.fit
    if fit is None or fit.fits:
        return []
    need = fit.weights_gib + fit.reserve_gib + fit.kv_gib_per_sequence
    return [
        ConfigProblem(
            key if spec.tensor_parallel_size else f"{KEY}.maxResponseTokens",
            tp if spec.tensor_parallel_size else spec.max_response_tokens,
            f"a rollout engine of {spec.model} at TP {tp} with {rollout.max_model_len}-token "
            f"sequences needs {need:.2f} GiB per chip (weights {fit.weights_gib:.2f} + reserve "
            f"{fit.reserve_gib:.2f} + one sequence's KV {fit.kv_gib_per_sequence:.2f}) but gets "
            f"{fit.usable_gib:.2f} GiB on {where}; allowed: a TP of "
            f"{', '.join(map(str, rollout.options))} that fits, shorter maxPromptTokens + "
            "maxResponseTokens, or a larger rollout slice",
        )
    ]


def _wider_than_a_host(rl: RlPlan) -> list[ConfigProblem]:
    """An engine whose TP spans hosts: each engine loads every weight version from a folder in
    its own host's memory (workloads/rl/sync.py HostReceiver), which the TP ranks on another host
    cannot read, so an engine's TP is at most one host's devices."""
    rollout, spec = rl.rollout, rl.spec
    tpu = rollout.tpu.slice if rollout.tpu else None
    if tpu is None or rollout.tensor_parallel <= tpu.devices_per_host:
        return []
    word, limit = tpu.device_word, tpu.devices_per_host
    hosts = -(-rollout.tensor_parallel // limit)
    within = [t for t in rollout.options if t <= limit]
    allowed = (
        f"a TP of {', '.join(map(str, within))}"
        if within
        else f"none on this slice ({ROLLOUT_ENGINE}: "
        f"{engine.tensor_parallel_rule(ROLLOUT_ENGINE, tpu)}): a single-host rollout pool"
    )
    set_by = "" if spec.tensor_parallel_size else " (tensorParallelSize unset: the slice's TP)"
    return [
        ConfigProblem(
            f"{KEY}.tensorParallelSize" if spec.tensor_parallel_size else f"{KEY}.rolloutPool",
            rollout.tensor_parallel if spec.tensor_parallel_size else spec.rollout_pool,
            f"a rollout engine at TP {rollout.tensor_parallel}{set_by} spans "
            f"{hosts} hosts of the {tpu.machine_type} {tpu.topology} "
            f"slice, but the host limit is {limit} {word}s per host: each engine loads the "
            "weights from a folder in its own host's memory (workloads/rl/sync.py), which ranks "
            f"on other hosts cannot read; allowed: {allowed}",
        )
    ]


def rl_warnings(plan: StackPlan) -> list[ConfigProblem]:
    """Valid but unchecked: a model whose facts are unknown here, a GPU pool's engine fit."""
    rl = plan.rl
    if rl is None:
        return []
    found = []
    if rl.facts.facts is None and rl.facts.error is None:
        found.append(
            ConfigProblem(
                f"{KEY}.model",
                rl.spec.model,
                f"no model facts here ({rl.facts.reason}): neither the learner's nor the "
                "engines' memory check ran",
            )
        )
    if rl.rollout.kind == "gpu":
        found.append(
            ConfigProblem(
                f"{KEY}.rolloutPool",
                rl.spec.rollout_pool,
                "a GPU pool: the engines' memory fit is a TPU model here and did not run",
            )
        )
    return found
