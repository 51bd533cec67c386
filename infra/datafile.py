"""The committed data files (infra/data: GKE versions, prices, the model catalogue, vLLM's
architectures; the GKE API's discovery document): each parsed once per process."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml


@cache
def load(path: Path) -> Any:
    """A YAML file's contents, or a JSON file's (by its .json suffix), parsed once."""
    text = path.read_text()
    return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
