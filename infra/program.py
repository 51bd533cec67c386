"""The Pulumi program: read the stack config, plan, and hand each plan to its component.

`pulumi up` runs it through the root `__main__.py`; `park render` runs it under mocks.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi.runtime

from infra.config import ConfigError, StackConfig, config_keys, parse_stack_config
from infra.plan import kueue as kueue_plan
from infra.plan import node_pools
from infra.plan import observability as observability_plan
from infra.plan import ray as ray_plan


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


def load_config() -> tuple[StackConfig, pulumi.Output[str] | None]:
    values, hf_token = read_pulumi_config()
    # A credential set without --secret sits in plain text in the stack file: refuse it.
    secret_keys = [key for key in values if pulumi.runtime.is_config_secret(key)]
    try:
        return parse_stack_config(values, pulumi.get_stack(), secret_keys), hf_token
    except ConfigError as err:
        # Fails the preview before any resource is registered.
        raise pulumi.RunError(str(err)) from None


def build(config: StackConfig, hf_token: pulumi.Output[str] | None) -> None:
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
    from infra.components.node_pools import GpuPool, TpuSlicePool
    from infra.components.observability import DashboardAccess, RayMetrics
    from infra.components.storage import Storage

    network = Network("network", config)
    cluster = Cluster(
        "gke",
        config,
        network_name=network.network_name,
        subnetwork_name=network.subnetwork_name,
        cpu_pool=node_pools.cpu_pool(config),
    )
    storage = Storage("storage", config, node_service_account=cluster.node_service_account)
    after_cluster: list[pulumi.Resource] = [cluster.resource]
    tpu_pools = {
        pool.name: TpuSlicePool(
            pool,
            node_pools.tpu_slice_pools(config, pool),
            cluster.name,
            cluster.node_service_account,
            depends_on=after_cluster,
        )
        for pool in config.tpu_pools
    }
    for gpu in config.gpu_pools:
        GpuPool(
            node_pools.gpu_pool(config, gpu),
            cluster.name,
            cluster.node_service_account,
            depends_on=after_cluster,
        )

    provider = kubernetes_provider("gke", cluster.kubeconfig, depends_on=after_cluster)
    kuberay = KubeRayOperator("kuberay", config, provider, depends_on=after_cluster)
    space = Workspace("workspace", config, provider, hf_token, depends_on=after_cluster)
    ready = [*kuberay.ready, *space.ready]
    if config.any_queued:
        # Kueue and its queues; the training RayJob waits in its pool's LocalQueue.
        queues = Kueue("kueue", config, provider, after_cluster, namespace_ready=space.ready)
        ready += queues.ready
    if config.training.enabled:
        RayWorkload(
            "TrainingJob",
            ray_plan.rayjob(config, queue_name=kueue_plan.training_queue_name(config)),
            provider,
            depends_on=[*ready, *tpu_pools[config.training.pool].node_pools],
        )
    if config.serving.enabled:
        RayWorkload(
            "LlmService",
            ray_plan.rayservice(config, hf_token=hf_token is not None),
            provider,
            depends_on=[*ready, *tpu_pools[config.serving.pool].node_pools],
        )

    RayMetrics("metrics", config, provider, depends_on=space.ready)
    access = observability_plan.dashboard_access(config)
    if access is not None:
        dashboard = DashboardAccess("dashboard", config, access, provider, depends_on=space.ready)
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
        {
            p.name: {"chips": p.slice.chips * p.slices, "hosts": p.slice.hosts * p.slices}
            for p in config.tpu_pools
        },
    )


def main() -> None:
    config, hf_token = load_config()
    build(config, hf_token)
