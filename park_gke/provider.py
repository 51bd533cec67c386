"""The park-gke components as a Pulumi provider, for programs in every Pulumi language.

`provider/__main__.py` runs `main()` when Pulumi loads the plugin (`pulumi package add`); the
schema Pulumi generates from the components' type annotations is `schema()`, committed as
provider/schema.json (`python -m park_gke.provider > provider/schema.json`).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import metadata
from typing import Any

import park_gke

NAME = "park-gke"  # the package name: type tokens are park-gke:index:<Component>


def version() -> str:
    try:
        return metadata.version("park-gke")
    except metadata.PackageNotFoundError:  # a checkout without an install
        return "0.0.0"


def components() -> list[type]:
    return [getattr(park_gke, name) for name in park_gke.COMPONENTS]


def _provider_class() -> type:
    from pulumi.errors import InputPropertiesError, InputPropertyErrorDetails
    from pulumi.provider.experimental.component import ComponentProvider
    from pulumi.provider.server import ComponentInitError
    from pydantic.alias_generators import to_camel

    from infra.components._base import ComponentArgsError

    class ParkComponentProvider(ComponentProvider):
        """The SDK's component provider, with a component's refused arguments answered as the
        SDK's input error (each problem at its property path), not a Python traceback, and
        serving `schema()` (the SDK's own would lack what it post-processes)."""

        def __init__(self, components, name, namespace=None, version="0.0.0"):
            super().__init__(components, name, namespace, version)
            self.schema = json.dumps(schema(version))

        def construct(self, name, resource_type, inputs, options=None):
            try:
                return super().construct(name, resource_type, inputs, options)
            except ComponentInitError as err:
                inner = err.inner
                if not isinstance(inner, ComponentArgsError):
                    raise
                errors: list[InputPropertyErrorDetails] = [
                    {"property_path": _property_path(p, to_camel), "reason": p}
                    for p in inner.problems
                ]
                raise InputPropertiesError(str(inner), errors) from None

    return ParkComponentProvider


def _property_path(problem: str, to_camel: Any) -> str:
    """``args.pool.machine_type = ...: ...`` → ``pool.machineType`` (the schema's names)."""
    if not problem.startswith("args."):
        return ""
    path = problem[len("args.") :].split(" ", 1)[0].split(":", 1)[0]
    return ".".join(to_camel(part) for part in path.split("."))


def __getattr__(name: str) -> Any:
    if name == "ParkComponentProvider":
        return _provider_class()
    raise AttributeError(name)


def schema(package_version: str | None = None) -> dict[str, Any]:
    """The package schema, as the SDK's analyzer infers it, with what it leaves out filled in:
    inherited arguments' descriptions (analyzer), secrets and enum member descriptions. A new
    dict each call, from one analysis per process and version."""
    return dict(json.loads(_schema_text(package_version or version())))


@cache
def _schema_text(package_version: str) -> str:
    """The schema as JSON text: the analyzer reads every component's source (a second of CPU),
    and the components do not change while a process runs."""
    from pulumi.provider.experimental.schema import generate_schema

    analyzed = analyzer().analyze(components())
    spec = generate_schema(
        NAME,
        package_version,
        None,
        analyzed["component_definitions"],
        analyzed["type_definitions"],
        sorted(analyzed["dependencies"], key=lambda d: f"{d.name}{d.version}"),
    )
    marked = mark_secrets(spec.to_json(), secret_properties())
    return json.dumps(describe_enum_members(require(marked, required_everywhere())))


def analyzer() -> Any:
    """The SDK's analyzer, reading an inherited argument's or output's description from the
    class that declares it: the SDK publishes the fields of a class's bases but reads a field's
    docstring only from the class it analyzes (an output of ClusterComponent, a pool argument
    of _PoolArgs)."""
    import inspect

    from pulumi.provider.experimental.analyzer import Analyzer

    class Inheriting(Analyzer):
        def get_docstring(self, typ: type, name: str) -> str | None:
            own: str | None = super().get_docstring(typ, name)
            if own is not None:
                return own
            for base in declaring_bases(typ):
                if name in inspect.get_annotations(base):
                    return self.get_docstring(base, name)
            return None

    return Inheriting(NAME)


def declaring_bases(typ: type) -> list[type]:
    """The classes `typ` inherits fields from: a class's bases (`__mro__`), or the TypedDicts a
    TypedDict names as its bases in its source, since Python 3.11 keeps none of those at
    runtime (its `__mro__` is (cls, dict, object))."""
    import ast
    import inspect
    import sys
    import textwrap
    from typing import is_typeddict

    if not is_typeddict(typ):
        return list(typ.__mro__[1:])
    (node,) = ast.parse(textwrap.dedent(inspect.getsource(typ))).body
    assert isinstance(node, ast.ClassDef)
    scope = vars(sys.modules[typ.__module__])
    named = [scope.get(b.id) for b in node.bases if isinstance(b, ast.Name)]
    return [b for b in named if isinstance(b, type) and is_typeddict(b)]


def secret_properties() -> dict[str, dict[str, list[str]]]:
    """component → schema section → the properties Pulumi keeps encrypted (the SDK's analyzer
    has no marker for a secret): every kubeconfig, given or handed out (one may carry a
    credential), the HF token the Workspace stores and the OAuth client secret DashboardAccess
    stores."""
    from typing import get_type_hints

    from infra.components._base import output_names

    out: dict[str, dict[str, list[str]]] = {}
    for component in components():
        args = get_type_hints(vars(component)["__init__"]).get("args")
        given = ["kubeconfig"] if args is not None and "kubeconfig" in args.__annotations__ else []
        given += {"Workspace": ["hfToken"], "DashboardAccess": ["oauthClientSecret"]}.get(
            component.__name__, []
        )
        handed = ["kubeconfig"] if "kubeconfig" in output_names(component) else []
        sections = {"inputProperties": given, "properties": handed}
        out[component.__name__] = {k: v for k, v in sections.items() if v}
    return {k: v for k, v in out.items() if v}


def required_everywhere() -> dict[str, list[str]]:
    """component → inputs every language must give, though the Python TypedDict leaves them
    optional: a Python caller may pass the Cluster or ExistingCluster object as `cluster`,
    which gives them (the Python-only object form); TypeScript, Go, C# and YAML pass the
    cluster's id, so the schema requires them there."""
    from park_gke import CpuPool, GpuPool, TpuSlicePool

    from_cluster = ["location", "nodeServiceAccount"]
    return {c.__name__: from_cluster for c in (CpuPool, TpuSlicePool, GpuPool)}


def require(spec: dict[str, Any], required: dict[str, list[str]]) -> dict[str, Any]:
    """`spec` with each of `required` in its component's requiredInputs (a KeyError for an
    input it lacks)."""
    for component, props in required.items():
        resource = spec["resources"][f"{NAME}:index:{component}"]
        for prop in props:
            assert prop in resource["inputProperties"], (component, prop)
        resource["requiredInputs"] = sorted({*resource.get("requiredInputs", []), *props})
    return spec


def mark_secrets(spec: dict[str, Any], secrets: dict[str, dict[str, list[str]]]) -> dict[str, Any]:
    """`spec` with each of `secrets` marked `"secret": true` (a KeyError for one it lacks)."""
    for component, sections in secrets.items():
        resource = spec["resources"][f"{NAME}:index:{component}"]
        for section, props in sections.items():
            for prop in props:
                resource[section][prop]["secret"] = True
    return spec


def describe_enum_members(spec: dict[str, Any]) -> dict[str, Any]:
    """Each enum value described from the data it comes from (a machine type's chips and
    topologies, a topology's chips): the analyzer reads member docstrings only from source."""
    from infra.components._types import member_docs

    for token, body in spec.get("types", {}).items():
        docs = member_docs(token.rsplit(":", 1)[-1])
        for member in body.get("enum", []):
            if not member.get("description") and member["value"] in docs:
                member["description"] = docs[member["value"]]
    return spec


def main() -> None:
    import sys

    from pulumi.provider import main as serve

    # component_provider_host, with the provider that answers refusals as input errors
    serve(_provider_class()(components(), NAME, None, version()), sys.argv[1:])


if __name__ == "__main__":
    print(json.dumps(schema(), indent=2, sort_keys=True))
