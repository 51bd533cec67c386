"""Every rule of a stack, run together: the spec's own rules, then those that need the
resolved numbers. `check(spec)` returns the StackPlan or raises ConfigError with all problems.

- `pools`: zone, GKE version, TPU and GPU pools (catalog entries); `capacity`: how a pool's
  nodes are obtained (one capacity or a ladder) and what may run on them;
- `workloads`: the training RayJob and the serving RayService (workers, TP, slices);
- `platform`: names, network ranges, lifecycle, Kueue, observability;
- `values`: values as what they are, counts GKE can hold; `security`: exposure (posture);
- `operator`: every RayJob/RayService field is one the KubeRay that runs declares (checked
  once the rest holds: it builds the manifests from the whole plan).
"""

from __future__ import annotations

from dataclasses import replace

from infra import catalog
from infra.resolve import StackPlan, disk_plan, resolve
from infra.rules import (
    capacity,
    operator,
    platform,
    pools,
    rl,
    security,
    training_memory,
    values,
    workloads,
)
from infra.schema.errors import ConfigError, ConfigProblem
from infra.schema.models import StackConfig

# The rules, in the order their problems are listed: those of the spec, those of its plan.
_POOL_RULES = (pools.check_location, pools.check_version, pools.check_pools)
_WORKLOAD_RULES = (workloads.check_training, workloads.check_serving, rl.check_rl)
_SPEC_RULES = (
    platform.check_ranges,
    platform.check_lifecycle,
    platform.check_kueue,
    platform.check_observability,
    values.check_values,
    values.check_counts,
)


def problems(spec: StackConfig, plan: StackPlan | None = None) -> list[ConfigProblem]:
    """Every problem of a typed spec (empty: it is valid); `plan`: its resolve, when done."""
    plan = plan if plan is not None else resolve(spec, partial=True)
    found = [p for check in _POOL_RULES for p in check(spec)]
    found += [p for check in _WORKLOAD_RULES for p in check(plan)]
    found += platform.check_names(spec, plan.names)
    found += [p for check in _SPEC_RULES for p in check(spec)]
    found += [
        ConfigProblem(key, value, message) for key, value, message in disk_plan.problems(plan.disk)
    ]
    return found


def warnings(spec: StackConfig, plan: StackPlan | None = None) -> list[ConfigProblem]:
    """What is valid but likely to hurt later; printed by park and by the program."""
    plan = plan if plan is not None else resolve(spec, partial=True)
    return [
        *pools.version_warnings(spec),
        *capacity.capacity_warnings(spec),
        *platform.project_warnings(spec),
        *platform.observability_warnings(spec),
        *workloads.serving_warnings(plan),
        *training_memory.training_warnings(plan),
        *rl.rl_warnings(plan),
        *security.policy_warnings(spec),
    ]


def check(spec: StackConfig, *, posture: bool = True) -> StackPlan:
    """The StackPlan of a valid spec; ConfigError naming every problem otherwise. `posture`:
    judge the stack's exposure too (infra/rules/security.py); False for a component that
    plans a part of a stack whose cluster it does not know.

    Resolves once: a valid spec resolves whole, and the rules read that plan. One that does
    not (a pool the catalog lacks, a workload on a missing pool) is resolved partially so that
    the rules can name every problem; should they find none, its error is raised as is."""
    try:
        plan, unresolved = resolve(spec), None
    except (catalog.CatalogError, KeyError) as err:  # what resolve(partial=True) leaves out
        plan, unresolved = resolve(spec, partial=True), err
    found = problems(spec, plan)
    exposed, exposure_warnings = security.check_posture(spec) if posture else ([], [])
    found += exposed
    if unresolved is not None and not found:
        raise unresolved  # a gap in the rules: never a plan with parts left out
    if not found:
        found = operator.check_operator(plan)
    if found:
        raise ConfigError(found)
    return replace(plan, warnings=(*warnings(spec, plan), *exposure_warnings))
