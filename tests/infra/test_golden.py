"""The committed golden render of each shipped stack matches what the program renders now.

A pull request that changes infrastructure shows the change as a diff under tests/golden/.
Regenerate with `make goldens`.
"""

from __future__ import annotations

import json

import pytest
import yaml

from infra.tools.render import manifest_filename
from tests.conftest import ROOT, SHIPPED_STACKS, render_stack

GOLDEN = ROOT / "tests" / "golden"


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_resources_match_golden(stack):
    golden = json.loads((GOLDEN / stack / "resources.json").read_text())
    now = [r.as_json() for r in render_stack(stack).resources]
    assert json.loads(json.dumps(now, sort_keys=True)) == golden, (
        f"stack {stack} renders differently from tests/golden/{stack}: run `make goldens` "
        "and review the diff"
    )


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_manifests_match_golden(stack):
    manifests = render_stack(stack).manifests()
    golden_dir = GOLDEN / stack / "manifests"
    assert sorted(p.name for p in golden_dir.glob("*.yaml")) == sorted(
        manifest_filename(m) for m in manifests
    )
    for manifest in manifests:
        assert yaml.safe_load((golden_dir / manifest_filename(manifest)).read_text()) == manifest
