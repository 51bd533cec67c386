"""Which KubeRay release first declares each field of a RayJob or RayService.

Data: infra/data/kuberay_fields.yaml, read from KubeRay's own CRDs at every release tag. A
manifest field the running operator's CRD lacks is pruned by the API server without an error;
`unknown_fields` names those a given KubeRay would lose.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import datafile

DATA = Path(__file__).parent / "data" / "kuberay_fields.yaml"
KINDS = ("RayJob", "RayService")


def version_key(version: str) -> tuple[int, ...]:
    """``"1.3.2"`` (or ``"v1.3.2"``) → ``(1, 3, 2)``; ValueError for anything else."""
    parts = version.removeprefix("v").split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a KubeRay release version: {version!r}")
    return tuple(int(p) for p in parts)


def _data() -> dict[str, Any]:
    data: dict[str, Any] = datafile.load(DATA)
    return data


def releases() -> dict[str, Any]:
    """Release → its date (datetime.date), oldest first."""
    rows = _data()["releases"]
    return {v: rows[v]["date"] for v in sorted(rows, key=version_key)}


def baseline() -> str:
    return str(_data()["baseline"])


def newest() -> str:
    return list(releases())[-1]


@dataclass(frozen=True)
class NewField:
    """A field of a manifest that appeared in KubeRay `since`."""

    path: str  # as in the manifest: spec.rayClusterConfig.workerGroupSpecs[].numOfHosts
    since: str


def _paths(value: Any, path: str) -> Iterator[str]:
    """Every field path in `value` (`[]` for a list's items), parents before children."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            child = f"{path}.{key}"
            yield child
            yield from _paths(item, child)
    elif isinstance(value, list):
        for item in value:
            yield from _paths(item, f"{path}[]")


def _since(kind: str, relative: str) -> str | None:
    """The release a path (relative to `kind`) first appeared in, following the anchors into the
    shared types; None for a path every KubeRay with ray.io/v1 declares."""
    data = _data()
    for anchor, shared in (data["anchors"].get(kind) or {}).items():
        if relative == anchor or relative.startswith((anchor + ".", anchor + "[]")):
            inner = _since(shared, relative[len(anchor) :])
            outer = data["since"][kind].get(relative) if relative == anchor else None
            found = [v for v in (inner, outer) if v]
            return max(found, key=version_key) if found else None
    value = data["since"][kind].get(relative)
    return str(value) if value else None


def new_fields(manifest: Mapping[str, Any]) -> list[NewField]:
    """The manifest's fields newer than KubeRay's baseline (1.0.0), each with its release: a
    field counts when it, or a field above it, is recorded (a subtree's paths share its root's
    release)."""
    kind = str(manifest.get("kind"))
    if kind not in KINDS:
        raise ValueError(f"not a RayJob or RayService: kind {kind!r}")
    found: dict[str, str] = {}
    for path in _paths(manifest.get("spec") or {}, ""):
        since = _since(kind, path)
        if since and path not in found:
            found[path] = since
    # keep a field's own entry only when it is newer than the field above it
    kept = []
    for path, since in found.items():
        parents = [v for p, v in found.items() if path.startswith((p + ".", p + "[]"))]
        if not parents or version_key(since) > max(version_key(v) for v in parents):
            kept.append(NewField(f"spec{path}", since))
    return kept


def unknown_fields(manifest: Mapping[str, Any], kuberay: str) -> list[NewField]:
    """The manifest's fields KubeRay `kuberay` does not declare (the API server prunes them)."""
    limit = version_key(kuberay)
    return [f for f in new_fields(manifest) if version_key(f.since) > limit]
