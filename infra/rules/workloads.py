"""Rules for the training RayJob and the serving RayService, on the resolved StackPlan.

Workers, slices and tensor-parallel sizes are read from the plan (infra.resolve), never worked
out here: validation and the manifests agree because they read the same numbers.
"""

from __future__ import annotations

from pydantic.alias_generators import to_camel

from infra import catalog
from infra.resolve import StackPlan
from infra.spec.errors import ConfigProblem
from infra.spec.models import StackConfig
from infra.versions import RAY_MULTISLICE_TORCH_MIN, RAY_VERSION, version_tuple

# Where the pinned Ray's TPU serving maths disagrees with GKE: (generation, topology) → hosts
# Ray assumes: ray/_private/accelerators/tpu.py get_chips_per_host takes a v6e topology of up
# to 8 chips as one 8-chip VM unless told chips_per_vm, which Serve LLM does not pass.
RAY_SERVE_HOSTS_BY_TOPOLOGY = {("v6e", "2x4"): 1}
# Engine arguments the stack sets from its own keys.
RESERVED_ENGINE_KWARGS = ("tensor_parallel_size", "max_model_len", "enable_expert_parallel")


def allowed_tensor_parallel(tpu: catalog.TpuSlice) -> list[int]:
    """TP sizes vLLM on TPU accepts on one slice: divisors of the chips, whole hosts past one
    (Ray Serve LLM's per-host bundles: TP beyond a host must be a multiple of its chips)."""
    return [
        tp
        for tp in range(1, tpu.chips + 1)
        if tpu.chips % tp == 0 and (tp <= tpu.chips_per_host or tp % tpu.chips_per_host == 0)
    ]


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
    return problems


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
    if pool.queued:
        problems.append(
            ConfigProblem(
                "park:serving.pool",
                spec.pool,
                "a queued pool only gets nodes for an admitted job that runs to completion; "
                "serve from an on-demand, spot, reservation or flex-start pool",
            )
        )
    ray_hosts = RAY_SERVE_HOSTS_BY_TOPOLOGY.get((tpu.generation.name, tpu.topology))
    if ray_hosts is not None and ray_hosts != tpu.hosts:
        # Ray Serve LLM sizes a slice's placement group from the topology alone.
        problems.append(
            ConfigProblem(
                "park:serving.pool",
                spec.pool,
                f"Ray {RAY_VERSION} Serve LLM assumes {tpu.topology} is {ray_hosts} host(s), but "
                f"on {tpu.machine_type} it is {tpu.hosts}: the placement group would be "
                f"misshaped; serve from a pool of another machine type or topology",
            )
        )
    allowed = allowed_tensor_parallel(tpu)
    names: set[str] = set()
    held = 0
    for model in serving.models:
        prefix, model_spec = model.key, model.spec
        if model_spec.name in names:
            problems.append(
                ConfigProblem(f"{prefix}.name", model_spec.name, "duplicate model name")
            )
        names.add(model_spec.name)
        if model.tensor_parallel not in allowed:
            problems.append(
                ConfigProblem(
                    f"{prefix}.tensorParallelSize",
                    model.tensor_parallel,
                    f"does not fit a {tpu.machine_type} {tpu.topology} slice ({tpu.chips} chips, "
                    f"{tpu.chips_per_host} per host); allowed: {', '.join(map(str, allowed))}",
                )
            )
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
        for key in sorted(set(RESERVED_ENGINE_KWARGS) & set(model_spec.engine_kwargs)):
            problems.append(
                ConfigProblem(
                    f"{prefix}.engineKwargs.{key}",
                    model_spec.engine_kwargs[key],
                    f"set it with its own key ({to_camel(key)}), not engineKwargs",
                )
            )
    return problems


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
