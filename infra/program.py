"""The Pulumi program: read the stack config, resolve and plan it, hand each plan to its component.

`pulumi up` runs it through the root `__main__.py`; `park render` runs it under mocks.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi.runtime

from infra import stack
from infra.plan import cluster as cluster_plan
from infra.plan import kueue as kueue_plan
from infra.plan import network as network_plan
from infra.plan import node_pools
from infra.plan import observability as observability_plan
from infra.plan import operator as operator_plan
from infra.plan import ray as ray_plan
from infra.plan import storage as storage_plan
from infra.plan import workspace as workspace_plan
from infra.resolve import StackPlan
from infra.spec.errors import ConfigError
from infra.spec.read import config_keys


def read_pulumi_config() -> tuple[dict[str, Any], pulumi.Output[str] | None]:
    """Every park:* and known key from Pulumi config (an unknown park:* key is a typo the
    config reports, not a setting to ignore); the HF token split off as a Pulumi secret."""
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
    hf_token = None
    serving = values.get("park:serving")
    if isinstance(serving, dict) and serving.get("hfToken") is not None:
        hf_token = pulumi.Output.secret(str(serving["hfToken"]))  # the config drops it
    return values, hf_token


def load_plan() -> tuple[StackPlan, pulumi.Output[str] | None]:
    values, hf_token = read_pulumi_config()
    # A credential set without --secret sits in plain text in the stack file: refuse it.
    secret_keys = [key for key in values if pulumi.runtime.is_config_secret(key)]
    try:
        plan = stack.from_values(values, pulumi.get_stack(), secret_keys)
    except ConfigError as err:
        # Fails the preview before any resource is registered.
        raise pulumi.RunError(str(err)) from None
    for warning in plan.warnings:
        pulumi.log.warn(str(warning))
    return plan, hf_token


def build(plan: StackPlan, hf_token: pulumi.Output[str] | None) -> None:
    # Imported here: the render benchmark and `park validate` never pay for provider modules.
    from infra.components.cluster import Cluster
    from infra.components.kubernetes import (
        KubeRayOperator,
        RayWorkload,
        Workspace,
        kubernetes_provider,
    )
    from infra.components.kueue import Kueue
    from infra.components.network import Network
    from infra.components.node_pools import CpuPool, GpuPool, TpuSlicePool
    from infra.components.observability import DashboardAccess, RayMetrics
    from infra.components.storage import Storage

    spec, zone = plan.spec, plan.spec.zone
    network = Network("network", network_plan.network(plan))
    cluster = Cluster(
        "gke",
        cluster_plan.cluster(plan),
        network_name=network.network_name,
        subnetwork_name=network.subnetwork_name,
    )
    after_cluster: list[pulumi.Resource] = [cluster.resource]
    storage = Storage(
        "storage",
        storage_plan.storage(plan),
        node_service_account=cluster.node_service_account,
        workload_identity_pool=after_cluster,
    )
    node_sa = cluster.node_service_account
    cpu = CpuPool(node_pools.cpu_pool(spec.cpu_pool, zone), cluster.name, node_sa, after_cluster)
    # The default pool is removed: nothing in the cluster can run (Helm's atomic waits, the
    # operator's pods, Kueue's webhook) before the system pool has nodes.
    after_system_pool: list[pulumi.Resource] = [cluster.resource, cpu.node_pool]
    tpu_pools = {
        pool.name: TpuSlicePool(
            pool,
            node_pools.tpu_slice_pools(pool, zone),
            cluster.name,
            node_sa,
            depends_on=after_cluster,
        )
        for pool in plan.tpu_pools
    }
    for gpu in plan.gpu_pools:
        GpuPool(node_pools.gpu_pool(gpu.spec, zone), cluster.name, node_sa, after_cluster)

    provider = kubernetes_provider("gke", cluster.kubeconfig, depends_on=after_cluster)
    kuberay = KubeRayOperator(
        "kuberay",
        spec.kuberay.install,
        operator_plan.helm_releases(plan),
        provider,
        depends_on=after_system_pool,
    )
    space = Workspace(
        "workspace",
        workspace_plan.workspace(plan),
        provider,
        hf_token,
        depends_on=after_system_pool,
    )
    ready = [*kuberay.ready, *space.ready]
    if plan.queued_pools:
        # Kueue and its queues; the training RayJob waits in its pool's LocalQueue.
        queues = Kueue(
            "kueue",
            kueue_plan.helm_release(plan),
            kueue_plan.manifests(plan),
            provider,
            after_system_pool,
            namespace_ready=space.ready,
        )
        ready += queues.ready
    pods = ray_plan.ray_pods(plan)
    if plan.training is not None:
        RayWorkload(
            "TrainingJob",
            ray_plan.rayjob(plan.training, pods),
            provider,
            depends_on=[*ready, *tpu_pools[plan.training.pool.name].node_pools],
        )
    if plan.serving is not None:
        RayWorkload(
            "LlmService",
            ray_plan.rayservice(plan.serving, pods, hf_token=hf_token is not None),
            provider,
            depends_on=[*ready, *tpu_pools[plan.serving.pool.name].node_pools],
        )

    RayMetrics("metrics", observability_plan.metrics(plan), provider, depends_on=space.ready)
    access = observability_plan.dashboard_access(plan)
    if access is not None:
        dashboard = DashboardAccess(
            "dashboard", spec.project, access, provider, depends_on=space.ready
        )
        pulumi.export("dashboard_url", dashboard.url)
        pulumi.export("dashboard_ip", dashboard.ip_address)

    pulumi.export("cluster_name", cluster.name)
    pulumi.export("cluster_endpoint", cluster.endpoint)
    pulumi.export("kubeconfig", cluster.kubeconfig)
    pulumi.export("bucket", storage.bucket)
    pulumi.export("registry_url", storage.registry_url)
    pulumi.export("workload_service_account", storage.workload_service_account)
    pulumi.export(
        "tpu_pools",
        {p.name: {"chips": p.total_chips, "hosts": p.total_hosts} for p in plan.tpu_pools},
    )


def main() -> None:
    plan, hf_token = load_plan()
    build(plan, hf_token)
