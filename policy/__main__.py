"""The pack's entry point: `pulumi preview --policy-pack policy` runs this file.

Levels come from the stack's own `park:policy` block (stacks/Pulumi.<stack>.yaml, the stack
named by PULUMI_STACK, which the engine sets); `--policy-pack-config` still overrides them.
Constructing PolicyPack starts the analyzer server and blocks: nothing else belongs here.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the rules read infra.catalog / infra.plan: one source of facts

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from policy.rules import policies, settings_for_stack  # noqa: E402

PolicyPack(
    name="park-gke",
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=policies(settings_for_stack(os.environ.get("PULUMI_STACK", ""), ROOT / "stacks")),
)
