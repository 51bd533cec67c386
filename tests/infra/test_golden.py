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

from infra.tools.render import manifest_filename
from tests.conftest import SHIPPED_STACKS, render_stack
from tests.infra.goldens import golden_manifests, golden_resources

_IMAGE_TAG = re.compile(r"src-[0-9a-f]{16}(@sha256:[0-9a-f]{64})?")


def _tagless(value: Any) -> Any:
    """`value` with every content tag (and the digest pushed under it) as one placeholder."""
    return json.loads(_IMAGE_TAG.sub("src-TAG", json.dumps(value, sort_keys=True)))


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_resources_match_golden(stack):
    golden = golden_resources(stack)
    now = [r.as_json() for r in render_stack(stack).resources]
    assert _tagless(now) == _tagless(golden), (
        f"stack {stack} renders differently from tests/golden/{stack}: run `make goldens` "
        "and review the diff"
    )


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_manifests_match_golden(stack):
    manifests = render_stack(stack).manifests()
    golden = golden_manifests(stack)
    assert sorted(golden) == sorted(manifest_filename(m) for m in manifests)
    for manifest in manifests:
        assert _tagless(golden[manifest_filename(manifest)]) == _tagless(manifest)
