"""park-gke's components composed as a package user composes them: handles instead of
conventions, names from the component (any number of instances), `stack` and `project` followed
everywhere, strict arguments, and the public testing helper that holds programs to what the
engine refuses."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest
from pulumi.errors import InputPropertiesError
from pulumi.provider.experimental.component import ComponentProvider

import park_gke
from park_gke import provider, testing
from park_gke.testing import ProgramError

ZONE = "us-east5-b"
SA = "nodes@p.iam.gserviceaccount.com"
NODE_POOL = "gcp:container/nodePool:NodePool"
RAY_SERVICE = "kubernetes:ray.io/v1:RayService"
RAY_JOB = "kubernetes:ray.io/v1:RayJob"
POOL = {"cluster": "c", "location": ZONE, "node_service_account": SA}
SERVE_POOL = {"name": "serve", "machine_type": "ct6e-standard-8t", "topology": "2x4"}
QWEN = [{"name": "qwen", "source": "Qwen/Qwen3-1.7B"}]


def _service(**more: Any) -> dict[str, Any]:
    return {"project": "p", "location": ZONE, "pool": SERVE_POOL, "models": QWEN, **more}


def _new_cluster(project: str, **more: Any) -> park_gke.Cluster:
    """A new cluster of `project` in a Network of its own."""
    net = park_gke.Network("net", {"project": project, "region": "us-east5"})
    args = {"network": net.network_name, "subnetwork": net.subnetwork_name, **more}
    return park_gke.Cluster("gke", {"project": project, "location": ZONE, **args})  # type: ignore[typeddict-item]


def _storage(
    cluster: park_gke.Cluster | park_gke.ExistingCluster, project: str
) -> park_gke.Storage:
    """The stack's bucket and registry in `project`, the nodes of `cluster` may read them."""
    return park_gke.Storage(
        "storage",
        {
            "project": project,
            "region": "us-east5",
            "node_service_account": cluster.node_service_account,
            "cluster": cluster,  # type: ignore[typeddict-item]
        },
    )


# ---- the testing helper refuses what the engine refuses ----------------------------------------


def test_two_cpu_pools_with_one_name_are_one_urn_twice():
    def build() -> None:
        park_gke.CpuPool("system", POOL)
        park_gke.CpuPool("system", POOL)

    with pytest.raises(ProgramError) as err:
        testing.run(build, project="p")
    assert "Duplicate resource URN" in str(err.value)
    # the component or its node pool, whichever registers second first
    assert "park-gke:index:CpuPool" in str(err.value) and "::system'" in str(err.value)


def test_two_cpu_pools_with_their_own_names_coexist():
    def build() -> None:
        park_gke.CpuPool("system", POOL)
        park_gke.CpuPool("batch", {**POOL, "machine_type": "e2-standard-4"})

    result = testing.run(build, project="p")
    pools = {r.parent: r.inputs for r in result.of_type(NODE_POOL)}
    assert set(pools) == {"system", "batch"}
    assert pools["system"]["name"] == "system" and pools["batch"]["name"] == "batch"


def test_a_child_named_twice_under_two_parents_of_one_type_is_one_urn():
    """The engine's URN carries the parent's type, not its name: the helper does the same."""

    def build() -> None:
        park_gke.CpuPool("a", {**POOL, "name": "same"})
        park_gke.CpuPool("b", {**POOL, "cluster": "other", "name": "same"})

    result = testing.run(build, project="p")  # children are named after their component
    assert sorted(r.name for r in result.of_type(NODE_POOL)) == ["a", "b"]


def test_the_existing_cluster_lookup_is_mocked_and_a_missing_one_is_named():
    def build() -> None:
        cluster = park_gke.ExistingCluster(
            "team", {"project": "p", "location": ZONE, "name": "team-gke"}
        )
        pulumi.export("version", cluster.version)

    result = testing.run(
        build, project="p", clusters=[testing.existing_cluster("team-gke", project="p")]
    )
    assert result.outputs["version"].startswith("1.35")
    with pytest.raises(ProgramError) as err:
        testing.run(build, project="p", clusters=[testing.existing_cluster("other", project="p")])
    assert "'team-gke'" in str(err.value) and "existing_cluster" in str(err.value)


# ---- names from the component ------------------------------------------------------------------


def test_two_endpoints_share_one_namespace_under_their_own_names():
    def build() -> None:
        park_gke.Workspace("space", {"project": "p"})
        park_gke.LlmService("chat", _service())
        park_gke.LlmService("code", _service())

    result = testing.run(build, project="p")
    services = {r.inputs["metadata"]["name"]: r for r in result.of_type(RAY_SERVICE)}
    assert set(services) == {"chat", "code"}
    endpoints = {
        n: s.inputs["spec"]["serveService"]["metadata"]["name"] for n, s in services.items()
    }
    assert endpoints == {"chat": "chat-openai", "code": "code-openai"}
    head = services["chat"].inputs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    assert head["metadata"]["labels"]["park-gke/workload"] == "chat"


def test_two_endpoints_aiming_at_one_service_are_refused_at_preview():
    def build() -> None:
        park_gke.LlmService("chat", _service(endpoint_service="openai"))
        park_gke.LlmService("code", _service(endpoint_service="openai"))

    with pytest.raises(ProgramError) as err:
        testing.run(build, project="p")
    message = str(err.value)
    assert "LlmService 'code'" in message and "Service park/openai" in message
    assert "LlmService 'chat'" in message


def test_two_workspaces_coexist_in_their_own_namespaces_and_not_in_one():
    def two(second: str) -> Any:
        def build() -> None:
            park_gke.Workspace("a", {"project": "p", "namespace": "team-a"})
            park_gke.Workspace("b", {"project": "p", "namespace": second})

        return build

    result = testing.run(two("team-b"), project="p")
    namespaces = {r.parent: r for r in result.of_type("kubernetes:core/v1:Namespace")}
    assert namespaces["a"].name == "a-namespace" and namespaces["b"].name == "b-namespace"
    with pytest.raises(ProgramError) as err:
        testing.run(two("team-a"), project="p")
    assert "Workspace 'b'" in str(err.value) and "Namespace team-a" in str(err.value)


# ---- stack, project, handles -------------------------------------------------------------------


def test_stack_defaults_to_the_pulumi_stack_in_every_component():
    def build() -> None:
        storage = park_gke.Storage(
            "storage", {"project": "p", "region": "us-east5", "node_service_account": SA}
        )
        space = park_gke.Workspace("space", {"project": "p"})
        park_gke.LlmService("chat", _service(namespace=space, bucket=storage))

    result = testing.run(build, project="p", stack="team")
    (bucket,) = result.of_type("gcp:storage/bucket:Bucket")
    assert bucket.inputs["name"] == "p-team-park"
    (ksa,) = result.of_type("kubernetes:core/v1:ServiceAccount")
    (service,) = result.of_type(RAY_SERVICE)
    head = service.inputs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == ksa.inputs["metadata"]["name"] == "park-team-workload"
    volumes = {v["name"]: v for v in head["volumes"]}
    assert volumes["gcs"]["csi"]["volumeAttributes"]["bucketName"] == "p-team-park"


def test_every_gcp_resource_is_created_in_the_given_project():
    def build() -> None:
        cluster = _new_cluster("other")
        _storage(cluster, "other")
        park_gke.CpuPool("system", {"cluster": cluster})

    result = testing.run(build, project="default-project")
    gcp = [r for r in result.resources if r.custom and r.type.startswith("gcp:")]
    takes_project = [r for r in gcp if "iAMMember" not in r.type or "projects/" in r.type]
    unset = [
        f"{r.type} {r.name}"
        for r in takes_project
        if r.type != "gcp:storage/bucketIAMMember:BucketIAMMember"
        and r.type != "gcp:serviceaccount/iAMMember:IAMMember"
        and r.inputs.get("project") != "other"
    ]
    assert not unset


def test_a_pool_takes_an_existing_cluster_in_another_project_as_a_handle():
    def build() -> None:
        cluster = park_gke.ExistingCluster(
            "team", {"project": "other", "location": ZONE, "name": "team-gke"}
        )
        park_gke.TpuSlicePool(
            "serve", {"cluster": cluster, "machine_type": "ct6e-standard-8t", "topology": "2x4"}
        )

    lookup = testing.existing_cluster("team-gke", project="other", node_service_account=SA)
    result = testing.run(build, project="p", clusters=[lookup])
    (pool,) = result.of_type(NODE_POOL)
    assert pool.inputs["cluster"] == f"projects/other/locations/{ZONE}/clusters/team-gke"
    assert pool.inputs["project"] == "other" and pool.inputs["location"] == ZONE
    assert pool.inputs["nodeConfig"]["serviceAccount"] == SA
    assert pool.inputs["name"] == "serve-s0"  # the pool's name defaults to the component's


# ---- the Ray head's placement ------------------------------------------------------------------


def _head_and_submitter(job: Any) -> list[dict[str, Any]]:
    spec = job.inputs["spec"]
    return [
        spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"],
        spec["submitterPodTemplate"]["spec"],
    ]


def test_the_ray_head_selects_no_label_unless_given_the_cpu_pool():
    pool = {"name": "train", "machine_type": "ct6e-standard-4t", "topology": "4x4"}

    def build(head: bool) -> Any:
        def program() -> None:
            cpu = park_gke.CpuPool("system", POOL)
            extra = {"head_node_selector": cpu} if head else {}
            park_gke.RayTrainingJob(
                "train",
                {"project": "p", "location": ZONE, "pool": pool, "training": {}, **extra},
            )

        return program

    (plain,) = testing.run(build(False), project="p").of_type(RAY_JOB)
    assert all("nodeSelector" not in pod for pod in _head_and_submitter(plain))
    (placed,) = testing.run(build(True), project="p").of_type(RAY_JOB)
    selectors = [pod["nodeSelector"] for pod in _head_and_submitter(placed)]
    assert selectors == [{"park-gke/role": "system"}] * 2
    # ... the label the CPU pool's nodes carry (read from the node pool it created)
    result = testing.run(build(True), project="p")
    (node_pool,) = result.of_type(NODE_POOL)
    assert node_pool.inputs["nodeConfig"]["labels"]["park-gke/role"] == "system"


# ---- strict arguments --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("component", "args", "fragment"),
    [
        ("CpuPool", {**POOL, "machine_typ": "e2-standard-4"}, "did you mean 'machine_type'?"),
        (
            "TpuSlicePool",
            {**POOL, **SERVE_POOL, "capacty": "spot"},
            "args.capacty: unknown argument; did you mean 'capacity'?",
        ),
        (
            "LlmService",
            _service(pool={**SERVE_POOL, "capacty": "spot"}),
            "args.pool.capacty: unknown argument; did you mean 'capacity'?",
        ),
        (
            "LlmService",
            _service(models="Qwen/Qwen3-1.7B"),
            "args.models = 'Qwen/Qwen3-1.7B': expected a list",
        ),
        (
            "LlmService",
            _service(pool="serve"),
            "args.pool = 'serve': expected a mapping of TpuPoolRefArgs",
        ),
        (
            "LlmService",
            _service(location=pulumi.Output.from_input(ZONE)),
            "args.location: must be known when the program runs",
        ),
        ("Workspace", ["p"], "args must be a mapping of arguments, got list"),
    ],
)
def test_a_wrong_argument_is_refused_naming_component_and_argument(component, args, fragment):
    def build() -> None:
        getattr(park_gke, component)("it", args)

    with pytest.raises(ProgramError) as err:
        testing.run(build, project="p")
    assert f"{component} 'it'" in str(err.value) and fragment in str(err.value)
    assert isinstance(err.value.__cause__, pulumi.RunError)  # one error under `pulumi preview`


def test_a_pool_component_in_place_of_its_reference_is_taken_as_the_handle():
    def build() -> None:
        pool = park_gke.TpuSlicePool("serve", {**POOL, **SERVE_POOL})
        park_gke.LlmService("chat", _service(pool=pool))

    (service,) = testing.run(build, project="p").of_type(RAY_SERVICE)
    (group,) = service.inputs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert group["template"]["spec"]["nodeSelector"]["park-gke/pool"] == "serve"


def test_a_model_without_facts_is_a_warning_in_pulumis_log(monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: said.append(message))

    def build() -> None:
        models = [{"name": "mine", "source": "/data/models/mine", "tensor_parallel_size": 8}]
        park_gke.LlmService("chat", _service(models=models))

    testing.run(build, project="p")
    (warning,) = [m for m in said if "LlmService 'chat'" in m]
    assert "args.models[0].source" in warning and "park:" not in warning


def test_a_refusal_through_the_provider_is_an_input_properties_error():
    """Another language's program sees the refusal as the SDK's input error at the property's
    schema path, not a Python traceback. (A misspelt key never reaches the component there:
    the SDK maps inputs by the schema, and YAML and the typed SDKs check names against it.)"""
    from tests.infra.test_package import _wire

    host = provider.ParkComponentProvider(provider.components(), provider.NAME, None, "0.0.0")
    # a topology of the schema's enum that this machine type does not offer: the rules' refusal
    wire = _wire({**POOL, **SERVE_POOL, "topology": "4x4"})
    with pytest.raises(ProgramError) as err:
        testing.run(lambda: host.construct("it", "park-gke:index:TpuSlicePool", wire, None))
    cause = err.value.__cause__
    assert isinstance(cause, InputPropertiesError), type(cause)
    assert [e["property_path"] for e in cause.errors or []] == ["topology"]
    assert "TpuSlicePool 'it'" in cause.message and "allowed: 2x4" in cause.message
    assert isinstance(host, ComponentProvider)


def test_the_dashboard_exposes_the_endpoint_it_is_given():
    def build() -> None:
        chat = park_gke.LlmService("chat", _service())
        park_gke.DashboardAccess(
            "dashboard",
            {
                "project": "p",
                "domain": "ray.example.com",
                "iap_members": ["group:ml@example.com"],
                "oauth_client_id": "123-abc.apps.googleusercontent.com",
                "oauth_secret": "iap-oauth",
                "service": chat,  # type: ignore[typeddict-item]
            },
        )

    result = testing.run(build, project="p")
    (service,) = result.of_type("kubernetes:core/v1:Service")
    (ray,) = result.of_type(RAY_SERVICE)
    head_labels = ray.inputs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["metadata"]
    assert service.inputs["spec"]["selector"]["park-gke/workload"] == "chat"
    assert head_labels["labels"]["park-gke/workload"] == "chat"


def test_an_output_inside_the_training_settings_is_refused_not_planned_as_text():
    pool = {"name": "train", "machine_type": "ct6e-standard-4t", "topology": "4x4"}

    def build() -> None:
        model = pulumi.Output.from_input("Qwen/Qwen3-1.7B")
        park_gke.RayTrainingJob(
            "train",
            {"project": "p", "location": ZONE, "pool": pool, "training": {"model": model}},
        )

    with pytest.raises(ProgramError) as err:
        testing.run(build, project="p")
    assert "args.training.model: must be known when the program runs" in str(err.value)


def test_two_training_jobs_of_one_stack_would_share_a_run_folder_and_are_refused():
    pool = {"name": "train", "machine_type": "ct6e-standard-4t", "topology": "4x4"}

    def build() -> None:
        for name in ("first", "second"):
            park_gke.RayTrainingJob(
                name, {"project": "p", "location": ZONE, "pool": pool, "training": {}}
            )

    with pytest.raises(ProgramError) as err:
        testing.run(build, project="p")
    assert "RayTrainingJob 'second'" in str(err.value) and "training run folder" in str(err.value)
