"""Every rule of the pack, its default enforcement level and why that level.

Mandatory: GKE or KubeRay would fail (or silently misplace work) at `pulumi up`, or a
security property the project promises would be broken. Advisory: cost and defense in depth
where a team may have a reason (a warm reservation pool, an image that must run as root).
A stack changes a level in `park:policy.enforcement` (see `settings_for_stack`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pulumi_policy import (
    EnforcementLevel,
    Policy,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra.rules.security import production_of
from infra.schema.models import POLICY_RULE_NAMES, ClusterConfig, PolicyConfig
from infra.schema.safe import load_yaml
from policy import kuberay, security, tpu

Level = Literal["mandatory", "advisory", "disabled"]
ResourceRule = Callable[[ResourceValidationArgs, ReportViolation], None]
StackRule = Callable[[StackValidationArgs, ReportViolation], None]


@dataclass(frozen=True)
class Rule:
    name: str
    description: str
    level: Level
    validate: Callable[..., None]
    stack: bool = False  # spans resources: a StackValidationPolicy


RULES: tuple[Rule, ...] = (
    # TPU
    Rule(
        "tpu-pool-shape",
        "TPU node pool sizes agree with (machine type, topology): 0 or all hosts of a slice.",
        "mandatory",
        tpu.tpu_pool_shape,
    ),
    Rule(
        "tpu-topology-multi-host-only",
        "placementPolicy.tpuTopology only on multi-host TPU pools, placed as the generation says "
        "(COMPACT, or a workload policy with no type).",
        "mandatory",
        tpu.tpu_topology_multi_host_only,
    ),
    Rule(
        "tpu-compact-single-zone",
        "COMPACT placement means a single zone.",
        "mandatory",
        tpu.tpu_compact_single_zone,
    ),
    Rule(
        "pool-capacity",
        "Capacity rules: spot XOR reservation; flex-start and queued: no spot, no reservation, "
        "min 0, no auto-repair.",
        "mandatory",
        tpu.pool_capacity,
    ),
    Rule(
        "tpu-idle-scale-to-zero",
        "Idle TPU pools scale to 0 nodes.",
        "advisory",  # a warm pool on a paid reservation can be deliberate
        tpu.tpu_idle_scale_to_zero,
    ),
    # KubeRay
    Rule(
        "rayjob-shutdown-after-finish",
        "RayJobs set shutdownAfterJobFinishes, so their TPU slice is released.",
        "mandatory",
        kuberay.rayjob_shutdown_after_finish,
    ),
    Rule(
        "tpu-requires-toleration",
        "No google.com/tpu request without the TPU taint's toleration.",
        "mandatory",
        kuberay.tpu_requires_toleration,
    ),
    Rule(
        "ray-tpu-worker-shape",
        "TPU worker groups: numOfHosts and google.com/tpu agree with the selected topology.",
        "mandatory",
        kuberay.ray_tpu_worker_shape,
    ),
    Rule(
        "ray-workers-target-tpu-pools",
        "RayJob / RayService TPU worker groups select the labels of a TPU pool of the stack.",
        "mandatory",
        kuberay.ray_workers_target_tpu_pools,
        stack=True,
    ),
    # Security
    Rule(
        "gke-workload-identity",
        "Workload Identity on the cluster and GKE_METADATA on every node pool.",
        "mandatory",
        security.gke_workload_identity,
    ),
    Rule(
        "no-service-account-keys",
        "No service-account keys or static provider credentials.",
        "mandatory",
        security.no_service_account_keys,
    ),
    Rule(
        "node-sa-not-default",
        "Nodes run as a dedicated service account, not the default compute one.",
        "mandatory",
        security.node_sa_not_default,
    ),
    Rule(
        "gke-private-nodes",
        "Private nodes; the control plane not open to 0.0.0.0/0.",
        "mandatory",
        security.gke_private_nodes,
    ),
    Rule(
        "bucket-uniform-access",
        "Buckets use uniform bucket-level access and enforce public access prevention.",
        "mandatory",
        security.bucket_uniform_access,
    ),
    Rule(
        "no-public-iam-members",
        "No IAM grant to allUsers or allAuthenticatedUsers.",
        "mandatory",
        security.no_public_iam_members,
    ),
    Rule(
        "workload-roles-bucket-scoped",
        "The workload identity holds object roles on the stack's bucket only.",
        "mandatory",
        security.workload_roles_bucket_scoped,
        stack=True,
    ),
    Rule(
        "ray-not-public",
        "Ray dashboard and serve stay inside the cluster unless a stack flag exposes them.",
        "mandatory",
        security.ray_not_public,
    ),
    Rule(
        "deletion-protection-prod",
        "Prod-like stacks: cluster deletion protection on, no force-destroy bucket.",
        "mandatory",
        security.deletion_protection_prod,
    ),
    Rule(
        "no-plaintext-secrets",
        "Secrets only as Pulumi secrets: no credential in plain text in any input.",
        "mandatory",
        security.no_plaintext_secrets,
    ),
    Rule(
        "pod-hardening",
        "Pods: resources on every container, no privilege, no escalation, non-root.",
        "advisory",  # checkov enforces it in CI; an image that must run as root is a team call
        security.pod_hardening,
    ),
)

assert tuple(r.name for r in RULES) == POLICY_RULE_NAMES, "infra.schema.models.POLICY_RULE_NAMES"


@dataclass(frozen=True)
class Settings:
    """What a stack changes: levels by rule name, whether it is prod-like, and the posture
    `park validate` applies (infra/rules/security.py): production, acknowledged exposures."""

    levels: Mapping[str, Level]
    prod_like: bool | None = None
    production: bool | None = None
    acknowledged: frozenset[str] = frozenset()


def settings_from(
    policy: PolicyConfig, stack: str, cluster: ClusterConfig | None = None
) -> Settings:
    levels: dict[str, Level] = {r.name: r.level for r in RULES}
    for name, level in policy.enforcement.items():
        levels[name] = level
    return Settings(
        levels=levels,
        prod_like=policy.is_prod_like(stack),
        production=production_of(policy, cluster or ClusterConfig(), stack),
        acknowledged=frozenset(policy.acknowledge_public),
    )


def settings_for_stack(stack: str, stacks_dir: Path) -> Settings:
    """Settings from `park:policy` and `park:cluster` of stacks/Pulumi.<stack>.yaml (read
    with the bounded YAML reader); defaults when absent."""
    path = stacks_dir / f"Pulumi.{stack}.yaml"
    raw: Any = {}
    cluster: Any = {}
    if stack and path.is_file():
        document = load_yaml(path.read_bytes()) or {}
        config = document.get("config") or {}
        raw = config.get("park:policy") or {}
        cluster = config.get("park:cluster") or {}
    return settings_from(
        PolicyConfig.model_validate(raw), stack, ClusterConfig.model_validate(cluster)
    )


_LEVELS = {
    "mandatory": EnforcementLevel.MANDATORY,
    "advisory": EnforcementLevel.ADVISORY,
    "disabled": EnforcementLevel.DISABLED,
}


def bound(rule: Rule, settings: Settings | None) -> Callable[..., None]:
    """The rule's validator with the stack's settings applied (prod-likeness)."""
    if rule.validate is security.deletion_protection_prod and settings is not None:
        return partial(rule.validate, prod=settings.prod_like)
    if rule.validate in (security.gke_private_nodes, security.ray_not_public) and settings:
        return partial(
            rule.validate, production=settings.production, acknowledged=settings.acknowledged
        )
    return rule.validate


def policies(settings: Settings | None = None) -> list[Policy]:
    """The pack's Policy objects (constructing them starts nothing)."""
    out: list[Policy] = []
    for rule in RULES:
        level = _LEVELS[settings.levels[rule.name] if settings else rule.level]
        validate = bound(rule, settings)
        if rule.stack:
            out.append(StackValidationPolicy(rule.name, rule.description, validate, level))
        else:
            out.append(ResourceValidationPolicy(rule.name, rule.description, validate, level))
    return out
