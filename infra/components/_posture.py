"""Posture for package users: a component judges the exposure its own arguments carry with the
stack's rules (infra/rules/security.py: the same verdicts, keys and messages as `park validate`,
`pulumi preview` of a stack file, and the policy pack).

A component plans one part of a stack: a Cluster knows its control plane and nodes, an
LlmService its endpoint, neither the other's. So each is judged only on the exposures whose
config keys are its own arguments (an LlmService is not told about a control plane it does not
create), with its own `acknowledge_public` (park:policy.acknowledgePublic) and the production
marker the stack uses (park:policy.prodLike's default, a prod* stack name, or deletion
protection asked for explicitly). Only the public edge asks (infra.components._base.
checked_plan): the stack program's components are built from its plan (`of_plan`), judged
as a whole with the stack's acknowledgements (infra.program.load_plan).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from infra.resolve import StackPlan
from infra.rules.security import check_posture
from infra.schema.errors import ConfigError

ACKNOWLEDGE_KEY = "park:policy.acknowledgePublic"
# (config key, argument): how a component maps the acknowledgement into its arguments' names.
ACKNOWLEDGE_FIELD = (ACKNOWLEDGE_KEY, "acknowledge_public")


def with_posture(plan: StackPlan, argument: Callable[[str], str | None]) -> StackPlan:
    """`plan` with the posture warnings about the component's own arguments (`argument`: the
    argument a config key is, None when it is none of them); ConfigError with the refused ones,
    for the caller to name in argument names."""
    refused, warned = check_posture(plan.spec)
    own = [p for p in refused if argument(p.key) is not None]
    if own:
        raise ConfigError(own)
    mine = tuple(p for p in warned if argument(p.key) is not None)
    return replace(plan, warnings=(*plan.warnings, *mine)) if mine else plan
