"""The park-gke components as a Pulumi provider, for programs in every Pulumi language.

`provider/__main__.py` runs `main()` when Pulumi loads the plugin (`pulumi package add`); the
schema Pulumi generates from the components' type annotations is `schema()`, committed as
provider/schema.json (`python -m park_gke.provider > provider/schema.json`).
"""

from __future__ import annotations

import json
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
        SDK's input error (each problem at its property path), not a Python traceback."""

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
    """The package schema, as the SDK's analyzer infers it (what the CLI would get)."""
    from pulumi.provider.experimental.analyzer import Analyzer
    from pulumi.provider.experimental.schema import generate_schema

    analyzed = Analyzer(NAME).analyze(components())
    spec = generate_schema(
        NAME,
        package_version or version(),
        None,
        analyzed["component_definitions"],
        analyzed["type_definitions"],
        sorted(analyzed["dependencies"], key=lambda d: f"{d.name}{d.version}"),
    )
    return spec.to_json()


def main() -> None:
    import sys

    from pulumi.provider import main as serve

    # component_provider_host, with the provider that answers refusals as input errors
    serve(_provider_class()(components(), NAME, None, version()), sys.argv[1:])


if __name__ == "__main__":
    print(json.dumps(schema(), indent=2, sort_keys=True))
