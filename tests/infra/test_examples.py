"""The examples are tests: each runs under the mock engine and its resource graph is asserted.

examples/existing-cluster (Python) composes the components on a cluster park-gke did not
create; examples/yaml-new-cluster (Pulumi YAML) uses the package the way `pulumi package add`
serves it. The YAML program is checked against the schema the SDK's analyzer generates (types,
required inputs, property names and types, output references), then evaluated by a small
interpreter that constructs each resource through the SDK's ComponentProvider input mapping,
the same path a YAML, TypeScript or Go program's resources take into the provider.
"""

from __future__ import annotations

import re
import runpy
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.provider.experimental.analyzer import Analyzer
from pulumi.provider.experimental.component import ComponentProvider

from infra.tools import gke_api
from infra.tools.render import manifests_of, run_under_mocks
from infra.tools.schemas import validate_manifests
from park_gke import provider
from tests.conftest import ROOT
from tests.infra.test_package import SA, ZONE, _calls, _cluster_lookup

EXAMPLES = ROOT / "examples"
KUBERNETES = "1.35.0"  # the REGULAR channel's minor (infra/data/gke.yaml)


def _by_type(resources, type_token: str) -> list:
    return [r for r in resources if r.type == type_token]


# ---- Python: components on an existing cluster -----------------------------------------------


def test_the_existing_cluster_example_adds_a_slice_and_an_endpoint():
    main = EXAMPLES / "existing-cluster" / "__main__.py"
    resources, outputs = run_under_mocks(
        lambda: runpy.run_path(str(main)),
        stack="team",
        project="p",
        pulumi_project="park-gke-existing-cluster",
        config={"gcp:project": "p", "park-gke-existing-cluster:clusterName": "team-gke"},
        calls=_calls(_cluster_lookup()),
    )
    (pool,) = _by_type(resources, "gcp:container/nodePool:NodePool")
    assert pool.parent == "serve-pool" and pool.inputs["name"] == "serve-v6e-8-s0"
    # the cluster handle: its id (project and location in it) and the project itself
    assert pool.inputs["cluster"] == f"projects/p/locations/{ZONE}/clusters/team-gke"
    assert pool.inputs["project"] == "p"
    assert pool.inputs["nodeConfig"]["serviceAccount"] == SA
    assert pool.inputs["nodeConfig"]["machineType"] == "ct6e-standard-8t"
    assert not _by_type(resources, "gcp:container/cluster:Cluster")  # the cluster stays theirs
    assert not _by_type(resources, "kubernetes:helm.sh/v3:Release")  # the add-on provides KubeRay
    (service,) = _by_type(resources, "kubernetes:ray.io/v1:RayService")
    assert service.parent == "llm"
    # It waits for the namespace, its service account and the slice's node pool.
    waits = {"workspace-namespace", "workspace-service-account", pool.name}
    assert waits <= set(service.dependencies)
    # No park CPU pool on this cluster: the Ray head selects no node label it would lack.
    head = service.inputs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert "nodeSelector" not in head and head["serviceAccountName"] == "park-team-workload"
    docs = manifests_of(resources)
    assert not validate_manifests(docs, KUBERNETES)  # KubeRay's CRDs, Kubernetes' schemas
    assert not gke_api.check_resources(resources)  # GKE's API discovery document
    assert outputs["endpoint_service"] == "llm-openai"  # the OpenAI endpoint's Service
    assert outputs["bucket"] == "p-team-park"


# ---- Pulumi YAML: the package as other languages see it -------------------------------------

YAML_PROGRAM = EXAMPLES / "yaml-new-cluster" / "Pulumi.yaml"
REFERENCE = re.compile(r"\$\{([A-Za-z0-9_:-]+)(?:\.([A-Za-z0-9_]+))?\}")


def _program() -> dict[str, Any]:
    return yaml.safe_load(YAML_PROGRAM.read_text())


def _schema() -> dict[str, Any]:
    return provider.schema()


def _type_problems(value: Any, spec: dict[str, Any], schema: dict, where: str) -> list[str]:
    """A literal YAML value against a schema property (references are checked apart)."""
    if isinstance(value, str) and REFERENCE.fullmatch(value):
        return []
    if "$ref" in spec:
        ref = spec["$ref"]
        if ref.startswith("pulumi.json#/Any"):
            return []
        body = schema["types"][ref.removeprefix("#/types/")]
        if "enum" in body:  # e.g. TpuMachineType: one of its values, as the engine checks
            allowed = [member["value"] for member in body["enum"]]
            return [] if value in allowed else [f"{where}: {value!r} is not one of {allowed}"]
        return _object_problems(value, body, schema, where)
    kind = spec.get("type")
    expected = {"string": str, "integer": int, "boolean": bool, "number": (int, float)}
    if kind in expected:
        ok = isinstance(value, expected[kind]) and not (kind == "integer" and value is True)
        return [] if ok else [f"{where}: {value!r} is not a {kind}"]
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: not a list"]
        return [
            p
            for i, item in enumerate(value)
            for p in _type_problems(item, spec["items"], schema, f"{where}[{i}]")
        ]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{where}: not a mapping"]
        inner = spec.get("additionalProperties", {})
        return [
            p for k, v in value.items() for p in _type_problems(v, inner, schema, f"{where}.{k}")
        ]
    return [f"{where}: schema type {kind!r} unknown to this check"]


def _object_problems(value: Any, body: dict, schema: dict, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: not a mapping"]
    known = body.get("inputProperties") or body.get("properties") or {}
    problems = [f"{where}.{k}: no such property" for k in value if k not in known]
    required = body.get("requiredInputs", body.get("required", []))
    problems += [f"{where}.{k}: required, missing" for k in required if k not in value]
    for key, item in value.items():
        if key in known:
            problems += _type_problems(item, known[key], schema, f"{where}.{key}")
    return problems


def _references(value: Any) -> list[tuple[str, str | None]]:
    if isinstance(value, str):
        return [(m.group(1), m.group(2)) for m in REFERENCE.finditer(value)]
    if isinstance(value, dict):
        return [r for v in value.values() for r in _references(v)]
    if isinstance(value, list):
        return [r for v in value for r in _references(v)]
    return []


def test_the_yaml_program_uses_the_package_it_declares():
    program = _program()
    plugin = (YAML_PROGRAM.parent / program["packages"]["park-gke"]).resolve()
    assert plugin == ROOT / "provider" and (plugin / "PulumiPlugin.yaml").is_file()


def test_the_yaml_program_matches_the_generated_schema():
    program, schema = _program(), _schema()
    resources = program["resources"]
    names = set(program.get("config", {})) | set(program.get("variables", {}))
    problems = []
    for name, resource in resources.items():
        token = resource["type"]
        if token not in schema["resources"]:
            problems.append(f"{name}: {token} is not in the schema")
            continue
        body = schema["resources"][token]
        problems += _object_problems(resource.get("properties", {}), body, schema, name)
        for target, prop in _references(resource):
            if target in names and prop is None:
                continue
            if target not in resources:
                problems.append(f"{name}: ${{{target}}} is not a resource, config or variable")
                continue
            outputs = schema["resources"][resources[target]["type"]]["properties"]
            if prop is not None and prop not in outputs:
                problems.append(f"{name}: {target} has no output {prop!r}")
    for key, value in program.get("outputs", {}).items():
        for target, prop in _references(value):
            outputs = schema["resources"][resources[target]["type"]]["properties"]
            if prop not in outputs:
                problems.append(f"outputs.{key}: {target} has no output {prop!r}")
    assert not problems


def test_the_schema_check_catches_a_wrong_program():
    """The check above can fail: a typo, a value outside an enum and a missing input are each
    found."""
    schema = _schema()
    body = schema["resources"]["park-gke:index:TpuSlicePool"]
    wrong = {"cluster": "c", "location": ZONE, "name": "p", "machineType": 8, "topolgy": "4x4"}
    found = _object_problems(wrong, body, schema, "pool")
    assert "pool.topolgy: no such property" in found
    assert any(p.startswith("pool.machineType: 8 is not one of [") for p in found)
    assert "pool.topology: required, missing" in found


class _YamlProgram:
    """Pulumi YAML's resource semantics, as far as this example uses them: config defaults,
    variables, ${resource.output} references, options.dependsOn; each resource constructed
    through ComponentProvider.map_inputs (schema names → the component's Python arguments)."""

    def __init__(self, program: dict[str, Any], config: dict[str, Any]):
        self.program = program
        self.values = {
            **{k: v.get("default") for k, v in program.get("config", {}).items()},
            **program.get("variables", {}),
            **config,
        }
        components = provider.components()
        self.host = ComponentProvider(components, provider.NAME, None, "0.0.0")
        self.definitions = Analyzer(provider.NAME).analyze(components)["component_definitions"]
        self.classes = {c.__name__: c for c in components}
        self.built: dict[str, pulumi.ComponentResource] = {}

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, str):
            match = REFERENCE.fullmatch(value)
            if match:
                target, prop = match.groups()
                if prop is None:
                    if target in self.values:  # a variable may itself refer to config
                        return self._resolve(self.values[target])
                    return self.built[target]
                definition = self.definitions[
                    self.program["resources"][target]["type"].split(":")[-1]
                ]
                return getattr(self.built[target], definition.outputs_mapping[prop])
            return value
        if isinstance(value, dict):
            return {k: self._resolve(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._resolve(v) for v in value]
        return value

    def _order(self) -> list[str]:
        resources, done, order = self.program["resources"], set(), []

        def visit(name: str) -> None:
            if name in done:
                return
            for target, _ in _references(resources[name]):
                if target in resources:
                    visit(target)
            done.add(name)
            order.append(name)

        for name in resources:
            visit(name)
        return order

    def run(self) -> None:
        for name in self._order():
            resource = self.program["resources"][name]
            kind = resource["type"].split(":")[-1]
            inputs = self._resolve(resource.get("properties", {}))
            args = self.host.map_inputs(inputs, self.definitions[kind])
            after = self._resolve(resource.get("options", {}).get("dependsOn", []))
            opts = pulumi.ResourceOptions(depends_on=after) if after else None
            self.built[name] = self.classes[kind](name, args, opts)
        for key, value in self.program.get("outputs", {}).items():
            pulumi.export(key, self._resolve(value))


@pytest.fixture(scope="module")
def yaml_run():
    return run_under_mocks(
        lambda: _YamlProgram(_program(), {"gcp:project": "p"}).run(), stack="yaml", project="p"
    )


def test_the_yaml_program_builds_a_cluster_with_a_multi_host_slice(yaml_run):
    resources, _ = yaml_run
    (cluster,) = _by_type(resources, "gcp:container/cluster:Cluster")
    assert cluster.parent == "cluster" and cluster.inputs["deletionProtection"] is False
    pools = {r.inputs["name"]: r for r in _by_type(resources, "gcp:container/nodePool:NodePool")}
    assert set(pools) == {"system", "train-v6e-16-s0"}  # GKE names: the component's, the pool's
    assert {p.name for p in pools.values()} == {"system", "train-pool-s0"}
    # ${cluster.clusterId}: the project (gcp:project) and zone travel in the cluster's id
    assert {p.inputs["cluster"] for p in pools.values()} == {
        f"projects/p/locations/{ZONE}/clusters/{cluster.inputs['name']}"
    }
    tpu = pools["train-v6e-16-s0"]
    assert tpu.inputs["placementPolicy"]["tpuTopology"] == "4x4"
    assert tpu.inputs["autoscaling"]["maxNodeCount"] == 4  # 4 hosts of 4 chips
    assert tpu.inputs["nodeConfig"]["spot"] is True
    assert not gke_api.check_resources(resources)


def test_the_yaml_training_job_runs_on_the_slice_after_the_workspace(yaml_run):
    resources, outputs = yaml_run
    (job,) = _by_type(resources, "kubernetes:ray.io/v1:RayJob")
    assert job.parent == "training"
    (group,) = job.inputs["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["numOfHosts"] == 4 and group["replicas"] == 1
    assert "--strategy fsdp2" in job.inputs["spec"]["entrypoint"]
    waits = {"workspace-namespace", "workspace-service-account", "train-pool-s0"}
    assert waits <= set(job.dependencies)
    head = job.inputs["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"park-gke/role": "system"}  # ${system.nodeSelector}
    assert head["serviceAccountName"] == "park-yaml-workload"  # stack: the Pulumi stack
    providers = _by_type(resources, "pulumi:providers:kubernetes")
    assert {p.parent for p in providers} == {"workspace", "training"}  # from their kubeconfig
    assert not validate_manifests(manifests_of(resources), KUBERNETES)
    assert outputs["workers"] == 16 and outputs["rayJob"] == job.inputs["metadata"]["name"]
    assert outputs["kubeconfig"] == "[secret]"
