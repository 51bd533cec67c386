"""Rules for the training RayJob and the serving RayService, on the resolved StackPlan.

Workers, slices and tensor-parallel sizes are read from the plan (infra.resolve), never worked
out here: validation and the manifests agree because they read the same numbers.
"""

from __future__ import annotations

from pydantic.alias_generators import to_camel

from infra import catalog, engine, engines, model_facts
from infra.resolve import ServedModelPlan, StackPlan
from infra.rules import capacity, training_memory, workload_flags
from infra.schema.errors import ConfigProblem
from infra.schema.models import RL_SOURCE, TRAINING_SOURCE, StackConfig
from infra.versions import RAY_MULTISLICE_TORCH_MIN, RAY_VERSION, version_tuple
from workloads.train.models import model_rules

# Engine arguments the stack sets from its own keys.
RESERVED_ENGINE_KWARGS = ("tensor_parallel_size", "max_model_len", "enable_expert_parallel")


def _devices(tpu: catalog.TpuSlice) -> str:
    """What a slice offers TP, e.g. 8 chips, 4 per host; on TPU7x its devices too."""
    if tpu.devices == tpu.chips:
        return f"{tpu.chips} chips, {tpu.chips_per_host} per host"
    return f"{tpu.chips} chips, {tpu.devices} devices, {tpu.devices_per_host} per host"


def _pool_ref(key: str, name: str, config: StackConfig) -> list[ConfigProblem]:
    names = [p.name for p in config.tpu_pools]
    if name in names:
        return []
    return [
        ConfigProblem(
            key,
            name,
            f"must name a TPU pool of park:tpuPools; allowed: {', '.join(names) or '(none)'}",
        )
    ]


def check_training(plan: StackPlan) -> list[ConfigProblem]:
    spec = plan.spec.training
    if not spec.enabled:
        return []
    problems = _pool_ref("park:training.pool", spec.pool, plan.spec)
    training = plan.training
    if problems or training is None:
        return problems  # the pool's own problem is reported under park:tpuPools
    pool = training.pool
    if training.slices > pool.slices:
        problems.append(
            ConfigProblem(
                "park:training.numSlices",
                training.slices,
                f"pool {pool.name} has {pool.slices} slice(s); allowed: 1..{pool.slices}",
            )
        )
    if training.slices > 1 and version_tuple(RAY_VERSION) < RAY_MULTISLICE_TORCH_MIN:
        problems.append(
            ConfigProblem(
                "park:training.numSlices",
                training.slices,
                f"the pinned Ray {RAY_VERSION} cannot train PyTorch across slices "
                f"(needs ≥ {'.'.join(map(str, RAY_MULTISLICE_TORCH_MIN))}); use 1",
            )
        )
    if spec.global_batch_size % training.workers:
        problems.append(
            ConfigProblem(
                "park:training.globalBatchSize",
                spec.global_batch_size,
                f"must be a multiple of the {training.workers} workers (one per chip)",
            )
        )
    serving = plan.spec.serving
    if serving.enabled and serving.pool == spec.pool:
        problems.append(
            ConfigProblem(
                "park:training.pool",
                spec.pool,
                "training and serving must use different pools (a slice runs one of them)",
            )
        )
    problems += capacity.training_pool_problems(training)
    problems += workload_flags.trainer_problems(plan)
    problems += _training_model_problems(plan)
    problems += training_memory.fit_problems(plan)
    return problems


def _training_model_problems(plan: StackPlan) -> list[ConfigProblem]:
    """The model the run starts from: one the trainer can train, reachable with the stack's
    credentials."""
    spec = plan.spec.training
    if not spec.model:
        return []
    assert plan.training is not None
    facts = plan.training.facts  # looked up once, by the resolve step
    problems = []
    if facts.error:
        problems.append(ConfigProblem("park:training.model", spec.model, facts.error))
    known = facts.facts
    reason = training_refusal(known) if known is not None else None
    if reason is not None:
        problems.append(ConfigProblem(model_rules.KEY, spec.model, reason))
    if known is not None and known.gated and plan.spec.hf_token is None:
        problems.append(_needs_token(f"{spec.model} (park:training.model)", "trainer"))
    return problems


def training_refusal(facts: model_facts.ModelFacts) -> str | None:
    """Why the trainer would refuse this model, in the worker's words: the one rule set
    (workloads/train/models/model_rules.py) asked of the facts read from the same config.json."""
    traits = model_rules.ModelTraits(
        architecture=facts.architecture,
        model_type=facts.model_type,
        experts=facts.experts,
        multimodal=facts.multimodal,
    )
    return model_rules.refusal(traits)


def _needs_token(model: str, downloader: str) -> ConfigProblem:
    return ConfigProblem(
        "park:hfToken",
        None,
        f"{model} is gated on the Hugging Face hub: the {downloader} cannot download it "
        "without a token; set it as a secret (pulumi config set --secret park:hfToken "
        "<token>) or as fn::secret in an ESC environment",
    )


def _run_source_problems(plan: StackPlan, model: ServedModelPlan) -> list[ConfigProblem]:
    """`source: training` or `source: rl` needs that run, writing a Hugging Face export."""
    if model.spec.source == RL_SOURCE:
        key, rl = f"{model.key}.source", plan.spec.rl
        if not rl.enabled:
            return [ConfigProblem(key, RL_SOURCE, "serves the RL run, but park:rl is not enabled")]
        if not rl.export:
            return [
                ConfigProblem(
                    key, RL_SOURCE, "the RL run does not export (park:rl.export is false)"
                )
            ]
        return []
    key, training = f"{model.key}.source", plan.spec.training
    if not training.enabled:
        return [
            ConfigProblem(
                key, TRAINING_SOURCE, "serves the training run, but park:training is not enabled"
            )
        ]
    if not training.model:
        return [
            ConfigProblem(
                key,
                TRAINING_SOURCE,
                "the training run trains a GPT preset, which "
                "exports nothing servable; set park:training.model",
            )
        ]
    if not training.export:
        return [
            ConfigProblem(
                key,
                TRAINING_SOURCE,
                "the training run does not export (park:training.export is false)",
            )
        ]
    return []


def check_serving(plan: StackPlan) -> list[ConfigProblem]:
    spec = plan.spec.serving
    if not spec.enabled:
        return []
    problems = _pool_ref("park:serving.pool", spec.pool, plan.spec)
    if not spec.models:
        problems.append(
            ConfigProblem("park:serving.models", [], "serving is enabled but serves no model")
        )
    serving = plan.serving
    if problems or serving is None:
        return problems
    pool = serving.pool
    tpu = pool.slice
    problems += capacity.serving_pool_problems(pool, spec.pool)
    if tpu.ray_hosts != tpu.hosts:
        # Ray Serve LLM sizes a slice's placement group from the topology alone, as Ray places
        # the generation's slices (catalog.TpuGeneration.ray_single_vm_topologies): it does not
        # pass chips_per_vm.
        problems.append(
            ConfigProblem(
                "park:serving.pool",
                spec.pool,
                f"Ray {RAY_VERSION} Serve LLM assumes {tpu.topology} is {tpu.ray_hosts} host(s), "
                f"but on {tpu.machine_type} it is {tpu.hosts}: the placement group would be "
                f"misshaped; serve from a pool of another machine type or topology",
            )
        )
    names: set[str] = set()
    held = 0
    limit = engines.get(spec.engine).multi_host_slices_per_cluster
    for model in serving.models:
        prefix, model_spec = model.key, model.spec
        if model_spec.name in names:
            problems.append(
                ConfigProblem(f"{prefix}.name", model_spec.name, "duplicate model name")
            )
        names.add(model_spec.name)
        if model.from_training:
            problems += _run_source_problems(plan, model)
        problems += _model_problems(plan, model)
        if model_spec.min_replicas > model_spec.max_replicas:
            problems.append(
                ConfigProblem(
                    f"{prefix}.minReplicas",
                    model_spec.min_replicas,
                    f"must not exceed maxReplicas ({model_spec.max_replicas})",
                )
            )
        held += model.max_slices
        if held > serving.slice_budget and held - model.max_slices <= serving.slice_budget:
            problems.append(_over_budget(plan, model.index))
        elif (
            limit is not None
            and tpu.multi_host
            and held > limit
            and held - model.max_slices <= limit
        ):
            problems.append(_one_multi_host_slice(plan, model.index))
        for key in sorted(set(RESERVED_ENGINE_KWARGS) & set(model_spec.engine_kwargs)):
            problems.append(
                ConfigProblem(
                    f"{prefix}.engineKwargs.{key}",
                    model_spec.engine_kwargs[key],
                    f"set it with its own key ({to_camel(key)}), not engineKwargs",
                )
            )
    if plan.spec.hf_token is None:
        # Only a model the engine downloads from the hub needs the token (not one on the
        # bucket, such as a training run's export, whose base model may be gated).
        gated = [
            m
            for m in serving.models
            if m.facts.facts
            and m.facts.facts.gated
            and m.source is not None
            and model_facts.is_hub_id(m.source)
        ]
        for model in gated:
            problems.append(_needs_token(f"{model.spec.source} ({model.key})", "engine"))
    return problems


def _model_problems(plan: StackPlan, model: ServedModelPlan) -> list[ConfigProblem]:
    """One served model against the engine's rules and the slice (infra.engine)."""
    serving = plan.serving
    assert serving is not None
    tpu, engine_name, spec = serving.pool.slice, serving.spec.engine, model.spec
    prefix, tp, facts = model.key, model.tensor_parallel, model.facts.facts
    problems: list[ConfigProblem] = []
    if model.facts.error:
        problems.append(ConfigProblem(f"{prefix}.source", spec.source, model.facts.error))
    options = engine.tensor_parallel_options(engine_name, tpu)
    if tp not in options:
        why = engine.tensor_parallel_rule(engine_name, tpu)
        problems.append(
            ConfigProblem(
                f"{prefix}.tensorParallelSize",
                tp,
                f"does not fit a {tpu.machine_type} {tpu.topology} slice ({_devices(tpu)}) on "
                f"{engine_name}: {why}; allowed: "
                f"{', '.join(map(str, options))}",
            )
        )
    if facts is None:
        return problems
    name = spec.source
    problems += [
        ConfigProblem(f"{prefix}.source", name, message) for message in servable_problems(facts)
    ]
    heads = engine.head_problems(facts, tp)
    if heads:
        allowed = engine.allowed_tensor_parallel(engine_name, tpu, facts)
        problems.append(
            ConfigProblem(
                f"{prefix}.tensorParallelSize",
                tp,
                f"{name}: {'; '.join(heads)}; TP this model allows on this slice: "
                f"{', '.join(map(str, allowed)) or 'none (serve it from another slice shape)'}",
            )
        )
    if facts.max_positions and spec.max_model_len > facts.max_positions:
        problems.append(
            ConfigProblem(
                f"{prefix}.maxModelLen",
                spec.max_model_len,
                f"{name} has {facts.max_positions} positions (max_position_embeddings); at most "
                f"{facts.max_positions}",
            )
        )
    if spec.enable_expert_parallel and not facts.moe:
        problems.append(
            ConfigProblem(
                f"{prefix}.enableExpertParallel",
                True,
                f"{name} is dense ({facts.architecture}, no experts): expert parallel is for "
                "MoE models",
            )
        )
    spread = engine.expert_parallel_problem(facts, tp) if spec.enable_expert_parallel else None
    if spread:
        allowed = [
            t
            for t in engine.allowed_tensor_parallel(engine_name, tpu, facts)
            if not engine.expert_parallel_problem(facts, t)
        ]
        problems.append(
            ConfigProblem(
                f"{prefix}.enableExpertParallel",
                True,
                f"{name} with tensorParallelSize {tp}: {spread}; allowed: tensorParallelSize at "
                f"most {facts.experts} with expert parallel (on this slice: "
                f"{', '.join(map(str, allowed)) or 'none'}), or enableExpertParallel false "
                "(each expert then split by TP)",
            )
        )
    fit = model.fit
    if fit is not None and not heads and not spread and not fit.fits:
        problems.append(_misfit(plan, model, fit, facts))
    return problems


def _misfit(
    plan: StackPlan, model: ServedModelPlan, fit: engine.Fit, facts: model_facts.ModelFacts
) -> ConfigProblem:
    """A served model the engine could not start: the per-chip budget, and what would fit."""
    serving = plan.serving
    assert serving is not None
    tpu, spec = serving.pool.slice, model.spec
    advice = engine.advise(fit, facts, serving.spec.engine, tpu)
    need = fit.weights_gib + fit.reserve_gib + fit.kv_gib_per_sequence
    weights = f"weights {fit.weights_gib:.2f}"
    if fit.experts_per_chip:
        weights += f" ({fit.experts_per_chip} whole experts per chip at EP {fit.expert_parallel})"
    options = []
    if advice.max_model_len:
        options.append(f"maxModelLen {advice.max_model_len} fits at TP {fit.tensor_parallel}")
    if advice.tensor_parallel:
        options.append(
            f"tensorParallelSize {' or '.join(map(str, advice.tensor_parallel))} fits this context"
        )
    if advice.slices:
        options.append(f"a larger slice fits it: {', '.join(advice.slices)}")
    return ConfigProblem(
        f"{model.key}.maxModelLen",
        spec.max_model_len,
        f"{spec.source} at TP {fit.tensor_parallel} needs {need:.2f} GiB per chip ({weights} + "
        f"engine reserve {fit.reserve_gib:.2f}: activations of a {fit.max_num_batched_tokens}-"
        f"token batch {fit.activations_gib:.2f}, sampler logits {fit.sampler_gib:.2f}, runtime "
        f"margin {fit.margin_gib:.2f} + KV of one {spec.max_model_len}-token sequence "
        f"{fit.kv_gib_per_sequence:.2f}), but a {tpu.generation.name} chip gives the engine "
        f"{fit.usable_gib:.2f} GiB ({fit.runtime_hbm_gib:.2f} GiB as the runtime reports it x "
        f"gpu_memory_utilization {fit.memory_utilization}); "
        + ("; ".join(options) if options else "nothing on this generation fits it at this context"),
    )


def servable_problems(facts: model_facts.ModelFacts) -> list[str]:
    """What stops the pinned vLLM serving a model at all, whatever the slice: `park validate`
    asks it of each served model, `park local` of the folder it serves on CPU."""
    if facts.architecture and facts.architecture not in model_facts.served_architectures():
        return [
            f"architecture {facts.architecture} is not one vLLM "
            f"{engines.get(engines.DEFAULT_ENGINE).version} serves "
            "(infra/data/vllm_architectures.yaml)"
        ]
    return []


def _one_multi_host_slice(plan: StackPlan, index: int) -> ConfigProblem:
    serving = plan.serving
    assert serving is not None
    model, record = serving.models[index], engines.get(serving.spec.engine)
    return ConfigProblem(
        f"{model.key}.maxReplicas",
        model.spec.max_replicas,
        f"the served models need {serving.max_slices} multi-host {serving.pool.slice.topology} "
        f"slices in one RayService cluster, but {record.name} {record.version}'s Ray executor "
        "builds its slice from every TPU host of the cluster (RayDistributedExecutorV2."
        f"_slice_host_layout): one cluster can serve {record.multi_host_slices_per_cluster} "
        "multi-host slice(s); serve one replica of one model per RayService",
    )


def serving_warnings(plan: StackPlan) -> list[ConfigProblem]:
    """Served models whose facts are unknown here, and an engine whose rules were not read:
    their checks did not run, or ran on an assumption."""
    if plan.serving is None:
        return []
    warnings = []
    assumes = engines.get(plan.serving.spec.engine).fit_assumes
    if assumes:
        warnings.append(ConfigProblem("park:serving.engine", plan.serving.spec.engine, assumes))
    warnings += capacity.spot_serving_warnings(plan.serving)
    for model in plan.serving.models:
        lookup = model.facts
        if lookup.facts is None and lookup.error is None:
            warnings.append(
                ConfigProblem(
                    f"{model.key}.source",
                    model.spec.source,
                    f"no model facts here ({lookup.reason}; tried "
                    f"{', '.join(lookup.tried) or 'nothing'}): the head, context and memory "
                    "checks did not run; point source at a local folder with config.json, run "
                    "online (unset HF_HUB_OFFLINE) or add the model to "
                    "infra/data/models/catalogue.yaml",
                )
            )
    return warnings


def _over_budget(plan: StackPlan, index: int) -> ConfigProblem:
    """The model whose maxReplicas takes the served models past the pool's slice budget."""
    serving = plan.serving
    assert serving is not None
    model = serving.models[index]
    pool = serving.pool
    budget = f"pool {pool.name} has {pool.slices} slice(s)"
    if serving.upgrade_clusters > 1:
        budget += (
            f", half of them for upgradeStrategy {serving.spec.upgrade_strategy} (a second "
            f"cluster runs beside the first while it upgrades): {serving.slice_budget}"
        )
    return ConfigProblem(
        f"{model.key}.maxReplicas",
        model.spec.max_replicas,
        f"the served models need {serving.max_slices} slice(s) at maxReplicas (each replica "
        f"holds a whole {pool.slice.topology} slice, whatever its TP), but {budget}",
    )
