"""The resolve step: every number and name derived from the stack spec, computed once.

`resolve(spec)` turns a typed StackConfig into a frozen StackPlan: per TPU pool its slice (from
the catalog) and totals; training's workers, slices and hosts; per served model its tensor
parallel size and the slices it holds; the serving pool's slice budget; the stack's cloud
names and images. Rules, plan functions, cost, docs, the CLI and `park local` read these
fields; nothing else multiplies chips by slices.

The serving rule (one rule, used by validation, the RayService, the node pools and cost):
Ray 2.60 Serve LLM gives every replica of an LLMConfig whose `accelerator_config` names a
topology a SlicePlacementGroup of that whole topology (`ray/llm/_internal/serve/core/configs/
accelerators.py` TPUAccelerator.create_placement_group → `ray/util/tpu.py`
get_tpu_worker_resources: bundles = every chip of the topology, whatever the TP), and a
multi-host slice is claimed through its head resource. So a replica holds one whole slice:
slices needed = the sum of the models' replicas, and idle chips = slice chips - TP.
The budget is the pool's slices, halved when upgrades build a second cluster beside the first
(`upgradeStrategy` NewCluster*: blue/green needs room for both).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from infra import catalog, engine, engines, gke, images, model_facts, model_lookup, names
from infra.model_facts import FactsLookup
from infra.ray_serve import SERVE_START_ATTEMPTS_PER_REPLICA
from infra.resolve import disk, disk_plan
from infra.resolve.disk import DiskPlan
from infra.resolve.rl import resolve_rl
from infra.resolve.training import (
    RunLimits,
    fit_training,
    micro_batches,
    run_limits,
    training_model_facts,
)
from infra.resolve.types import (
    CHECKPOINTS_PREFIX,
    WORKLOAD_IMAGE,
    GpuPoolPlan,
    ModelWait,
    PoolPlan,
    RlPlan,
    ServedModelPlan,
    ServingPlan,
    TrainingPlan,
)
from infra.schema.errors import ConfigProblem
from infra.schema.models import (
    RL_SOURCE,
    TRAINING_SOURCE,
    ServedModel,
    ServingConfig,
    StackConfig,
    TpuPoolConfig,
    TrainingConfig,
)
from workloads import protocol


@dataclass(frozen=True)
class StackPlan:
    """A validated stack with everything derived from it."""

    spec: StackConfig
    names: names.StackNames
    tpu_pools: tuple[PoolPlan, ...]
    gpu_pools: tuple[GpuPoolPlan, ...]
    training: TrainingPlan | None
    serving: ServingPlan | None
    cluster_version: gke.GkeVersion  # the pin, or the release channel's default
    warnings: tuple[ConfigProblem, ...] = ()  # valid, but worth saying (infra.rules.warnings)
    disk: DiskPlan | None = None  # scratch, file caches, boot disks, host memory
    rl: RlPlan | None = None  # park:rl's GRPO job (infra.resolve.rl)
    # The images `pulumi up` builds from this checkout and pushes before any pod runs them
    # (infra.images); none for a workload that pins its image.
    images: tuple[images.ImageBuild, ...] = ()

    @property
    def stack(self) -> str:
        return self.spec.stack

    def pool(self, name: str) -> PoolPlan:
        for pool in self.tpu_pools:
            if pool.name == name:
                return pool
        raise KeyError(f"no TPU pool {name!r}")

    @property
    def kubernetes_version(self) -> str:
        """The Kubernetes minor the cluster runs, for schema checks: ``1.35.0``."""
        return f"{self.cluster_version.major}.{self.cluster_version.minor}.0"

    @property
    def multi_host(self) -> bool:
        """Any multi-host slice: KubeRay then needs the TPU webhook."""
        return any(p.slice.multi_host for p in self.tpu_pools)

    @property
    def queued(self) -> bool:
        """A rung of some pool is DWS's queued provisioning (Kueue's ProvisioningRequest check)."""
        return any(p.queued for p in self.tpu_pools)

    @property
    def kueue_pools(self) -> tuple[PoolPlan, ...]:
        """The pools whose jobs wait in a Kueue queue (a queued rung, or a ladder)."""
        return tuple(p for p in self.tpu_pools if p.kueue)

    @property
    def total_chips(self) -> int:
        return sum(p.total_chips for p in self.tpu_pools)

    @property
    def total_hosts(self) -> int:
        return sum(p.total_hosts for p in self.tpu_pools)

    @property
    def total_slices(self) -> int:
        return sum(p.slices for p in self.tpu_pools)


# ---- one function per derived fact ---------------------------------------------------------


def resolve_pool(spec: TpuPoolConfig, index: int = 0) -> PoolPlan:
    """A TPU pool's slice and totals; raises catalog.CatalogError for an unknown pair."""
    tpu = catalog.lookup(spec.machine_type, spec.topology)
    return PoolPlan(
        index=index,
        spec=spec,
        slice=tpu,
        total_chips=tpu.chips * spec.slices,
        total_hosts=tpu.hosts * spec.slices,
    )


def training_workers(pool: PoolPlan, slices: int) -> tuple[int, int]:
    """(workers, hosts) of a run on `slices` slices: one worker per device (a chip but on
    TPU7x, two per chip), one pod per host."""
    return pool.slice.devices * slices, pool.slice.hosts * slices


def export_path(storage_path: str, run_name: str, spec: TrainingConfig) -> str | None:
    """Where a training run's final Hugging Face export lands (workloads/protocol.py's rule),
    for a run that exports one: a `model` run with `export` on."""
    if not (spec.model and spec.export):
        return None
    return protocol.training_export_path(storage_path, run_name)


@dataclass(frozen=True)
class RunExport:
    """What a served model with `source: training` or `source: rl` serves: the run's final
    export, the model the run started from (whose facts are the export's), and the run's
    limits (when its export exists or never will)."""

    export_path: str | None
    base_model: str | None
    model_key: str  # the stack key naming that model, for messages
    limits: RunLimits
    job: str  # the RayJob that writes it, for messages


def _run_export(
    model: ServedModel, training: TrainingPlan | None, rl: RlPlan | None
) -> RunExport | None:
    if model.source == TRAINING_SOURCE and training is not None:
        return RunExport(
            training.export_path,
            training.spec.model,
            "park:training.model",
            training.limits,
            f"the training RayJob {names.TRAINING_JOB_NAME}",
        )
    if model.source == RL_SOURCE and rl is not None:
        # The RL job's deadlines as its RayJob renders them (infra/plan/rl.py); its learner
        # does not wait for a staged model.
        limits = run_limits(rl.spec.active_deadline_seconds, rl.spec.backoff_limit, None)
        return RunExport(
            rl.export_path, rl.spec.model or None, "park:rl.model", limits, "the RL RayJob"
        )
    return None


def served_model_wait(
    model: ServedModel, run: RunExport | None, facts: FactsLookup
) -> ModelWait | None:
    """A run's export: wait for its marker as long as the run may take to write it. A hub
    model: for its staged copy's marker as long as its staging may take. Else no wait."""
    if run is not None:
        return ModelWait(
            run.limits.export_within_s, protocol.EXPORT_MARKER, f"{run.job} (its final export)"
        )
    if disk.needs_staging(model.source):
        weights = model_facts.weights_bytes(facts.facts)
        return ModelWait(
            disk.stage_timeout_s(weights),
            protocol.STAGED_MARKER,
            f"its stage Job (park stage-model; {model.source})",
        )
    return None


def resolve_served_model(
    model: ServedModel, index: int, tpu: catalog.TpuSlice, run: RunExport | None
) -> ServedModelPlan:
    tp = model.tensor_parallel_size or tpu.devices  # every device of one slice
    source: str | None = model.source
    base = model.base_model
    from_run = model.source in (TRAINING_SOURCE, RL_SOURCE)
    if from_run:
        # The trained weights have the base model's architecture: its facts are the export's.
        source = run.export_path if run else None
        base = base or (run.base_model if run else None)
    if base:
        facts = model_lookup.lookup(base)
    elif from_run:
        named = run.model_key if run else f"the {model.source} run"
        facts = FactsLookup(None, (), f"{named} names no Hugging Face model")
    else:
        facts = model_lookup.lookup(model.source)
    kwargs = model.engine_kwargs
    # Settled once: the fit costs this batch and the rendered engine_kwargs pin it.
    settings = engine.EngineSettings.from_engine_kwargs(
        kwargs, expert_parallel=model.enable_expert_parallel
    ).pinned(model.max_model_len)
    utilization = settings.memory_utilization
    fit = None
    if facts.facts is not None and tp > 0:
        fit = engine.fit(facts.facts, tpu, tp, model.max_model_len, settings=settings)
    return ServedModelPlan(
        index=index,
        spec=model,
        source=source,
        base_model=base,
        tensor_parallel=tp,
        min_slices=model.min_replicas,
        max_slices=model.max_replicas,
        idle_devices_per_replica=max(tpu.devices - tp, 0),
        facts=facts,
        fit=fit,
        memory_utilization=utilization,
        wait=served_model_wait(model, run, facts),
        # Ray 2.60 allows min(this, replicas x RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT), which the
        # pods set to the same per-replica count (serve_tuning.ray_env): so the threshold is
        # that count for every replica Serve wants, whatever the autoscaler's target.
        start_attempts=SERVE_START_ATTEMPTS_PER_REPLICA * max(model.max_replicas, 1),
        settings=settings,
        drain_s=engine.max_stream_s(tpu, model.max_model_len, utilization),
    )


def upgrade_clusters(strategy: str) -> int:
    """Ray clusters a RayService holds while it upgrades: blue/green builds a second one."""
    return 2 if strategy.startswith("NewCluster") else 1


def image_name(section: TrainingConfig | ServingConfig) -> str:
    """Which of our images a section's pods run when it pins none."""
    if isinstance(section, ServingConfig):
        return engines.get(section.engine).image
    return WORKLOAD_IMAGE


def image(spec: StackConfig, registry_url: str, section: TrainingConfig | ServingConfig) -> str:
    """The configured image, else ours in the stack's registry, tagged by its content."""
    if section.image:
        return section.image
    return images.default_ref(registry_url, image_name(section))


def image_builds(
    spec: StackConfig, registry_url: str, rl: RlPlan | None
) -> tuple[images.ImageBuild, ...]:
    """The images the stack's pods run and the stack pins none of: `pulumi up` builds them."""
    wanted: dict[str, list[str]] = {}
    for key, section in (("park:training", spec.training), ("park:serving", spec.serving)):
        if section.enabled and not section.image:
            wanted.setdefault(image_name(section), []).append(key)
    if rl is not None and not rl.spec.image:
        wanted.setdefault(WORKLOAD_IMAGE, []).append("park:rl")
    return images.builds(registry_url, wanted)


def _names(spec: StackConfig) -> names.StackNames:
    return names.stack_names(
        project=spec.project,
        region=spec.region,
        stack=spec.stack,
        cluster=spec.cluster.name,
        namespace=spec.namespace,
        bucket=spec.storage.bucket,
        registry_repository=spec.registry.repository,
    )


def resolve(spec: StackConfig, *, partial: bool = False) -> StackPlan:
    """The StackPlan of a stack spec.

    With `partial`, what cannot be resolved (a pool the catalog does not know, a workload on a
    missing pool) is left out instead of raising: the rules use this to report every problem
    at once. The program and the tools resolve a validated spec, where nothing is left out.
    """
    stack_names = _names(spec)
    pools = []
    for i, pool_spec in enumerate(spec.tpu_pools):
        try:
            pools.append(resolve_pool(pool_spec, i))
        except catalog.CatalogError:
            if not partial:
                raise
    by_name = {p.name: p for p in pools}
    gpus = tuple(
        GpuPoolPlan(i, g, g.accelerator_count * g.nodes) for i, g in enumerate(spec.gpu_pools)
    )

    training = None
    if spec.training.enabled and (spec.training.pool in by_name or not partial):
        pool = by_name[spec.training.pool]
        slices = spec.training.num_slices
        workers, hosts = training_workers(pool, slices)
        run_name = names.run_name(spec.stack, names.TRAINING_JOB_NAME, spec.training.run_id)
        storage_path = f"gs://{stack_names.bucket}/{CHECKPOINTS_PREFIX}"
        facts = training_model_facts(spec.training)
        fit = None
        if facts.facts is not None:
            fit = fit_training(facts.facts, spec.training, pool.slice, slices)
        share = spec.training.global_batch_size // workers if workers else 0
        micro, accumulation = micro_batches(fit, spec.training.micro_batch_size, share)
        model_path = disk.trainer_model_source(spec.training, spec.storage.mount_path)
        # a staged copy (model_path is not the spec's source): wait for it as long as its
        # staging may take
        staged = model_path != spec.training.model
        wait = disk.stage_timeout_s(model_facts.weights_bytes(facts.facts)) if staged else None
        training = TrainingPlan(
            spec=spec.training,
            pool=pool,
            slices=slices,
            workers=workers,
            hosts=hosts,
            image=image(spec, stack_names.registry_url, spec.training),
            run_name=run_name,
            storage_path=storage_path,
            queue_name=names.local_queue_name(pool.name) if pool.kueue else None,
            export_path=export_path(storage_path, run_name, spec.training),
            model_path=model_path,
            limits=run_limits(
                spec.training.active_deadline_seconds, spec.training.backoff_limit, wait
            ),
            facts=facts,
            fit=fit,
            micro_batch=micro,
            accumulation_steps=accumulation,
        )

    gpu_by_name = {g.spec.name: g for g in gpus}
    rl = resolve_rl(spec, by_name, gpu_by_name, stack_names, partial=partial)

    cluster = spec.cluster
    pinned = cluster.version if gke.parse(cluster.version or "") else None  # rules say why not
    cluster_version = gke.cluster_version(cluster.release_channel, pinned)
    serving = None
    if spec.serving.enabled and (spec.serving.pool in by_name or not partial):
        pool = by_name[spec.serving.pool]
        models = tuple(
            resolve_served_model(m, i, pool.slice, _run_export(m, training, rl))
            for i, m in enumerate(spec.serving.models)
        )
        clusters = upgrade_clusters(spec.serving.upgrade_strategy)
        serving = ServingPlan(
            spec=spec.serving,
            pool=pool,
            models=models,
            image=image(spec, stack_names.registry_url, spec.serving),
            min_slices=sum(m.min_slices for m in models),
            max_slices=sum(m.max_slices for m in models),
            slice_budget=pool.slices // clusters,
            upgrade_clusters=clusters,
            kuberay=(
                spec.kuberay.version
                if spec.kuberay.install == "helm"
                else gke.addon_kuberay(cluster_version).version
            ),
        )

    plan = StackPlan(
        spec=spec,
        names=stack_names,
        tpu_pools=tuple(pools),
        gpu_pools=gpus,
        training=training,
        serving=serving,
        cluster_version=cluster_version,
        rl=rl,
        images=image_builds(spec, stack_names.registry_url, rl),
    )
    built = disk_plan.build(spec, stack_names, tuple(pools), training, serving, rl)
    return replace(plan, disk=built)
