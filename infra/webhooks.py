"""What the control plane must reach on the nodes for what a stack installs in the cluster.

Data: infra/data/webhooks.yaml (each port with the chart it was read in and its source).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import datafile

DATA = Path(__file__).parent / "data" / "webhooks.yaml"


@dataclass(frozen=True)
class ControlPlanePort:
    """A TCP port of a pod the API server calls (an admission webhook, an aggregated API)."""

    port: int
    component: str  # the Helm release that installs it
    serves: str  # what listens there
    source: str  # where the port was read


def _data() -> dict[str, Any]:
    data: dict[str, Any] = datafile.load(DATA)
    return data


def gke_admitted() -> tuple[int, ...]:
    """The ports GKE's own control-plane rule already admits (443, 10250)."""
    return tuple(int(p) for p in _data()["gke_admitted"]["ports"])


def ports_of(component: str) -> tuple[ControlPlanePort, ...]:
    """Every port the control plane calls for `component` (a Helm release name); a component
    the data does not list is a gap in infra/data/webhooks.yaml, never a silent `()`."""
    components = _data()["components"]
    if component not in components:
        raise KeyError(f"infra/data/webhooks.yaml lists no component {component!r}")
    return tuple(
        ControlPlanePort(int(p["port"]), component, str(p["serves"]), str(p["source"]))
        for p in components[component]["ports"]
    )
