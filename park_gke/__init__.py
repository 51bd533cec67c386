"""park-gke as a Pulumi package: typed components for Ray on GKE with Cloud TPU v6e.

    from park_gke import Cluster, TpuSlicePool, KubeRayOperator, LlmService

Each component takes its own typed arguments (a TypedDict: `TpuSlicePoolArgs`, ...), checks
them with the rules every park-gke stack is held to (the TPU catalog, the engine's parallelism
and memory rules, GKE versions) and names the argument it refuses. Names load lazily: importing
one component loads only the provider modules it uses. Other Pulumi languages use the same
components through the provider in provider/ (`pulumi package add`).

Components take each other (a pool takes the Cluster or ExistingCluster, a workload the
TpuSlicePool, Workspace and Storage), name their children after themselves, and refuse at
preview two of them aiming at one object. `park_gke.testing` runs a program under Pulumi's mocks
as the engine would (duplicate URNs refused, an existing cluster's lookup answered).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name → the module that defines it
_EXPORTS = {
    "Network": "infra.components.network",
    "NetworkArgs": "infra.components.network",
    "Cluster": "infra.components.cluster",
    "ClusterArgs": "infra.components.cluster",
    "AuthorizedNetworkArgs": "infra.components.cluster",
    "ExistingCluster": "infra.components.existing_cluster",
    "ExistingClusterArgs": "infra.components.existing_cluster",
    "CpuPool": "infra.components.node_pools",
    "CpuPoolArgs": "infra.components.node_pools",
    "TpuSlicePool": "infra.components.node_pools",
    "TpuSlicePoolArgs": "infra.components.node_pools",
    "GpuPool": "infra.components.node_pools",
    "GpuPoolArgs": "infra.components.node_pools",
    "Storage": "infra.components.storage",
    "StorageArgs": "infra.components.storage",
    "KubeRayOperator": "infra.components.kubernetes",
    "KubeRayOperatorArgs": "infra.components.kubernetes",
    "Workspace": "infra.components.kubernetes",
    "WorkspaceArgs": "infra.components.kubernetes",
    "kubernetes_provider": "infra.components.kubernetes",
    "Kueue": "infra.components.kueue",
    "KueueArgs": "infra.components.kueue",
    "RayTrainingJob": "infra.components.workloads",
    "RayTrainingJobArgs": "infra.components.workload_args",
    "LlmService": "infra.components.workloads",
    "LlmServiceArgs": "infra.components.workload_args",
    "ServedModelArgs": "infra.components.workload_args",
    "TpuPoolRefArgs": "infra.components._args",
    "TrainingArgs": "infra.components._args",
    "RayMetrics": "infra.components.observability",
    "RayMetricsArgs": "infra.components.observability",
    "DashboardAccess": "infra.components.observability",
    "DashboardAccessArgs": "infra.components.observability",
    "ProjectApis": "infra.components.project",
    "ProjectApisArgs": "infra.components.project",
    "WorkloadImage": "infra.components.images",
    "WorkloadImageArgs": "infra.components.images",
    "ModelStaging": "infra.components.staging",
    "ModelStagingArgs": "infra.components.staging",
    "ComponentArgsError": "infra.components._base",
}

# The components the provider hosts, in schema order.
COMPONENTS = (
    "ProjectApis",
    "Network",
    "Cluster",
    "ExistingCluster",
    "CpuPool",
    "TpuSlicePool",
    "GpuPool",
    "Storage",
    "KubeRayOperator",
    "Workspace",
    "Kueue",
    "WorkloadImage",
    "ModelStaging",
    "RayTrainingJob",
    "LlmService",
    "RayMetrics",
    "DashboardAccess",
)

__all__ = [
    "AuthorizedNetworkArgs",
    "Cluster",
    "ClusterArgs",
    "ComponentArgsError",
    "CpuPool",
    "CpuPoolArgs",
    "DashboardAccess",
    "DashboardAccessArgs",
    "ExistingCluster",
    "ExistingClusterArgs",
    "GpuPool",
    "GpuPoolArgs",
    "KubeRayOperator",
    "KubeRayOperatorArgs",
    "Kueue",
    "KueueArgs",
    "LlmService",
    "LlmServiceArgs",
    "ModelStaging",
    "ModelStagingArgs",
    "Network",
    "NetworkArgs",
    "ProjectApis",
    "ProjectApisArgs",
    "RayMetrics",
    "RayMetricsArgs",
    "RayTrainingJob",
    "RayTrainingJobArgs",
    "ServedModelArgs",
    "Storage",
    "StorageArgs",
    "TpuPoolRefArgs",
    "TpuSlicePool",
    "TpuSlicePoolArgs",
    "TrainingArgs",
    "WorkloadImage",
    "WorkloadImageArgs",
    "Workspace",
    "WorkspaceArgs",
    "kubernetes_provider",
]  # = sorted(_EXPORTS); tests/infra/test_package.py keeps them equal


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'park_gke' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup skips __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


if TYPE_CHECKING:
    from infra.components._args import TpuPoolRefArgs, TrainingArgs
    from infra.components._base import ComponentArgsError
    from infra.components.cluster import AuthorizedNetworkArgs, Cluster, ClusterArgs
    from infra.components.existing_cluster import ExistingCluster, ExistingClusterArgs
    from infra.components.images import WorkloadImage, WorkloadImageArgs
    from infra.components.kubernetes import (
        KubeRayOperator,
        KubeRayOperatorArgs,
        Workspace,
        WorkspaceArgs,
        kubernetes_provider,
    )
    from infra.components.kueue import Kueue, KueueArgs
    from infra.components.network import Network, NetworkArgs
    from infra.components.node_pools import (
        CpuPool,
        CpuPoolArgs,
        GpuPool,
        GpuPoolArgs,
        TpuSlicePool,
        TpuSlicePoolArgs,
    )
    from infra.components.observability import (
        DashboardAccess,
        DashboardAccessArgs,
        RayMetrics,
        RayMetricsArgs,
    )
    from infra.components.project import ProjectApis, ProjectApisArgs
    from infra.components.staging import ModelStaging, ModelStagingArgs
    from infra.components.storage import Storage, StorageArgs
    from infra.components.workloads import (
        LlmService,
        LlmServiceArgs,
        RayTrainingJob,
        RayTrainingJobArgs,
        ServedModelArgs,
    )
