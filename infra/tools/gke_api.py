"""The recorded `gcp:container` Cluster and NodePool inputs, and the `gcp:compute` Firewall and
ResourcePolicy (TPU7x workload policies), checked against Google's own API schemas.

The schemas are Google's discovery documents (infra/schemas/gke-container-v1/container.v1.json,
and the Firewall schemas of compute.v1 in infra/schemas/gce-compute-v1/, from
google-api-python-client). The provider (pulumi-gcp 10.2.0, generated from terraform-provider-
google) names some fields differently from the API; `cluster_body` / `node_pool_body` /
`firewall_body` rewrite the recorded inputs the way the provider's expand functions do, then every
field must exist in the API's schema, with the API's type, and every enum value must be one the
API lists. A field or enum value the API marks deprecated (`deprecated`, `enumDeprecated`: "no
longer supported") is a problem too: GKE may ignore or refuse it. A field the provider keeps for
itself (deletionProtection, removeDefaultNodePool, ...) is not sent, nor is an empty string:
the provider's API client omits empty fields (`json:",omitempty"`), so a TPU7x pool's
`placementPolicy.type: ""` reaches GKE as no type at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra import datafile

DISCOVERY = (
    Path(__file__).resolve().parents[1] / "schemas" / "gke-container-v1" / "container.v1.json"
)
COMPUTE_DISCOVERY = (
    Path(__file__).resolve().parents[1] / "schemas" / "gce-compute-v1" / "compute.v1.firewall.json"
)
CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
FIREWALL = "gcp:compute/firewall:Firewall"
RESOURCE_POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"

# Provider-only arguments: they shape what the provider does, the API never sees them.
CLUSTER_PROVIDER_ONLY = {"deletionProtection", "removeDefaultNodePool", "location", "project"}
NODE_POOL_PROVIDER_ONLY = {"cluster", "location", "project", "nodeCount"}
FIREWALL_PROVIDER_ONLY = {"project", "deletionPolicy"}
RESOURCE_POLICY_PROVIDER_ONLY = {"project"}
# Deprecated API fields the pinned provider (pulumi-gcp 10.2.0) has no other way to express; any
# other deprecated field or enum value is a problem. Re-check when the provider is upgraded.
PROVIDER_DEPRECATED = {
    # the default pool (created, then removed: remove_default_node_pool) is sized and configured
    # only through these; pulumi-gcp has no cluster argument for the replacement
    "Cluster.initialNodeCount": "the default pool, removed after create",
    "Cluster.nodeConfig": "the default pool, removed after create",
    # the replacements (networkConfig.defaultEnablePrivateNodes, ipEndpointsConfig.
    # enablePublicEndpoint) are not arguments of pulumi-gcp 10.2.0's Cluster
    "Cluster.privateClusterConfig.enablePrivateNodes": "no replacement in pulumi-gcp 10.2.0",
    "Cluster.privateClusterConfig.enablePrivateEndpoint": "no replacement in pulumi-gcp 10.2.0",
}


def discovery() -> dict[str, Any]:
    data: dict[str, Any] = datafile.load(DISCOVERY)
    return data


def compute_discovery() -> dict[str, Any]:
    data: dict[str, Any] = datafile.load(COMPUTE_DISCOVERY)
    return data


def revision() -> str:
    return str(discovery()["revision"])


def compute_revision() -> str:
    return str(compute_discovery()["revision"])


def _node_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """pulumi's nodeConfig → the API's NodeConfig (guestAccelerators → accelerators)."""
    body = {k: v for k, v in config.items() if k != "guestAccelerators"}
    accelerators = []
    for accelerator in config.get("guestAccelerators") or []:
        item = {k: v for k, v in accelerator.items() if k not in ("type", "count")}
        item["acceleratorType"] = accelerator.get("type")
        item["acceleratorCount"] = accelerator.get("count")
        accelerators.append(item)
    if accelerators:
        body["accelerators"] = accelerators
    return body


def _move(body: dict[str, Any], source: str, target: str) -> None:
    """Move `source` (a top-level key) to the dotted `target` path, if it is set."""
    if source not in body:
        return
    value = body.pop(source)
    *parents, leaf = target.split(".")
    node = body
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def cluster_body(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """What the provider sends as CreateClusterRequest.cluster for these inputs."""
    body = {k: v for k, v in inputs.items() if k not in CLUSTER_PROVIDER_ONLY}
    _move(body, "minMasterVersion", "initialClusterVersion")
    _move(body, "datapathProvider", "networkConfig.datapathProvider")
    _move(body, "gatewayApiConfig", "networkConfig.gatewayApiConfig")
    if "enableShieldedNodes" in body:
        body["shieldedNodes"] = {"enabled": body.pop("enableShieldedNodes")}
    if "nodeConfig" in body:
        body["nodeConfig"] = _node_config(body["nodeConfig"])
    addons = body.get("addonsConfig")
    if isinstance(addons, Mapping) and "rayOperatorConfigs" in addons:
        addons = dict(addons)
        configs = addons.pop("rayOperatorConfigs") or [{}]
        addons["rayOperatorConfig"] = configs[0]  # a list in pulumi, one object in the API
        body["addonsConfig"] = addons
    for section in ("monitoringConfig", "loggingConfig"):
        config = body.get(section)
        if isinstance(config, Mapping):
            config = dict(config)
            if "enableComponents" in config:
                config["componentConfig"] = {"enableComponents": config.pop("enableComponents")}
            if "managedPrometheus" in config:
                config["managedPrometheusConfig"] = config.pop("managedPrometheus")
            body[section] = config
    if isinstance(body.get("maintenancePolicy"), Mapping):
        body["maintenancePolicy"] = _maintenance_policy(body["maintenancePolicy"])
    if "masterAuthorizedNetworksConfig" in body:
        # terraform sends it as the IP endpoint's authorized networks (the top-level field is
        # deprecated, and the API refuses both at once)
        authorized = body.pop("masterAuthorizedNetworksConfig")
        endpoints = dict(body.get("controlPlaneEndpointsConfig") or {})
        ip = dict(endpoints.get("ipEndpointsConfig") or {})
        ip["authorizedNetworksConfig"] = {**authorized, "enabled": True}
        endpoints["ipEndpointsConfig"] = ip
        body["controlPlaneEndpointsConfig"] = endpoints
    return body


def _maintenance_policy(policy: Mapping[str, Any]) -> dict[str, Any]:
    """pulumi's maintenancePolicy → the API's MaintenancePolicy, as expandMaintenancePolicy
    does: the windows and exclusions go into `window`; a recurring window's times into its
    `window`; the exclusions become a map by name, their options `maintenanceExclusionOptions`."""
    window: dict[str, Any] = {}
    if "dailyMaintenanceWindow" in policy:
        window["dailyMaintenanceWindow"] = policy["dailyMaintenanceWindow"]
    recurring = policy.get("recurringWindow")
    if isinstance(recurring, Mapping):
        times = {k: v for k, v in recurring.items() if k != "recurrence"}
        window["recurringWindow"] = {"window": times, "recurrence": recurring.get("recurrence")}
    exclusions = {}
    for exclusion in policy.get("maintenanceExclusions") or []:
        item = {
            k: v for k, v in exclusion.items() if k not in ("exclusionName", "exclusionOptions")
        }
        if "exclusionOptions" in exclusion:
            item["maintenanceExclusionOptions"] = exclusion["exclusionOptions"]
        exclusions[exclusion.get("exclusionName", "")] = item
    if exclusions:
        window["maintenanceExclusions"] = exclusions
    rest = {
        k: v
        for k, v in policy.items()
        if k not in ("dailyMaintenanceWindow", "recurringWindow", "maintenanceExclusions")
    }
    return {**rest, **({"window": window} if window else {})}


def node_pool_body(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """What the provider sends as CreateNodePoolRequest.nodePool for these inputs."""
    body = {k: v for k, v in inputs.items() if k not in NODE_POOL_PROVIDER_ONLY}
    if "nodeConfig" in body:
        body["config"] = _node_config(body.pop("nodeConfig"))
    _move(body, "nodeLocations", "locations")
    if "nodeCount" in inputs:
        body["initialNodeCount"] = inputs["nodeCount"]  # a fixed size is created at that size
    if isinstance(body.get("autoscaling"), Mapping):
        body["autoscaling"] = {**body["autoscaling"], "enabled": True}  # terraform always sets it
    return body


def firewall_body(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """What the provider sends as the compute Firewall for these inputs (allows → allowed,
    protocol → IPProtocol; a log config is sent enabled)."""
    body = {k: v for k, v in inputs.items() if k not in FIREWALL_PROVIDER_ONLY}
    for source, target in (("allows", "allowed"), ("denies", "denied")):
        if source in body:
            body[target] = [
                {("IPProtocol" if k == "protocol" else k): v for k, v in rule.items()}
                for rule in body.pop(source) or []
            ]
    if isinstance(body.get("logConfig"), Mapping):
        body["logConfig"] = {**body["logConfig"], "enable": True}
    return body


def _sent(value: Any) -> Any:
    """What the API client serializes: empty strings left out, as `omitempty` does."""
    if isinstance(value, Mapping):
        return {k: _sent(v) for k, v in value.items() if v != ""}
    if isinstance(value, list):
        return [_sent(v) for v in value]
    return value


def _problems(
    value: Any, schema: Mapping[str, Any], path: str, schemas: Mapping[str, Any] | None = None
) -> list[str]:
    schemas = discovery()["schemas"] if schemas is None else schemas
    if "$ref" in schema:
        schema = schemas[schema["$ref"]]
    kind = schema.get("type")
    if value is None:
        return []
    if kind == "object" and "properties" in schema:
        if not isinstance(value, Mapping):
            return [f"{path}: expected an object ({schema.get('id', 'object')}), got {value!r}"]
        found = []
        for key, item in value.items():
            field = schema["properties"].get(key)
            if field is None:
                known = ", ".join(sorted(schema["properties"]))
                where = schema.get("id") or path
                found.append(f"{path}.{key}: no such field in the API's {where}; it has {known}")
                continue
            deprecated = field.get("deprecated") and f"{path}.{key}" not in PROVIDER_DEPRECATED
            if deprecated and item is not None:
                found.append(f"{path}.{key}: deprecated in the API: {_why(field)}")
                continue
            found += _problems(item, field, f"{path}.{key}", schemas)
        return found
    if kind == "object":  # a map
        if not isinstance(value, Mapping):
            return [f"{path}: expected a map, got {value!r}"]
        inner = schema.get("additionalProperties") or {}
        return [p for k, v in value.items() for p in _problems(v, inner, f"{path}.{k}", schemas)]
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {value!r}"]
        items = schema.get("items") or {}
        return [
            p for i, v in enumerate(value) for p in _problems(v, items, f"{path}[{i}]", schemas)
        ]
    if kind == "boolean" and not isinstance(value, bool):
        return [f"{path}: expected true or false, got {value!r}"]
    if kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
        return [f"{path}: expected an integer, got {value!r}"]
    if kind == "number" and not isinstance(value, int | float):
        return [f"{path}: expected a number, got {value!r}"]
    if kind == "string":
        int64 = schema.get("format") in ("int64", "uint64")
        if not (isinstance(value, str) or (int64 and isinstance(value, int))):
            return [f"{path}: expected a string, got {value!r}"]
        allowed = schema.get("enum")
        if allowed and value not in allowed:
            return [f"{path}: {value!r} is not one of the API's values: {', '.join(allowed)}"]
        deprecated = schema.get("enumDeprecated") or [False] * len(allowed or [])
        if allowed and deprecated[allowed.index(value)]:
            current = [v for v, old in zip(allowed, deprecated, strict=True) if not old]
            return [
                f"{path}: {value!r} is deprecated in the API "
                f"({_enum_why(schema, str(value))}); current values: {', '.join(current)}"
            ]
    return []


def _why(field: Mapping[str, Any]) -> str:
    """The first sentence of a field's description: the API's own reason."""
    return str(field.get("description", "")).split(". ")[0].removeprefix("Deprecated: ")


def _enum_why(schema: Mapping[str, Any], value: str) -> str:
    descriptions = schema.get("enumDescriptions") or []
    index = schema["enum"].index(value)
    text = descriptions[index] if index < len(descriptions) else "deprecated"
    return str(text).split(". ")[0].removeprefix("Deprecated: ")


def check(resource_type: str, name: str, inputs: Mapping[str, Any]) -> list[str]:
    """Problems of one recorded resource against the API (empty for other types)."""
    schemas = discovery()["schemas"]
    if resource_type == CLUSTER:
        body, schema = cluster_body(inputs), "Cluster"
    elif resource_type == NODE_POOL:
        body, schema = node_pool_body(inputs), "NodePool"
    elif resource_type == FIREWALL:
        body, schema = firewall_body(inputs), "Firewall"
        schemas = compute_discovery()["schemas"]
    elif resource_type == RESOURCE_POLICY:
        body = {k: v for k, v in inputs.items() if k not in RESOURCE_POLICY_PROVIDER_ONLY}
        schema, schemas = "ResourcePolicy", compute_discovery()["schemas"]
    else:
        return []
    body = _sent(body)
    return [f"{schema} {name}: {p}" for p in _problems(body, {"$ref": schema}, schema, schemas)]


def check_resources(resources: list[Any]) -> list[str]:
    """Every Cluster, NodePool, Firewall and ResourcePolicy of a render
    (`infra.tools.render.Resource`s)."""
    return [p for r in resources for p in check(r.type, r.name, r.inputs)]
