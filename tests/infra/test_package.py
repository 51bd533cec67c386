"""park-gke as a Pulumi package: each public component built from its typed arguments alone,
through Python and through the provider other languages use, with errors that name the
component and the argument, and a schema the SDK's own analyzer infers, held as a golden.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.provider.experimental.component import ComponentProvider

import park_gke
from infra.tools.render import ProgramError, run_under_mocks
from park_gke import provider, testing
from tests.conftest import ROOT

ZONE = "us-east5-b"
SA = "nodes@p.iam.gserviceaccount.com"
NODE_POOL = "gcp:container/nodePool:NodePool"


def _run(build) -> list:
    resources, _ = run_under_mocks(build, stack="t", project="p")
    return resources


def _children(resources, name: str) -> dict[str, int]:
    """Resource types registered under the component named `name`, with counts."""
    counts: dict[str, int] = {}
    for r in resources:
        if r.parent == name:
            counts[r.type] = counts.get(r.type, 0) + 1
    return counts


# Each public component with only its required arguments (and what makes it create something),
# and the resources it must create under itself.
MINIMAL: dict[str, tuple[dict[str, Any], dict[str, int]]] = {
    "ProjectApis": (
        {"project": "p", "services": ["container.googleapis.com"]},
        {"gcp:projects/service:Service": 1},
    ),
    "WorkloadImage": (
        {"repository": "us-east5-docker.pkg.dev/p/r/park-workloads", "tag": "v1"},
        {"docker-build:index:Image": 1},
    ),
    "ModelStaging": (
        {"project": "p", "models": ["Qwen/Qwen3-1.7B"], "image": "img"},
        {"kubernetes:batch/v1:Job": 1},
    ),
    "Network": (
        {"project": "p", "region": "us-east5"},
        {
            "gcp:compute/network:Network": 1,
            "gcp:compute/subnetwork:Subnetwork": 1,
            "gcp:compute/router:Router": 1,
            "gcp:compute/routerNat:RouterNat": 1,
        },
    ),
    "Cluster": (
        {"project": "p", "location": ZONE, "network": "vpc", "subnetwork": "subnet"},
        {"gcp:container/cluster:Cluster": 1, "gcp:serviceaccount/account:Account": 1},
    ),
    "CpuPool": (
        {"cluster": "c", "location": ZONE, "node_service_account": SA},
        {NODE_POOL: 1},
    ),
    "TpuSlicePool": (
        {
            "cluster": "c",
            "location": ZONE,
            "node_service_account": SA,
            "name": "train",
            "machine_type": "ct6e-standard-4t",
            "topology": "4x4",
            "slices": 2,
        },
        {NODE_POOL: 2},
    ),
    "GpuPool": (
        {
            "cluster": "c",
            "location": ZONE,
            "node_service_account": SA,
            "name": "gpu",
            "machine_type": "a3-highgpu-8g",
            "accelerator_type": "nvidia-h100-80gb",
        },
        {NODE_POOL: 1},
    ),
    "Storage": (
        {"project": "p", "region": "us-east5", "node_service_account": SA},
        {
            "gcp:storage/bucket:Bucket": 1,
            "gcp:artifactregistry/repository:Repository": 1,
            "gcp:serviceaccount/account:Account": 1,
            "gcp:serviceaccount/iAMMember:IAMMember": 1,
        },
    ),
    "KubeRayOperator": ({"install": "helm"}, {"kubernetes:helm.sh/v3:Release": 1}),
    "Workspace": (
        {"project": "p"},
        {"kubernetes:core/v1:Namespace": 1, "kubernetes:networking.k8s.io/v1:NetworkPolicy": 1},
    ),
    "Kueue": (
        {"queued_pools": [{"name": "q", "machine_type": "ct6e-standard-4t", "topology": "4x4"}]},
        {"kubernetes:helm.sh/v3:Release": 1, "kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue": 1},
    ),
    "RayTrainingJob": (
        {
            "project": "p",
            "location": ZONE,
            "pool": {"name": "train", "machine_type": "ct6e-standard-4t", "topology": "4x4"},
            "training": {},
        },
        {"kubernetes:ray.io/v1:RayJob": 1},
    ),
    "LlmService": (
        {
            "project": "p",
            "location": ZONE,
            "pool": {"name": "serve", "machine_type": "ct6e-standard-8t", "topology": "2x4"},
            "models": [{"name": "qwen", "source": "Qwen/Qwen3-1.7B"}],
        },
        {"kubernetes:ray.io/v1:RayService": 1},
    ),
    "RayMetrics": (
        {"project": "p", "cluster_name": "c"},
        {"kubernetes:monitoring.googleapis.com/v1:PodMonitoring": 2},
    ),
    "DashboardAccess": (
        {
            "project": "p",
            "domain": "ray.example.com",
            "iap_members": ["group:ml@example.com"],
            "oauth_client_id": "123-abc.apps.googleusercontent.com",
            "oauth_secret": "iap-oauth",
        },
        {"gcp:compute/globalAddress:GlobalAddress": 1, "gcp:iap/webIamMember:WebIamMember": 1},
    ),
}


def _cluster_lookup(**changes: Any) -> dict[str, Any]:
    """getCluster's answer (wire names) for a cluster park-gke could use, with `changes`."""
    return testing.existing_cluster("team-gke", ZONE, "p", node_service_account=SA, **changes)


def _calls(answer: dict[str, Any]):
    def call(token: str, args: dict[str, Any]) -> dict[str, Any]:
        if token == testing.CLIENT_CONFIG:  # WorkloadImage's push token
            return {"accessToken": "t"}
        assert token == "gcp:container/getCluster:getCluster", token
        assert args["name"] == "team-gke" and args["location"] == ZONE
        return answer

    return call


def test_every_public_component_is_tested_and_exported():
    assert set(MINIMAL) | {"ExistingCluster"} == set(park_gke.COMPONENTS)
    for name in park_gke.COMPONENTS:
        component = getattr(park_gke, name)
        assert issubclass(component, pulumi.ComponentResource)
        assert getattr(park_gke, f"{name}Args")  # its typed arguments are public too


def test_the_public_names_are_the_lazy_exports():
    assert park_gke.__all__ == sorted(park_gke._EXPORTS)
    assert all(getattr(park_gke, name) is not None for name in park_gke.__all__)


def test_importing_the_package_loads_no_provider_module():
    import subprocess

    code = "import park_gke, sys; print(sorted(m for m in sys.modules if m.startswith('pulumi_')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_each_component_builds_from_its_typed_args_alone(name):
    args, expected = MINIMAL[name]
    component, typed_args = getattr(park_gke, name), getattr(park_gke, f"{name}Args")
    resources = _run(lambda: component("it", typed_args(**args)))
    (root,) = [r for r in resources if r.name == "it" and not r.custom]
    assert root.type == f"park-gke:index:{name}"
    below = _children(resources, "it")
    for type_token, count in expected.items():
        assert below.get(type_token) == count, (type_token, below)


@pytest.fixture(scope="module")
def host() -> ComponentProvider:
    """The SDK's ComponentProvider over our components, built once: building it runs the
    schema analyzer over every component (a second of CPU)."""
    return ComponentProvider(provider.components(), provider.NAME, None, "0.0.0")


@pytest.mark.parametrize("name", sorted(MINIMAL))
def test_each_component_builds_through_the_provider_other_languages_use(name, host):
    """The same arguments, camelCased as a TypeScript or YAML program sends them, through
    the SDK's ComponentProvider (what component_provider_host serves)."""
    args, expected = MINIMAL[name]
    wire = _wire(args)
    resources = _run(lambda: host.construct("it", f"park-gke:index:{name}", wire, None))
    below = _children(resources, "it")
    for type_token, count in expected.items():
        assert below.get(type_token) == count, (type_token, below)


def _wire(value: Any) -> Any:
    """Argument names camelCased (values kept), as another language's SDK sends them."""
    from pydantic.alias_generators import to_camel

    if isinstance(value, dict):
        return {to_camel(k): _wire(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_wire(v) for v in value]
    return value


def test_an_existing_cluster_hands_on_its_name_kubeconfig_and_node_account():
    def build():
        cluster = park_gke.ExistingCluster(
            "team", {"project": "p", "location": ZONE, "name": "team-gke"}
        )
        park_gke.TpuSlicePool(
            "serve",
            {
                "cluster": cluster.name,
                "location": ZONE,
                "node_service_account": cluster.node_service_account,
                "name": "serve",
                "machine_type": "ct6e-standard-8t",
                "topology": "2x4",
            },
        )
        park_gke.Workspace("space", {"project": "p", "kubeconfig": cluster.kubeconfig})
        pulumi.export("kubeconfig", cluster.kubeconfig)

    resources, outputs = run_under_mocks(
        build, stack="t", project="p", calls=_calls(_cluster_lookup())
    )
    (pool,) = [r for r in resources if r.type == NODE_POOL]
    assert pool.inputs["cluster"] == "team-gke"
    assert pool.inputs["nodeConfig"]["serviceAccount"] == SA
    (kube,) = [r for r in resources if r.type == "pulumi:providers:kubernetes"]
    assert kube.parent == "space" and kube.inputs["enableServerSideApply"] == "true"
    assert outputs["kubeconfig"] == "[secret]"
    namespace = [r for r in resources if r.type == "kubernetes:core/v1:Namespace"]
    assert namespace and namespace[0].parent == "space"


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"enableAutopilot": True}, "Autopilot"),
        ({"workloadIdentityConfigs": []}, "--workload-pool=p.svc.id.goog"),
        (
            {"addonsConfigs": [{"gcsFuseCsiDriverConfigs": [{"enabled": False}]}]},
            "GcsFuseCsiDriver=ENABLED",
        ),
        (
            {"addonsConfigs": [{"gcsFuseCsiDriverConfigs": [{"enabled": True}]}]},
            "RayOperator=ENABLED",
        ),
        ({"masterVersion": "1.30.5-gke.1014000"}, "older than TPU v6e needs"),
        ({"nodeConfigs": [{"serviceAccount": "default"}]}, "pass node_service_account"),
    ],
)
def test_an_existing_cluster_park_cannot_use_fails_the_preview_saying_how_to_fix_it(
    changes, fragment
):
    def build():
        cluster = park_gke.ExistingCluster(
            "team", {"project": "p", "location": ZONE, "name": "team-gke"}
        )
        pulumi.export("name", cluster.name)

    with pytest.raises(ProgramError) as err:
        run_under_mocks(build, stack="t", project="p", calls=_calls(_cluster_lookup(**changes)))
    assert "ExistingCluster 'team'" in str(err.value) and fragment in str(err.value)


# ---- errors that name the component and the argument ----------------------------------------


@pytest.mark.parametrize(
    ("name", "changes", "fragment"),
    [
        (
            "TpuSlicePool",
            {"topology": None},
            "TpuSlicePool 'it': invalid arguments:\n  - args.topology: required",
        ),
        ("TpuSlicePool", {"topology": 4}, "args.topology = 4: expected a string"),
        ("TpuSlicePool", {"topology": "3x3"}, "args.topology = '3x3'"),
        ("TpuSlicePool", {"slices": "two"}, "args.slices = 'two': expected an integer"),
        ("CpuPool", {"disk_size_gb": 10}, "args.disk_size_gb = 10"),
        ("Cluster", {"release_channel": "NIGHTLY"}, "args.release_channel = 'NIGHTLY'"),
        ("Storage", {"node_service_account": None}, "args.node_service_account: required"),
        (
            "LlmService",
            {"models": [{"name": "q", "source": "Qwen/Qwen3-1.7B", "tensor_parallel_size": 3}]},
            "args.models[0].tensor_parallel_size = 3",
        ),
        ("RayTrainingJob", {"training": {"strategy": "zero3"}}, "args.training.strategy = 'zero3'"),
        (
            "RayTrainingJob",
            {"pool": {"name": "t", "machine_type": "ct6e-standard-9t", "topology": "2x4"}},
            "args.pool.machine_type = 'ct6e-standard-9t'",
        ),
        ("KubeRayOperator", {"install": "kustomize"}, "args.install = 'kustomize'"),
        (
            "Workspace",
            {"kuberay_install": "both"},
            "args.kuberay_install = 'both': allowed: addon, helm",
        ),
    ],
)
def test_a_bad_argument_names_the_component_and_the_field(name, changes, fragment):
    args = {**MINIMAL[name][0], **changes}
    args = {k: v for k, v in args.items() if v is not None}
    component = getattr(park_gke, name)
    with pytest.raises(ProgramError) as err:
        _run(lambda: component("it", args))
    assert fragment in str(err.value)


def test_a_bad_argument_never_echoes_a_credential():
    token = "hf_" + "Qx9z" * 9
    args = {**MINIMAL["Workspace"][0], "kuberay_install": token}
    with pytest.raises(ProgramError) as err:
        _run(lambda: park_gke.Workspace("it", args))
    assert "args.kuberay_install" in str(err.value) and token not in str(err.value)


def test_a_missing_argument_through_the_provider_names_the_component_and_the_field(host):
    from pulumi.errors import InputPropertyError

    wire = _wire({k: v for k, v in MINIMAL["TpuSlicePool"][0].items() if k != "topology"})
    with pytest.raises(ProgramError) as err:
        _run(lambda: host.construct("it", "park-gke:index:TpuSlicePool", wire, None))
    assert isinstance(err.value.__cause__, InputPropertyError)
    assert "Missing required input 'topology' on 'TpuSlicePool'" in str(err.value)


def test_the_plugin_manifest_hosts_the_components():
    import yaml

    manifest = yaml.safe_load((ROOT / "provider" / "PulumiPlugin.yaml").read_text())
    assert manifest["runtime"]["name"] == "python"
    entry = (ROOT / "provider" / "__main__.py").read_text()
    assert "park_gke.provider import main" in entry
    assert (ROOT / "provider" / "requirements.txt").read_text().splitlines()[-1] == ".."


def test_the_package_is_what_the_wheel_ships():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "park_gke*" in project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert Path(park_gke.__file__).parent == ROOT / "park_gke"


def test_the_components_page_shows_each_language_path_and_a_real_error():
    section = (ROOT / "docs" / "components.md").read_text()
    for needed in ("```python", "```yaml", "```typescript", "```go", "pulumi package add"):
        assert needed in section, needed
    for name in park_gke.COMPONENTS:
        assert f"`{name}`" in section, name  # every public component is in its table
    # The error it shows is the one the component gives.
    args = {**MINIMAL["TpuSlicePool"][0], "name": "serve-v6e-8"}
    args |= {"machine_type": "ct6e-standard-8t", "topology": "3x3", "slices": 1}
    with pytest.raises(ProgramError) as err:
        _run(lambda: park_gke.TpuSlicePool("serve", args))
    assert str(err.value) in section
