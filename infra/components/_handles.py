"""The argument types that take another component's handle in Python.

A Python program may pass the component itself where an argument names what the component made
(`cluster=Cluster`, `pool=TpuSlicePool`, `namespace=Workspace`, `bucket=Storage`,
`node_selector=CpuPool`, `service=LlmService`): `Component.checked` unpacks it (its
`as_argument`). Other languages pass the name or id. So the type checker is told the union, and
the run time, which Pulumi's analyzer reads to write the provider schema, keeps the plain type:
the schema stays the other languages' view, and a Python example type-checks without an ignore.
Each handle is described by the outputs that make it one (a Protocol), so this module imports
no component: the components import it.
"""

from typing import TYPE_CHECKING, Protocol, TypeAlias

import pulumi

from infra.components._args import TpuPoolRefArgs


class ClusterHandle(Protocol):
    """A Cluster or ExistingCluster."""

    cluster_id: pulumi.Output[str]
    node_service_account: pulumi.Output[str]


class PoolHandle(Protocol):
    """A TpuSlicePool."""

    pool_ref: pulumi.Output[TpuPoolRefArgs]


class NamespaceHandle(Protocol):
    """A Workspace."""

    namespace: pulumi.Output[str]


class BucketHandle(Protocol):
    """A Storage."""

    bucket: pulumi.Output[str]
    registry_url: pulumi.Output[str]


class NodeSelectorHandle(Protocol):
    """A CpuPool."""

    node_selector: pulumi.Output[dict[str, str]]


class ServiceHandle(Protocol):
    """An LlmService."""

    service_name: pulumi.Output[str]


if TYPE_CHECKING:
    ClusterRef: TypeAlias = pulumi.Input[str] | ClusterHandle
    PoolRef: TypeAlias = TpuPoolRefArgs | PoolHandle
    NamespaceRef: TypeAlias = str | NamespaceHandle
    BucketRef: TypeAlias = str | BucketHandle
    NodeSelectorRef: TypeAlias = pulumi.Input[dict[str, str]] | NodeSelectorHandle
    ServiceRef: TypeAlias = str | ServiceHandle
else:
    ClusterRef = pulumi.Input[str]
    PoolRef = TpuPoolRefArgs
    NamespaceRef = str
    BucketRef = str
    NodeSelectorRef = pulumi.Input[dict[str, str]]
    ServiceRef = str
