"""`park validate`: every check of a stack's manifests, gathered into sections for the report.

The config itself is checked by the pipeline (infra.stack); this runs what needs manifests:
the schemas (infra/tools/schemas.py), the TPU and plan rules (infra/tools/checks.py) and Ray
Serve's own classes on each serveConfigV2 (in a subprocess).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infra.resolve import StackPlan
from infra.tools import gke_api
from infra.tools.checks import check_manifests, ray_serve_check
from infra.tools.netpol import flow_problems
from infra.tools.schemas import crd_schemas, validate_manifests


@dataclass
class Section:
    """One group of checks: what was checked, and what was found."""

    label: str  # "schema", "plan", "serve"
    checked: str  # what the checks covered, in words
    problems: list[str] = field(default_factory=list)
    skipped: bool = False  # the check could not run here (said in `checked`)


def load_manifest_dir(directory: Path) -> list[dict[str, Any]]:
    """Every YAML document under a rendered `manifests/` folder (e.g. after hand edits)."""
    manifests = []
    for path in sorted(directory.glob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                manifests.append(doc)
    return manifests


def _serve_section(
    docs: list[dict[str, Any]],
    serve_check: bool,
    status: Callable[[str], AbstractContextManager[Any]],
) -> Section:
    services = [d for d in docs if d.get("kind") == "RayService"]
    if not services:
        return Section("serve", "serveConfigV2: no RayService", skipped=True)
    if not serve_check:
        return Section(
            "serve", "serveConfigV2 with Ray's classes: skipped (--no-serve-check)", skipped=True
        )
    section = Section(
        "serve", "serveConfigV2 with Ray Serve's ServeDeploySchema, LLMConfig and engine args"
    )
    for service in services:
        text = (service.get("spec") or {}).get("serveConfigV2")
        if not isinstance(text, str):
            continue
        with status("checking serveConfigV2 with Ray Serve's classes..."):
            found, skipped = ray_serve_check(text)
        if skipped:
            return Section(
                "serve", f"serveConfigV2 with Ray's classes: skipped, {skipped}", [], True
            )
        name = f"RayService/{(service.get('metadata') or {}).get('name', '?')}"
        section.problems += [f"{name}: spec.serveConfigV2: {p}" for p in found]
    return section


def manifest_sections(
    docs: list[dict[str, Any]],
    plan: StackPlan,
    *,
    where: str,
    resources: list[Any] | None = None,
    serve_check: bool = True,
    status: Callable[[str], AbstractContextManager[Any]] = lambda _: nullcontext(),
) -> Iterator[Section]:
    """The sections for these manifests (rendered or from a folder) and, given the render's
    `resources`, the GKE API check of its clusters and node pools."""
    if resources is not None:
        yield Section(
            "gke",
            f"Cluster and NodePool inputs vs GKE's API schema (discovery revision "
            f"{gke_api.revision()}, after the provider's renames)",
            gke_api.check_resources(resources),
        )
    custom = sum(1 for d in docs if (d.get("apiVersion"), d.get("kind")) in crd_schemas())
    yield Section(
        "schema",
        f"{len(docs)} {where} manifests: {custom} against vendored CRD schemas, "
        f"{len(docs) - custom} against Kubernetes {plan.kubernetes_version}",
        [str(p) for p in validate_manifests(docs, plan.kubernetes_version)],
    )
    yield Section(
        "plan",
        "TPU worker groups vs catalog and pools, entrypoint flags, TP",
        [str(p) for p in check_manifests(docs, plan)],
    )
    yield Section(
        "network",
        "NetworkPolicies vs the flows Ray on GKE needs (operator, workers, metrics, clients)",
        flow_problems(docs, plan),
    )
    yield _serve_section(docs, serve_check, status)
