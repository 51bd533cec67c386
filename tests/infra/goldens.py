"""The committed golden renders (tests/golden/<stack>/: resources.json and manifests/*.yaml),
each parsed once per process, with libyaml's loader where PyYAML has it
(infra.datafile.YAML_LOADER). Shared between tests: read them, never change them."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import yaml

from infra.datafile import YAML_LOADER
from tests.conftest import ROOT

GOLDEN = ROOT / "tests" / "golden"


@cache
def golden_resources(stack: str) -> list[dict[str, Any]]:
    """Every resource of the stack's golden render, as `park render` writes resources.json."""
    return list(json.loads((GOLDEN / stack / "resources.json").read_text()))


@cache
def golden_manifests(stack: str) -> dict[str, dict[str, Any]]:
    """File name → the Kubernetes object it holds (one per file), in file-name order."""
    folder = GOLDEN / stack / "manifests"
    return {
        p.name: yaml.load(p.read_text(), Loader=YAML_LOADER) for p in sorted(folder.glob("*.yaml"))
    }
