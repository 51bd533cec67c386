"""The Pulumi program: read the stack config, resolve and plan it, hand each plan to its component.

`pulumi up` runs it through the root `__main__.py`; `park render` runs it under mocks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi.runtime

from infra import stack
from infra.resolve import StackPlan
from infra.schema.errors import ConfigError
from infra.schema.keys import config_keys


@dataclass(frozen=True)
class Secrets:
    """The stack's credentials, as Pulumi secrets (the spec only knows that they are set)."""

    hf_token: pulumi.Output[str] | None = None  # park:hfToken
    iap_oauth_client_secret: pulumi.Output[str] | None = None  # park:iapOauthClientSecret


def read_pulumi_config() -> tuple[dict[str, Any], Secrets]:
    """Every park:* and known key from Pulumi config (an unknown park:* key is a typo the
    config reports, not a setting to ignore); the credentials split off as Pulumi secrets."""
    values: dict[str, Any] = {}
    known = config_keys()
    typos = [k for k in pulumi.runtime.config.CONFIG.get() if k.startswith("park:")]
    for key in [*known, *(k for k in typos if k not in known)]:
        raw = pulumi.runtime.get_config(key)
        if raw is None:
            continue
        try:
            values[key] = json.loads(raw)
        except (TypeError, json.JSONDecodeError):
            values[key] = raw

    def secret(key: str) -> pulumi.Output[str] | None:
        if values.get(key) in (None, ""):
            return None
        return pulumi.Output.secret(str(values[key]))  # the spec only marks it

    return values, Secrets(secret("park:hfToken"), secret("park:iapOauthClientSecret"))


def load_plan() -> tuple[StackPlan, Secrets]:
    values, secrets = read_pulumi_config()
    # A credential set without --secret sits in plain text in the stack file: refuse it.
    secret_keys = [key for key in values if pulumi.runtime.is_config_secret(key)]
    try:
        plan = stack.from_values(values, pulumi.get_stack(), secret_keys)
    except ConfigError as err:
        # Fails the preview before any resource is registered.
        raise pulumi.RunError(str(err)) from None
    for warning in plan.warnings:
        pulumi.log.warn(str(warning))
    return plan, secrets


def build(plan: StackPlan, secrets: Secrets) -> None:
    """The stack: each component built from its typed piece of `plan` (its `of_plan`),
    resolved and checked once, as a whole, by load_plan; nothing is checked or resolved again,
    and deployed stacks keep their resources' URNs (the components' aliases)."""
    # Imported here: the render benchmark and `park validate` never pay for provider modules.
    from infra.components.cluster import Cluster, ClusterSite
    from infra.components.gates import GateRun
    from infra.components.images import WorkloadImage
    from infra.components.kubernetes import KubeRayOperator, Workspace, kubernetes_provider
    from infra.components.kueue import Kueue
    from infra.components.network import Network
    from infra.components.node_pools import CpuPool, GpuPool, PoolCluster, TpuSlicePool
    from infra.components.observability import DashboardAccess, RayMetrics
    from infra.components.project import ProjectApis
    from infra.components.staging import ModelStaging
    from infra.components.storage import Storage
    from infra.components.workloads import LlmService, RayRun, RayTrainingJob
    from infra.names import OPENAI_SERVICE_NAME
    from infra.plan import cluster as cluster_plan
    from infra.plan import (
        dashboard_access,
        gates,
        kueue,
        network_policy,
        node_pools,
        observability,
        operator,
        project,
        staging,
        workspace,
    )
    from infra.plan import network as network_plan
    from infra.plan import storage as storage_plan
    from infra.plan.ray import ray_pods

    spec, zone = plan.spec, plan.spec.zone
    # A new project has every API off: each component below waits for the ones it calls.
    apis = ProjectApis.of_plan("project", spec.project, project.apis(plan))
    after_apis = pulumi.ResourceOptions(depends_on=[apis])
    network = Network.of_plan(
        "network", network_plan.network(plan), spec.project, spec.stack, after_apis
    )
    site = ClusterSite(
        zone,
        network.network_name,
        network.subnetwork_name,
        spec.observability.expose_dashboard,
        [(p.port, p.component) for p in cluster_plan.control_plane_ports(plan)],
    )
    cluster = Cluster.of_plan("gke", cluster_plan.cluster(plan), site, after_apis)
    after_cluster: list[pulumi.Resource] = [cluster.resource]
    node_sa = cluster.node_service_account
    storage = Storage.of_plan(
        "storage",
        storage_plan.storage(plan),
        spec.project,
        spec.stack,
        node_sa,
        cluster.name,
        after_apis,
    )
    # Every image the pods run is in the registry before any of them is created: the pods get
    # the pushed digest, an Output of the build.
    built = {
        build.ref: WorkloadImage.of_plan(
            f"image-{build.name}",
            build,
            pulumi.ResourceOptions(depends_on=[apis, *storage.registry_ready]),
        ).ref
        for build in plan.images
    }

    def image(ref: str) -> pulumi.Input[str]:
        """What pods run: the build of `ref`, or `ref` itself when the stack pins it."""
        return built.get(ref, ref)

    joins = PoolCluster(cluster=cluster.name, node_service_account=node_sa)
    on_cluster = pulumi.ResourceOptions(depends_on=after_cluster)
    cpu_disk = node_pools.boot_disk_gb(plan, "cpu")
    cpu = CpuPool.of_plan(
        "cpu", node_pools.cpu_pool(spec.cpu_pool, zone, cpu_disk), joins, on_cluster
    )
    tpu_pools = {
        pool.name: TpuSlicePool.of_plan(
            pool.name,
            pool,
            node_pools.tpu_slice_pools(pool, zone, node_pools.boot_disk_gb(plan, pool.name)),
            joins,
            on_cluster,
        )
        for pool in plan.tpu_pools
    }
    for gpu in plan.gpu_pools:
        GpuPool.of_plan(gpu.spec.name, node_pools.gpu_pool(gpu.spec, zone), joins, on_cluster)

    # cluster.ready: the cluster, and the firewall rule that lets its control plane reach the
    # webhooks the stack installs (Kueue's), before anything is applied through the provider.
    provider = kubernetes_provider("gke", cluster.kubeconfig, depends_on=cluster.ready)
    # The default pool is removed: nothing in the cluster can run (Helm's atomic waits, the
    # operator's pods, Kueue's webhook) before the system pool has nodes.
    in_cluster = pulumi.ResourceOptions(
        providers={"kubernetes": provider}, depends_on=[cluster.resource, cpu.node_pool]
    )
    hf_token = secrets.hf_token
    space = Workspace.of_plan(
        "workspace",
        workspace.workspace(plan.names, network_policy.exposure(plan)),
        hf_token,
        in_cluster,
    )
    # Readiness gates (infra/plan/gates.py): awaited Jobs in the namespace, on the CPU pool, in
    # a workload's image, before the objects the API server cannot take yet.
    gated = gates.stack_gates(plan)

    def gate(planned: gates.GatePlan | None) -> GateRun | None:
        if planned is None:
            return None
        return GateRun(planned, image(staging.stage_image(plan)), cpu.selector, space.ready)

    releases = operator.helm_releases(spec.kuberay, plan.multi_host)
    kuberay = KubeRayOperator.of_plan(
        "kuberay",
        releases,
        spec.kuberay.install,
        in_cluster,
        gate(gated.kuberay),
        gate(gated.cert_manager),
    )
    ready = [*in_cluster.depends_on, *kuberay.ready, *space.ready]  # type: ignore[misc]
    if plan.kueue_pools:
        # Kueue and its queues; the training RayJob waits in its pool's LocalQueue.
        after_namespace = pulumi.ResourceOptions(depends_on=space.ready)
        queues = Kueue.of_plan(
            "kueue",
            kueue.helm_release(plan),
            kueue.manifests(plan),
            in_cluster.merge(after_namespace),
            gate(gated.kueue),
        )
        ready += queues.ready

    # Hub models are copied into the bucket (awaited Jobs) before any workload reads them:
    # after the namespace, its KSA and token, the bucket and its Workload Identity binding.
    stage_jobs = staging.stage_jobs(plan)
    staged = None
    if stage_jobs:
        staged = ModelStaging.of_plan(
            "staging",
            stage_jobs,
            image(staging.stage_image(plan)),
            cpu.selector,
            pulumi.ResourceOptions(
                providers={"kubernetes": provider}, depends_on=[*ready, storage]
            ),
        )

    def on_pool(pool: str, models: Sequence[str | None]) -> pulumi.ResourceOptions:
        """A workload waits for the namespace, the operator, its queue, its pool's nodes and
        the staging of the models it reads."""
        waits = [*ready, *kuberay.crds_ready, *tpu_pools[pool].node_pools]
        waits += staged.jobs_for(models) if staged is not None else []
        return pulumi.ResourceOptions(providers={"kubernetes": provider}, depends_on=waits)

    has_token = hf_token is not None
    run = RayRun(ray_pods(plan), has_token, cpu.selector)  # the Ray head runs on the CPU pool
    if plan.training is not None:
        RayTrainingJob.of_plan(
            "park-train",
            plan.training,
            run,
            image(plan.training.image),
            spec.stack,
            on_pool(plan.training.pool.name, [plan.training.spec.model]),
        )
    if plan.serving is not None:
        sources = [m.spec.source for m in plan.serving.models]
        LlmService.of_plan(
            "park-serve",
            plan.serving,
            run,
            image(plan.serving.image),
            OPENAI_SERVICE_NAME,
            on_pool(plan.serving.pool.name, sources),
        )
    if plan.rl is not None:
        rl_waits = on_pool(plan.rl.learner.name, [plan.rl.spec.model])
        _rl_job(plan, rl_waits, has_token, tpu_pools, image(plan.rl.image))

    on_namespace = pulumi.ResourceOptions(
        providers={"kubernetes": provider}, depends_on=[apis, *space.ready]
    )
    RayMetrics.of_plan(
        "metrics",
        observability.metrics(plan),
        plan.names.namespace,
        on_namespace,
        gate(gated.metrics),
    )
    access = dashboard_access.dashboard_access(plan)
    if access is not None:
        dashboard = DashboardAccess.of_plan(
            "dashboard",
            access,
            on_namespace,
            gate(gated.dashboard),
            oauth_client_secret=secrets.iap_oauth_client_secret,
        )
        pulumi.export("dashboard_url", dashboard.url)
        pulumi.export("dashboard_ip", dashboard.ip_address)

    pulumi.export("cluster_name", cluster.name)
    pulumi.export("cluster_endpoint", cluster.endpoint)
    pulumi.export("kubeconfig", cluster.kubeconfig)
    pulumi.export("bucket", storage.bucket)
    pulumi.export("registry_url", storage.registry_url)
    pulumi.export("workload_service_account", storage.workload_service_account)
    pulumi.export("images", built)
    pulumi.export(
        "tpu_pools",
        {p.name: {"chips": p.total_chips, "hosts": p.total_hosts} for p in plan.tpu_pools},
    )


def _rl_job(
    plan: StackPlan,
    opts: pulumi.ResourceOptions,
    has_token: bool,
    tpu_pools: dict[str, Any],
    image: pulumi.Input[str],
) -> None:
    """park:rl's RayJob (infra/plan/rl.py), after both of its pools' nodes."""
    from infra.components.rl import RayRlJob
    from infra.plan.ray import ray_pods

    assert plan.rl is not None
    rollout = tpu_pools.get(plan.rl.rollout.pool_name)  # a GPU pool: none to wait for here
    waits = pulumi.ResourceOptions(depends_on=list(rollout.node_pools) if rollout else [])
    RayRlJob.of_plan("park-rl", plan.rl, ray_pods(plan), has_token, image, opts.merge(waits))


def main() -> None:
    plan, secrets = load_plan()
    build(plan, secrets)
