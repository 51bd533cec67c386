"""The committed golden render of each shipped stack matches what the program renders now.

A pull request that changes infrastructure shows the change as a diff under tests/golden/.
Regenerate with `make goldens`. The workload images' tag is a digest of workloads/ (infra/
images.py): it is compared as a tag, not by value, so that a change to the workloads alone does
not make every golden stale (tests/infra/test_day_one.py holds the tag to the checkout).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from infra.tools.render import manifest_filename
from tests.conftest import ROOT, SHIPPED_STACKS, render_stack

GOLDEN = ROOT / "tests" / "golden"
_IMAGE_TAG = re.compile(r"src-[0-9a-f]{16}(@sha256:[0-9a-f]{64})?")


def _tagless(value: Any) -> Any:
    """`value` with every content tag (and the digest pushed under it) as one placeholder."""
    return json.loads(_IMAGE_TAG.sub("src-TAG", json.dumps(value, sort_keys=True)))


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_resources_match_golden(stack):
    golden = json.loads((GOLDEN / stack / "resources.json").read_text())
    now = [r.as_json() for r in render_stack(stack).resources]
    assert _tagless(now) == _tagless(golden), (
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
        golden = yaml.safe_load((golden_dir / manifest_filename(manifest)).read_text())
        assert _tagless(golden) == _tagless(manifest)
