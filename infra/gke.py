"""GKE facts the rules need: what each release channel offers, and what features require.

Data lives in infra/data/gke.yaml with its sources and read date (the TPU generations' own
minimums are in the catalog). A version is `1.35` (a minor: GKE takes its newest patch),
`1.35.8` or an exact `1.35.8-gke.1036000`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra import datafile, kuberay

DATA = Path(__file__).parent / "data" / "gke.yaml"
_VERSION_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:-gke\.(\d+))?$")


@dataclass(frozen=True, order=True)
class GkeVersion:
    major: int
    minor: int
    patch: int | None = None  # None: a minor alias (its newest patch)
    gke: int | None = None

    @property
    def exact(self) -> bool:
        return self.gke is not None

    def satisfies(self, minimum: GkeVersion) -> bool:
        """Whether this version is at least `minimum`; a minor alias stands for its newest
        patch, so `1.33` satisfies `1.33.0-gke.1712000`."""
        if (self.major, self.minor) != (minimum.major, minimum.minor):
            return (self.major, self.minor) > (minimum.major, minimum.minor)
        if self.patch is None:
            return True
        return (self.patch, self.gke or 0) >= (minimum.patch or 0, minimum.gke or 0)

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}"
        if self.patch is not None:
            text += f".{self.patch}"
        if self.gke is not None:
            text += f"-gke.{self.gke}"
        return text


def parse(version: str) -> GkeVersion | None:
    """``"1.35.8-gke.1036000"`` → GkeVersion; None when it is not a GKE version."""
    match = _VERSION_RE.match(version)
    if not match:
        return None
    major, minor, patch, gke = match.groups()
    return GkeVersion(
        int(major),
        int(minor),
        None if patch is None else int(patch),
        None if gke is None else int(gke),
    )


@dataclass(frozen=True)
class Channel:
    name: str
    default: GkeVersion
    oldest_minor: GkeVersion


def _data() -> dict[str, Any]:
    data: dict[str, Any] = datafile.load(DATA)
    return data


def read_date() -> str:
    return str(_data()["read"])


def channel(name: str) -> Channel:
    row = _data()["channels"][name]
    default, oldest = parse(str(row["default"])), parse(str(row["oldest_minor"]))
    assert default is not None and oldest is not None, f"infra/data/gke.yaml: channel {name}"
    return Channel(name, default, oldest)


def minimum(feature: str) -> tuple[GkeVersion, str]:
    """(version, source) a feature needs, from infra/data/gke.yaml."""
    version, source = _data()["minimums"][feature]
    parsed = parse(str(version))
    assert parsed is not None, f"infra/data/gke.yaml: minimum {feature}"
    return parsed, str(source)


def cluster_version(release_channel: str, pinned: str | None) -> GkeVersion:
    """The version a new cluster starts at: the pin, else the channel's default."""
    version = parse(pinned) if pinned else channel(release_channel).default
    if version is None:
        raise ValueError(f"not a GKE version: {pinned!r}")
    return version


@dataclass(frozen=True)
class AddonKubeRay:
    """The KubeRay that GKE's Ray add-on is taken to run at least on a GKE version, and why
    (Google publishes none: infra/data/gke.yaml, ray_addon)."""

    version: str
    basis: str  # why that version, for the messages


def addon_kuberay(version: GkeVersion) -> AddonKubeRay:
    """The newest KubeRay released before upstream Kubernetes (minor - lag) was, and never below
    the known floor (1.1.0); a minor past the recorded dates takes the newest recorded."""
    row = _data()["ray_addon"]
    known, lag = str(row["known_floor"]), int(row["lag_minors"])
    floor = AddonKubeRay(known, "the least it has run")
    dates = {tuple(map(int, str(m).split("."))): d for m, d in row["kubernetes_released"].items()}
    reference = max((m for m in dates if m <= (version.major, version.minor - lag)), default=None)
    if reference is None:
        return floor
    out = [
        v
        for v, released in kuberay.releases().items()
        if released < dates[reference] and kuberay.version_key(v) > kuberay.version_key(known)
    ]
    if not out:
        return floor
    newest = max(out, key=kuberay.version_key)
    minor = ".".join(map(str, reference))
    return AddonKubeRay(
        newest,
        f"the newest released before Kubernetes {minor} ({dates[reference]}); Google publishes "
        "no version for the add-on",
    )
