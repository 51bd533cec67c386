"""A stack's plan as the public components' arguments: how `infra.program` uses the package.

The stack program is one user of the components like any other Pulumi program: it hands each
the arguments its stack config gives, and the component checks them with the same rules. Every
value here is read from the resolved StackPlan; nothing is derived twice.
"""

from dataclasses import dataclass
from typing import Any

import pulumi

from infra.components.cluster import CLUSTER_FIELDS, CLUSTER_NETWORK_FIELDS, ClusterArgs
from infra.components.kubernetes import KubeRayOperatorArgs, WorkspaceArgs
from infra.components.kueue import KueueArgs
from infra.components.network import NETWORK_FIELDS, NetworkArgs
from infra.components.node_pools import CpuPoolArgs, GpuPoolArgs, TpuSlicePoolArgs, pool_ref
from infra.components.observability import DashboardAccessArgs, RayMetricsArgs
from infra.components.storage import StorageArgs
from infra.components.workloads import LlmServiceArgs, RayTrainingJobArgs
from infra.disk import DEFAULT_BOOT_DISK_GB
from infra.names import OPENAI_SERVICE_NAME
from infra.plan.cluster import control_plane_ports
from infra.plan.node_pools import boot_disk_gb
from infra.resolve import GpuPoolPlan, PoolPlan, StackPlan


@dataclass(frozen=True)
class PoolRefs:
    """What every node pool is given from the cluster."""

    cluster: pulumi.Input[str]
    node_service_account: pulumi.Input[str]


def _same(model: Any, *fields: str) -> Any:
    """The spec `model`'s fields among `fields` that are set, under their own names: a
    component's argument is named as the stack key it stands for (snake_case)."""
    return {f: v for f in fields if (v := getattr(model, f)) is not None and v != ""}


def network(plan: StackPlan) -> NetworkArgs:
    spec = plan.spec
    return NetworkArgs(
        project=spec.project,
        region=spec.region,
        stack=spec.stack,
        **_same(spec.network, *NETWORK_FIELDS),
    )


def cluster(
    plan: StackPlan, network_name: pulumi.Input[str], subnetwork_name: pulumi.Input[str]
) -> ClusterArgs:
    spec = plan.spec
    cfg = spec.cluster
    return ClusterArgs(
        project=spec.project,
        location=spec.zone,
        network=network_name,
        subnetwork=subnetwork_name,
        stack=spec.stack,
        name=plan.names.cluster,
        master_authorized_networks=[
            {"cidr": n.cidr, "name": n.name} for n in cfg.master_authorized_networks
        ],
        ray_operator_addon=spec.kuberay.install == "addon",
        ray_logging=spec.kuberay.logging,
        ray_monitoring=spec.kuberay.monitoring,
        gateway_api=spec.observability.expose_dashboard,
        control_plane_ports=[
            {"port": p.port, "component": p.component} for p in control_plane_ports(plan)
        ],
        **_same(cfg, *CLUSTER_FIELDS),
        **_same(spec.network, *CLUSTER_NETWORK_FIELDS),
    )


def storage(
    plan: StackPlan, node_service_account: pulumi.Input[str], cluster_name: pulumi.Input[str]
) -> StorageArgs:
    spec = plan.spec
    args = StorageArgs(
        project=spec.project,
        region=spec.region,
        node_service_account=node_service_account,
        cluster=cluster_name,
        stack=spec.stack,
        namespace=plan.names.namespace,
        bucket=plan.names.bucket,
        repository=plan.names.registry_repository,
        create_repository=spec.registry.create,
        **_same(spec.storage, "versioning", "force_destroy"),
    )
    if spec.storage.location:
        args["bucket_location"] = spec.storage.location
    return args


def _boot_disk_gb(plan: StackPlan, pool: str, pinned: int | None) -> int:
    """The boot disk the disk plan sized for the pool (infra.disk), else the stack's."""
    return boot_disk_gb(plan, pool) or pinned or DEFAULT_BOOT_DISK_GB


def cpu_pool(plan: StackPlan, refs: PoolRefs) -> CpuPoolArgs:
    pool = plan.spec.cpu_pool
    return CpuPoolArgs(
        cluster=refs.cluster,
        location=plan.spec.zone,
        node_service_account=refs.node_service_account,
        disk_size_gb=_boot_disk_gb(plan, "cpu", pool.disk_size_gb),
        **_same(pool, "machine_type", "min_nodes", "max_nodes"),
    )


# The optional fields every accelerator pool has.
_POOL_FIELDS = ("name", "capacity", "reservation", "autoscaling")


def tpu_pool(plan: StackPlan, pool: PoolPlan, refs: PoolRefs) -> TpuSlicePoolArgs:
    spec = pool.spec
    args = TpuSlicePoolArgs(
        cluster=refs.cluster,
        location=plan.spec.zone,
        node_service_account=refs.node_service_account,
        machine_type=spec.machine_type,
        topology=spec.topology,
        disk_size_gb=_boot_disk_gb(plan, spec.name, spec.disk_size_gb),
        **_same(spec, *_POOL_FIELDS, "slices", "max_run_duration"),
    )
    if plan.spec.extra_tpu_zones:
        args["extra_zones"] = list(plan.spec.extra_tpu_zones)
    return args


def gpu_pool(plan: StackPlan, gpu: GpuPoolPlan, refs: PoolRefs) -> GpuPoolArgs:
    spec = gpu.spec
    return GpuPoolArgs(
        cluster=refs.cluster,
        location=plan.spec.zone,
        node_service_account=refs.node_service_account,
        machine_type=spec.machine_type,
        accelerator_type=spec.accelerator_type,
        **_same(spec, *_POOL_FIELDS, "accelerator_count", "nodes", "disk_size_gb"),
    )


def kuberay(plan: StackPlan) -> KubeRayOperatorArgs:
    cfg = plan.spec.kuberay
    return KubeRayOperatorArgs(
        install=cfg.install,
        multi_host_tpu=plan.multi_host,
        **_same(cfg, "version", "tpu_webhook_chart"),
    )


def workspace(plan: StackPlan, hf_token: pulumi.Input[str] | None) -> WorkspaceArgs:
    spec = plan.spec
    args = WorkspaceArgs(
        project=spec.project,
        stack=spec.stack,
        namespace=plan.names.namespace,
        kuberay_install=spec.kuberay.install,
        master_cidr=spec.network.master_cidr,
        expose_serve=plan.serving is not None and spec.serving.expose_publicly,
        expose_dashboard=spec.observability.expose_dashboard,
    )
    if hf_token is not None:
        args["hf_token"] = hf_token
    return args


def kueue(plan: StackPlan) -> KueueArgs:
    return KueueArgs(
        queued_pools=[pool_ref(p) for p in plan.queued_pools],
        namespace=plan.names.namespace,
        version=plan.spec.kueue.version,
    )


def _workload(plan: StackPlan, pool: PoolPlan, image: str) -> dict[str, Any]:
    spec = plan.spec
    return {
        "project": spec.project,
        "location": spec.zone,
        "pool": pool_ref(pool),
        "stack": spec.stack,
        "namespace": plan.names.namespace,
        "bucket": plan.names.bucket,
        "mount_path": spec.storage.mount_path,
        "image": image,
        "tpu_metrics": spec.observability.tpu_metrics,
    }


def training(plan: StackPlan, hf_token: bool) -> RayTrainingJobArgs:
    assert plan.training is not None
    job = plan.training
    settings = job.spec.model_dump(exclude={"enabled", "pool", "image"})  # TrainingArgs
    return RayTrainingJobArgs(
        **_workload(plan, job.pool, job.image),  # type: ignore[typeddict-item]
        training=settings,
        hf_token=hf_token,
    )


def serving(plan: StackPlan, hf_token: bool) -> LlmServiceArgs:
    assert plan.serving is not None
    service = plan.serving
    spec = service.spec
    models: list[Any] = []
    for m in service.models:
        model = m.spec.model_dump(exclude_none=True)
        if m.from_training:
            # The run's export on the bucket, and the model it was trained from for its facts.
            assert m.source is not None
            model |= {"source": m.source, **({"base_model": m.base_model} if m.base_model else {})}
        models.append(model)
    return LlmServiceArgs(
        **_workload(plan, service.pool, service.image),  # type: ignore[typeddict-item]
        models=models,
        engine=spec.engine,
        upgrade_strategy=spec.upgrade_strategy,
        expose_publicly=spec.expose_publicly,
        endpoint_service=OPENAI_SERVICE_NAME,
        hf_token=hf_token,
    )


def metrics(plan: StackPlan) -> RayMetricsArgs:
    cfg = plan.spec.observability
    return RayMetricsArgs(
        project=plan.spec.project,
        cluster_name=plan.names.cluster,
        stack=plan.spec.stack,
        namespace=plan.names.namespace,
        training=plan.training is not None,
        pod_monitoring=cfg.pod_monitoring,
        tpu_metrics=cfg.tpu_metrics,
        training_metrics=cfg.training_metrics,
        grafana=cfg.grafana,
        scrape_interval=cfg.scrape_interval,
    )


def dashboard(plan: StackPlan) -> DashboardAccessArgs | None:
    cfg = plan.spec.observability
    if not cfg.expose_dashboard:
        return None
    assert cfg.dashboard_domain and cfg.iap_oauth_client_id and cfg.iap_oauth_secret
    return DashboardAccessArgs(
        project=plan.spec.project,
        domain=cfg.dashboard_domain,
        iap_members=list(cfg.iap_members),
        oauth_client_id=cfg.iap_oauth_client_id,
        oauth_secret=cfg.iap_oauth_secret,
        stack=plan.spec.stack,
        namespace=plan.names.namespace,
    )
