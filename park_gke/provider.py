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
    from pulumi.provider.experimental import component_provider_host

    component_provider_host(components(), NAME, version=version())


if __name__ == "__main__":
    print(json.dumps(schema(), indent=2, sort_keys=True))
