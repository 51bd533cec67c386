"""The committed data files (infra/data: GKE versions, prices, the model catalogue, vLLM's
architectures; the GKE API's discovery document): each parsed once per process."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml

# libyaml's safe loader where PyYAML was built with it (several times faster on the 4 MB of
# vendored CRDs and the golden renders), else PyYAML's own: the same documents either way.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def load(path: Path) -> Any:
    """A YAML file's contents, or a JSON file's (by its .json suffix), parsed once."""
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
