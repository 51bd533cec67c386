"""Check manifests the way the API server would, offline.

Custom resources (RayJob, RayService, and any CRD vendored under `infra/schemas/`) are checked
against their CRD's `openAPIV3Schema`, made strict: a field the schema does not declare is an
error here, because the API server would silently prune it. Core objects are checked with
`kubernetes-validate` (strict) for the Kubernetes minor of the GKE floor.
CEL rules (`x-kubernetes-validations`) are not run.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from infra import catalog
from infra.datafile import YAML_LOADER
from infra.schema.safe import one_line
from infra.schema.secrets import scrub

SCHEMA_DIR = Path(__file__).resolve().parents[1] / "schemas"
# The Kubernetes minor the GKE floor for v6e implies (1.31.2-gke...).
# Without a stack: the Kubernetes minor of the GKE floor for v6e (1.31.2-gke...). With one, the
# cluster's own version (StackPlan.cluster_version: the pin, or the channel's default).
KUBERNETES_VERSION = ".".join(catalog.GENERATIONS["v6e"].min_gke_version.split(".")[:2]) + ".0"


@dataclass(frozen=True)
class ManifestProblem:
    manifest: str  # "<kind>/<name>"
    path: str  # JSON path inside the manifest, e.g. spec.rayClusterSpec.workerGroupSpecs[0]
    message: str

    def __str__(self) -> str:
        # jsonschema's messages quote the offending value: cut, escaped, credentials hidden.
        text = f"{self.manifest}: {self.path or '(root)'}: {self.message}"
        return one_line(scrub(text), 600)


_COMBINATORS = ("oneOf", "anyOf", "allOf", "not")
_GO_LEADING_FLAGS = re.compile(r"^\^\(\?([a-z]+)\)")


def _python_pattern(pattern: str) -> str:
    """Go's RE2 takes `^(?i)...` (Kueue's CRDs use it); Python wants the flags first."""
    return _GO_LEADING_FLAGS.sub(r"(?\1)^", pattern)


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Forbid undeclared fields wherever the schema declares its fields (as pruning does)."""
    schema = copy.deepcopy(schema)

    def walk(node: Any, branch: bool = False) -> None:
        # A oneOf/anyOf/allOf/not branch only adds constraints to fields its parent declares
        # (Gateway API's addresses): pruning follows the parent, so the branch stays open.
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
                and not branch
            ):
                node["additionalProperties"] = False
            if isinstance(node.get("pattern"), str):
                node["pattern"] = _python_pattern(node["pattern"])
            for key, value in node.items():
                if key in _COMBINATORS:
                    for sub in value if isinstance(value, list) else [value]:
                        walk(sub, branch=True)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) → strict JSON schema, for every CRD vendored under infra/schemas/.

    4 MB of YAML: read with libyaml's safe loader where PyYAML has it (1 s instead of 4 s on
    2 cores, the same documents), else PyYAML's own."""
    schemas = {}
    for path in sorted(SCHEMA_DIR.rglob("*.yaml")):
        for doc in yaml.load_all(path.read_text(), Loader=YAML_LOADER):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = doc["spec"]["group"], doc["spec"]["names"]["kind"]
            for version in doc["spec"]["versions"]:
                schema = version["schema"]["openAPIV3Schema"]
                schemas[(f"{group}/{version['name']}", kind)] = _strict(schema)
    return schemas


def _format_path(parts: Any) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validate_manifest(
    manifest: dict[str, Any], kubernetes: str = KUBERNETES_VERSION
) -> list[ManifestProblem]:
    kind = manifest.get("kind", "?")
    name = f"{kind}/{(manifest.get('metadata') or {}).get('name', '?')}"
    key = (manifest.get("apiVersion", ""), kind)
    schema = crd_schemas().get(key)
    if schema is not None:
        import jsonschema

        validator = jsonschema.Draft7Validator(schema)
        body = {k: v for k, v in manifest.items() if k not in ("apiVersion", "kind", "metadata")}
        return [
            ManifestProblem(name, _format_path(e.absolute_path), _without_instance(e))
            for e in sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
        ]
    return _validate_core(name, manifest, kubernetes)


def _without_instance(error: Any) -> str:
    """jsonschema's message without the offending value it starts with ('<value>' is not of
    type 'integer'): a hand-edited manifest's value is not echoed (the path names it)."""
    message = str(error.message)
    instance = repr(error.instance)
    if message.startswith(instance):
        return "the value" + message[len(instance) :]
    return message


def _validate_core(name: str, manifest: dict[str, Any], kubernetes: str) -> list[ManifestProblem]:
    api_version, kind = manifest.get("apiVersion"), manifest.get("kind")
    validator = _core_validator(str(api_version), str(kind), kubernetes)
    if validator is None:
        return [ManifestProblem(name, "", f"no schema for {api_version} {kind}")]
    error = next(iter(validator.iter_errors(manifest)), None)  # the first, as validate() raises
    return [] if error is None else [ManifestProblem(name, _format_path(error.path), error.message)]


@cache
def _core_validator(api_version: str, kind: str, kubernetes: str) -> Any | None:
    """kubernetes-validate's strict schema of a core kind, as its `validate(strict=True)` picks
    it (the newest Kubernetes minor it ships not newer than `kubernetes`; `rbac.authorization.
    k8s.io/v1` → `rbac-v1`), with its definitions: built once per kind, where `validate` reads
    the 1.6 MB definitions file again on every call. None: it has no schema for the kind
    (tests/infra/test_manifests.py holds the two to the same verdicts)."""
    import jsonschema
    from kubernetes_validate import utils
    from referencing import Registry, Resource

    wanted = utils.major_minor(kubernetes.removeprefix("v"))
    if wanted > utils.latest_version():
        raise utils.VersionNotSupportedError(version=wanted)
    version = [v for v in utils.all_versions() if utils.major_minor(v) <= wanted][-1]
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = utils.schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", wanted)
    except FileNotFoundError:
        return None
    definitions = utils.schema_contents(f"{folder}/_definitions.json", wanted)
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def validate_manifests(
    manifests: list[dict[str, Any]], kubernetes: str = KUBERNETES_VERSION
) -> list[ManifestProblem]:
    problems: list[ManifestProblem] = []
    for manifest in manifests:
        problems += validate_manifest(manifest, kubernetes)
    return problems
