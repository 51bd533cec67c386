"""Readiness gates as children of the component whose objects wait for them.

A gate (infra/plan/gates.py) is an awaited Job, with its ServiceAccount and RBAC, that ends when
what the component creates next can be created: CRDs Established, a webhook answering. The
component that owns the gated objects builds it (`gated`) and hands its children options that
depend on it; the Job is named `<component>-ready` (or `<component>-<role>`, ending in
`-ready`), which is how resources.json records it. The stack program gives the gate its image
and the CPU pool's selector (`GateRun`); a component built from a user's arguments has none
and builds no gate.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi

from infra.components._base import KubernetesComponent
from infra.components._naming import child_name
from infra.plan.gates import GatePlan


@dataclass(frozen=True)
class GateRun:
    """A planned gate and what its pod needs: the image, the CPU pool's labels, and what must
    exist before it starts (the namespace)."""

    plan: GatePlan
    image: pulumi.Input[str]
    node_selector: pulumi.Input[dict[str, str]] | None
    after: Sequence[pulumi.Resource] = field(default_factory=tuple)


def ready_gate(
    component: KubernetesComponent,
    run: GateRun,
    role: str = "ready",
    depends_on: Sequence[pulumi.Resource] = (),
) -> pulumi.Resource:
    """The gate's objects as `component`'s children; the Job (`<component>-<role>`) returned,
    awaited up to the gate's bound (its activeDeadlineSeconds)."""
    from pulumi_kubernetes.batch.v1 import Job
    from pulumi_kubernetes.core.v1 import ServiceAccount
    from pulumi_kubernetes.rbac.v1 import ClusterRole, ClusterRoleBinding, Role, RoleBinding

    taken = component.claim_objects(list(run.plan.manifests))
    if taken:
        component.refuse(taken)
    name = child_name(component._component_name, role)
    opts = component.child_options(depends_on=[*run.after, *depends_on])
    kinds: dict[str, Any] = {
        "ServiceAccount": ServiceAccount,
        "ClusterRole": ClusterRole,
        "ClusterRoleBinding": ClusterRoleBinding,
        "Role": Role,
        "RoleBinding": RoleBinding,
    }
    granted: list[pulumi.Resource] = []
    for manifest in run.plan.rbac:
        kind = manifest["kind"]
        body = {_SNAKE.get(k, k): v for k, v in manifest.items() if k not in ("apiVersion", "kind")}
        suffix = "service-account" if kind == "ServiceAccount" else _dashed(kind)
        granted.append(kinds[kind](f"{name}-{suffix}", **body, opts=opts))
    job = copy.deepcopy(run.plan.job)
    pod = job["spec"]["template"]["spec"]
    pod["containers"][0]["image"] = run.image
    pod.pop("nodeSelector", None)
    if run.node_selector is not None:
        pod["nodeSelector"] = run.node_selector
    bound = f"{run.plan.timeout_s}s"
    return Job(
        name,
        metadata=job["metadata"],
        spec=job["spec"],
        opts=pulumi.ResourceOptions.merge(
            component.child_options(depends_on=[*run.after, *depends_on, *granted]),
            pulumi.ResourceOptions(
                custom_timeouts=pulumi.CustomTimeouts(create=bound, update=bound)
            ),
        ),
    )


_SNAKE = {"roleRef": "role_ref"}  # the RBAC objects' one camelCase field, as the SDK names it


def _dashed(kind: str) -> str:
    """ClusterRoleBinding -> cluster-role-binding."""
    return "".join(f"-{c.lower()}" if c.isupper() else c for c in kind).lstrip("-")


def gated(
    component: KubernetesComponent,
    run: GateRun | None,
    role: str = "ready",
    depends_on: Sequence[pulumi.Resource] = (),
) -> list[pulumi.Resource]:
    """What the component's gated children wait for: `depends_on`, and the gate when there is
    one (built here, after `depends_on`)."""
    if run is None:
        return list(depends_on)
    return [*depends_on, ready_gate(component, run, role, depends_on)]
