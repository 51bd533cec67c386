"""The stack's config keys: which model field each top-level key fills, which keys park reads,
and the key a pydantic error location names."""

from __future__ import annotations

from pydantic.alias_generators import to_camel

from infra.schema.models import StackConfig

# Top-level model fields and the config key each comes from.
KEY_OF_FIELD = {
    "project": "gcp:project",
    "region": "gcp:region",
    **{
        name: f"park:{to_camel(name)}"
        for name in StackConfig.model_fields
        if name not in ("project", "region", "stack")
    },
}
REQUIRED = ("project", "region", "zone")


def parks_own(key: str) -> bool:
    """A key park reads (park:*, and the gcp:* keys it takes from the provider's namespace).
    Every other key (gcp:accessToken, kubernetes:kubeconfig...) is a provider's: the provider
    reads it, park never writes it anywhere, so park's secret rules do not judge it."""
    return key.startswith("park:") or key in KEY_OF_FIELD.values()


def config_keys() -> list[str]:
    """Every config key the program reads, e.g. "gcp:project", "park:tpuPools"."""
    return list(KEY_OF_FIELD.values())


def key_of(loc: tuple[int | str, ...]) -> str:
    """The config key of a pydantic error location: ("tpu_pools", 0, "topology") →
    "park:tpuPools[0].topology"."""
    head, *rest = loc
    key = KEY_OF_FIELD.get(str(head), f"park:{head}")
    for part in rest:
        key += f"[{part}]" if isinstance(part, int) else f".{part}"
    return key
