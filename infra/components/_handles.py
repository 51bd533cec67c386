"""The argument types that take another component's handle in Python.

A Python program may pass the component itself where an argument names what the component made
(`cluster=Cluster`, `pool=TpuSlicePool`, `namespace=Workspace`, `bucket=Storage`,
`node_selector=CpuPool`, `service=LlmService`): `Component.checked` unpacks it (its
`as_argument`). Other languages pass the name or id. So the type checker is told the union, and
the run time, which Pulumi's analyzer reads to write the provider schema, keeps the plain type:
the schema stays the other languages' view, and a Python example type-checks without an ignore.
"""

from typing import TYPE_CHECKING, TypeAlias

import pulumi

from infra.components._args import TpuPoolRefArgs

if TYPE_CHECKING:
    from infra.components._base import ClusterComponent
    from infra.components.kubernetes import Workspace
    from infra.components.node_pools import CpuPool, TpuSlicePool
    from infra.components.storage import Storage
    from infra.components.workloads import LlmService

    ClusterRef: TypeAlias = pulumi.Input[str] | ClusterComponent
    PoolRef: TypeAlias = TpuPoolRefArgs | TpuSlicePool
    NamespaceRef: TypeAlias = str | Workspace
    BucketRef: TypeAlias = str | Storage
    NodeSelectorRef: TypeAlias = pulumi.Input[dict[str, str]] | CpuPool
    ServiceRef: TypeAlias = str | LlmService
else:
    ClusterRef = pulumi.Input[str]
    PoolRef = TpuPoolRefArgs
    NamespaceRef = str
    BucketRef = str
    NodeSelectorRef = pulumi.Input[dict[str, str]]
    ServiceRef = str
