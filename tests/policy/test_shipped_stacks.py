"""(a) Every rule passes on the recorded inputs of every shipped stack under the mock engine,
with the levels each stack's park:policy sets. Also: the one secret is a Pulumi secret."""

from __future__ import annotations

import pytest

from infra.schema.models import SECRET_PLACEHOLDER
from policy.rules import RULES
from tests.conftest import SHIPPED_STACKS, render_stack
from tests.policy.helpers import resources, run, stack_settings


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_rule_passes_on_the_shipped_stack(stack):
    violations = run(resources(stack), stack, stack_settings(stack))
    assert [str(v) for v in violations] == []


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_shipped_stacks_keep_every_rule_enabled(stack):
    """A shipped stack is the example others copy: it may not switch a guardrail off."""
    levels = stack_settings(stack).levels
    assert [r.name for r in RULES if levels[r.name] == "disabled"] == []


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_kubernetes_secrets_hold_only_pulumi_secrets(stack):
    """The engine hands secrets to policies decrypted, so no rule can see secretness; the mock
    run can: a value passed as a Pulumi secret is recorded masked."""
    secrets = [r for r in render_stack(stack).resources if r.type == "kubernetes:core/v1:Secret"]
    for secret in secrets:
        for key in ("data", "stringData"):
            values = (secret.inputs.get(key) or {}).values()
            assert all(v == SECRET_PLACEHOLDER for v in values), (secret.name, key)


def test_prod_is_prod_like_and_dev_is_not():
    assert stack_settings("prod").prod_like is True
    assert stack_settings("dev").prod_like is False
