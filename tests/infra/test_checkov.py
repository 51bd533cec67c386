"""Hardened defaults, checked by a third party: checkov on every shipped stack's manifests.

checkov skips custom resources, so the pods KubeRay will create from the RayJob / RayService
templates (head, each worker group, the submitter) are derived (infra/tools/manifests/pods.py) and
scanned too. Suppressions live in .checkov.yaml, one line of reason each; a finding not
suppressed there fails, and so does a suppression that no longer suppresses anything.

checkov pins its own dependencies, so it lives in its own virtualenv: PARK_CHECKOV names its
executable (default .venv-checkov/bin/checkov). Missing, the test skips, except on CI
(CI=true), where it fails.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.names import RAY_NODE_LABEL
from infra.tools.manifests.pods import derived_pods, pod_templates
from infra.tools.render import manifest_filename
from tests.conftest import ROOT, SHIPPED_STACKS, render_stack

pytestmark = pytest.mark.e2e

CONFIG = ROOT / ".checkov.yaml"
CHECKOV = Path(os.environ.get("PARK_CHECKOV", ROOT / ".venv-checkov" / "bin" / "checkov"))
# KubeRay's autoscaler sidecar runs in this head and scales worker groups through the API.
AUTOSCALING_HEADS = {"park-serve-head"}


def _checkov() -> Path:
    if CHECKOV.is_file():
        return CHECKOV
    message = (
        f"checkov not found at {CHECKOV}; install it: python3 -m venv .venv-checkov && "
        ".venv-checkov/bin/pip install checkov==3.3.30 (or set PARK_CHECKOV)"
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def scan_documents(stack: str) -> list[dict[str, Any]]:
    """The stack's manifests and the pods derived from its Ray custom resources."""
    manifests = render_stack(stack).manifests()
    return manifests + [pod for m in manifests for pod in derived_pods(m)]


def _suppressions() -> dict[str, str]:
    """check id → reason, from the comment on its line in .checkov.yaml."""
    reasons = {}
    for line in CONFIG.read_text().splitlines():
        match = re.match(r"^\s*-\s*(CKV2?_[A-Z0-9_]+)\s*#\s*(\S.*)$", line)
        if match:
            reasons[match.group(1)] = match.group(2)
    return reasons


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict[str, Any]:
    """One checkov run over every shipped stack (a folder each) with .checkov.yaml's settings
    but none of its skips: the tests apply the skips, so they can also see stale ones."""
    checkov = _checkov()
    root = tmp_path_factory.mktemp("checkov")
    for stack in SHIPPED_STACKS:
        folder = root / stack
        folder.mkdir()
        for document in scan_documents(stack):
            (folder / manifest_filename(document)).write_text(yaml.safe_dump(document))
    settings = yaml.safe_load(CONFIG.read_text())
    settings.pop("skip-check")
    unskipped = root.parent / "checkov-unskipped.yaml"
    unskipped.write_text(yaml.safe_dump(settings))
    result = subprocess.run(
        [str(checkov), "-d", str(root), "--config-file", str(unskipped), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,  # checkov also reads a .checkov.yaml from its working directory
    )
    assert result.stdout.strip(), (
        f"checkov printed nothing (rc {result.returncode}): {result.stderr}"
    )
    output = json.loads(result.stdout)
    reports = output if isinstance(output, list) else [output]
    (kubernetes,) = [r for r in reports if r.get("check_type") == "kubernetes"]
    return kubernetes


def _failures(report: dict[str, Any]) -> list[dict[str, Any]]:
    return report["results"]["failed_checks"]


def test_suppressions_each_carry_a_reason():
    config = yaml.safe_load(CONFIG.read_text())
    skipped = config["skip-check"]
    reasons = _suppressions()
    assert sorted(skipped) == sorted(reasons), "every skip-check line needs '# reason'"
    assert all(len(reason) > 20 for reason in reasons.values())


def test_checkov_finds_nothing_unsuppressed(report):
    suppressed = set(_suppressions())
    failed = [
        f"{c['check_id']} {c['check_name']}: {c['resource']} ({c['file_path']})"
        for c in _failures(report)
        if c["check_id"] not in suppressed
    ]
    assert failed == [], "\n".join(failed)


def test_checkov_scanned_the_derived_pods(report):
    """Guards against a scan that silently covers nothing (checkov skips what it cannot parse)."""
    assert report["summary"]["parsing_errors"] == 0
    scanned = Counter(c["resource"].split(".")[0] for c in report["results"]["passed_checks"])
    pods = sum(1 for stack in SHIPPED_STACKS for d in scan_documents(stack) if d["kind"] == "Pod")
    assert pods >= 3 * len(SHIPPED_STACKS)  # at least head, worker, submitter each
    assert scanned["Pod"] >= pods * 50  # checkov runs ~90 checks on a pod


def test_every_suppression_is_still_needed(report):
    used = {c["check_id"] for c in _failures(report)}
    stale = sorted(set(_suppressions()) - used)
    assert stale == [], f"remove from .checkov.yaml, nothing triggers them any more: {stale}"


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_token_automount_only_where_needed(stack):
    """The narrow fact behind the CKV_K8S_38 suppression."""
    for pod in (d for d in scan_documents(stack) if d["kind"] == "Pod"):
        expected = pod["metadata"]["name"] in AUTOSCALING_HEADS
        assert pod["spec"].get("automountServiceAccountToken") is expected, pod["metadata"]


def test_derived_pods_cover_every_template():
    job = next(m for m in render_stack("prod").manifests() if m["kind"] == "RayJob")
    pods = derived_pods(job)
    assert [p["metadata"]["name"] for p in pods] == [
        "park-train-head",
        "park-train-worker-train-v6e-16",
        "park-train-submitter",
    ]
    assert [t.role for t in pod_templates("RayJob", job["spec"])] == ["head", "worker", "submitter"]
    head, worker, submitter = pods
    assert head["metadata"]["labels"][RAY_NODE_LABEL] == "yes"
    assert (
        worker["spec"] == job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    )
    assert RAY_NODE_LABEL not in submitter["metadata"].get("labels", {})  # a Job pod, not Ray
