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
from infra.rules.security import Exposure, posture_verdict, production
from infra.schema.safe import load_yaml, load_yaml_all, read_bounded
from infra.schema.secrets import credential_kind, credentials_in
from infra.tools import gke_api
from infra.tools.checks import check_manifests, ray_serve_check
from infra.tools.manifests.pods import hardening_problems, workload_pod_templates
from infra.tools.netpol import flow_problems
from infra.tools.schemas import crd_schemas, validate_manifests


@dataclass
class Section:
    """One group of checks: what was checked, and what was found."""

    label: str  # "schema", "plan", "serve"
    checked: str  # what the checks covered, in words
    problems: list[str] = field(default_factory=list)
    skipped: bool = False  # the check could not run here (said in `checked`)


class ManifestReadError(ValueError):
    """A manifests folder park cannot read: `<file>:<line>: why`, never its contents."""


MAX_MANIFEST_FILES = 1_000


def load_manifest_dir(directory: Path) -> list[dict[str, Any]]:
    """Every YAML document under a rendered `manifests/` folder (e.g. after hand edits),
    read with the bounded YAML reader (size, depth, alias expansion)."""
    manifests = []
    paths = sorted(directory.glob("*.y*ml"))
    if len(paths) > MAX_MANIFEST_FILES:
        raise ManifestReadError(f"{directory}: over {MAX_MANIFEST_FILES} YAML files")
    for path in paths:
        try:
            documents = load_yaml_all(read_bounded(path))
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            line = mark.line + 1 if mark is not None else 1
            why = getattr(err, "problem", None) or "cannot be parsed"
            raise ManifestReadError(f"{path}:{line}: not YAML: {why}") from None
        except (OSError, UnicodeDecodeError) as err:
            raise ManifestReadError(f"{path}: cannot read it ({type(err).__name__})") from None
        manifests += [doc for doc in documents if isinstance(doc, dict)]
    return manifests


def _embedded(manifest: dict[str, Any]) -> dict[str, Any]:
    """Ray's YAML strings (runtime env, serve config) parsed, so their env_vars are seen."""
    spec = _dict(manifest.get("spec"))
    found = {}
    for key in ("runtimeEnvYAML", "serveConfigV2"):
        text = spec.get(key)
        if isinstance(text, str):
            try:
                found[key] = load_yaml(text)
            except yaml.YAMLError:
                continue  # the schema and serve checks say what is wrong with it
    return found


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _exposure(manifest: dict[str, Any]) -> tuple[Exposure, str] | None:
    """What a manifest opens to the internet: a RayService's serve Service or any Service
    that is a NodePort or an external LoadBalancer."""
    kind = manifest.get("kind")
    if kind == "RayService":
        service = _dict(_dict(manifest.get("spec")).get("serveService"))
    elif kind == "Service":
        service = manifest
    else:
        return None
    svc_spec = _dict(service.get("spec"))
    notes = _dict(_dict(service.get("metadata")).get("annotations"))
    kind_of_service = svc_spec.get("type", "ClusterIP")
    internal = notes.get("networking.gke.io/load-balancer-type") == "Internal"
    if kind_of_service == "NodePort" or (kind_of_service == "LoadBalancer" and not internal):
        return "serving", f"a {kind_of_service} Service reachable from outside the cluster"
    return None


def security_problems(docs: list[dict[str, Any]], plan: StackPlan) -> list[str]:
    """The config's credential and posture rules on manifests (rendered or edited by hand):
    no credential in any string, env literal or Ray runtime env (infra.schema.secrets), and
    exposure judged by the same verdict as the stack (infra.rules.security). Never a value."""
    problems = []
    prod = production(plan.spec)
    acknowledged = frozenset(plan.spec.policy.acknowledge_public)
    for doc in docs:
        name = f"{doc.get('kind', '?')}/{(doc.get('metadata') or {}).get('name', '?')}"
        secret = doc.get("kind") == "Secret"
        held = ("data", "stringData") if secret else ()
        body = {k: v for k, v in doc.items() if k not in held}
        for path, what in credentials_in(body):
            problems.append(f"{name}: {path}: holds {what} in plain text; use a Secret")
        for key in held:  # a Secret's own keys are where a token belongs: only its shape counts
            for entry, value in _dict(doc.get(key)).items():
                kind = credential_kind(value) if isinstance(value, str) else None
                if kind is not None:
                    problems.append(
                        f"{name}: {key}.{entry}: holds {kind} in the manifest file; create the "
                        "Secret from a Pulumi secret (park:hfToken), not a committed file"
                    )
        for key, parsed in _embedded(doc).items():
            for path, what in credentials_in(parsed, f"spec.{key}"):
                problems.append(f"{name}: {path}: holds {what} in plain text; use a Secret")
        kind = str(doc.get("kind", ""))
        for ref in workload_pod_templates(kind, doc):
            problems += [f"{name}: {ref.path} {p}" for p in hardening_problems(ref.template)]
        exposed = _exposure(doc)
        if exposed is not None:
            verdict = posture_verdict(
                exposed[0], exposed[1], production=prod, acknowledged=acknowledged
            )
            if verdict.refused:
                problems.append(f"{name}: {verdict.message}")
    return problems


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
            "Cluster, NodePool, Firewall and ResourcePolicy inputs vs Google's API schemas "
            f"(container {gke_api.revision()}, compute {gke_api.compute_revision()}, after the "
            "provider's renames)",
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
    yield Section(
        "security",
        "credentials in any value, env literal or Ray runtime env; exposure on a production stack",
        security_problems(docs, plan),
    )
    yield _serve_section(docs, serve_check, status)
