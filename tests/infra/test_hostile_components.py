"""A stranger's own Pulumi program (issue 30, items 7 and 8): every name a component creates
or is given is checked at preview by the rule Kubernetes (or KubeRay, or GKE) holds it to, a
hand-written pool reference is checked against the pools the program declares (or the
existing cluster's, when its lookup answers), refusals name the component's own argument and
never a stack-file key, and the schema requires what every language must give."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import hypothesis  # noqa: F401 (imported before a preview fails deep in Pulumi: see below)
import pytest

import park_gke as pg
from park_gke import testing
from tests.conftest import ROOT

POOL = {"name": "train", "machine_type": "ct6e-standard-8t", "topology": "2x4"}
SA = "n@p.iam.gserviceaccount.com"
ON_CLUSTER = {"cluster": "c", "location": "us-east5-b", "node_service_account": SA}
MODEL = {"name": "m", "source": "Qwen/Qwen2.5-1.5B-Instruct", "tensor_parallel_size": 4}


def refusal(build: Callable[[], Any]) -> str:
    """The preview error of a program, which must fail."""
    with pytest.raises(Exception) as info:
        testing.run(build)
    return str(info.value)


def _job(**more: Any) -> Callable[[], Any]:
    args = {"project": "my-project", "location": "us-east5-b", "pool": POOL, "training": {}}
    return lambda: pg.RayTrainingJob("job", {**args, **more})


def _llm(name: str = "llm", **more: Any) -> Callable[[], Any]:
    args = {"project": "my-project", "location": "us-east5-b", "pool": POOL, "models": [MODEL]}
    return lambda: pg.LlmService(name, {**args, **more})


# ---- 7. names Kubernetes would refuse -----------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "argument"),
    [
        (lambda: pg.Workspace("ws", {"project": "my-project", "namespace": "ML_Team"}),
         "args.namespace = 'ML_Team'"),
        (lambda: pg.Workspace("ws", {"project": "my-project", "namespace": "kube-system"}),
         "args.namespace = 'kube-system'"),
        (_job(namespace="ML_Team"), "args.namespace = 'ML_Team'"),
        (_llm(endpoint_service="Open_AI"), "args.endpoint_service = 'Open_AI'"),
        (_llm(endpoint_service="9openai"), "args.endpoint_service = '9openai'"),
        (_llm("a" * 48), "the name 'aaaa"),  # KubeRay: a RayService name of at most 47
        (_job(head_node_selector={"bad key!": "x"}), "args.head_node_selector"),
        (_job(head_node_selector={"pool": "a b"}), "args.head_node_selector"),
        (lambda: pg.RayMetrics("m", {"project": "p", "cluster_name": "c", "namespace": "A"}),
         "args.namespace = 'A'"),
        (lambda: pg.RayMetrics("m", {"project": "p", "cluster_name": "Team_GKE"}),
         "args.cluster_name = 'Team_GKE'"),
        (lambda: pg.DashboardAccess("d", {
            "project": "p", "domain": "ray.example.com", "iap_members": ["group:a@example.com"],
            "oauth_client_id": "1-a.apps.googleusercontent.com", "oauth_secret": "Oauth_Secret",
        }), "args.oauth_secret = 'Oauth_Secret'"),
        (lambda: pg.DashboardAccess("d", {
            "project": "p", "domain": "ray.example.com", "iap_members": ["group:a@example.com"],
            "oauth_client_id": "1-a.apps.googleusercontent.com", "oauth_secret": "s",
            "service": "My Service",
        }), "args.service = 'My Service'"),
        (lambda: pg.CpuPool("Cpu_Pool", ON_CLUSTER), "args.name = 'Cpu_Pool'"),
        (lambda: pg.TpuSlicePool("t", {**ON_CLUSTER, **POOL, "name": "Train"}),
         "args.name = 'Train'"),
    ],
)  # fmt: skip
def test_a_name_kubernetes_or_gke_would_refuse_is_refused_at_preview(build, argument):
    message = refusal(build)
    assert argument in message
    assert "park:" not in message  # never a stack-file key


def test_every_object_a_component_creates_is_checked_by_its_kind():
    """The last word behind the arguments: an object whose name Kubernetes refuses is refused
    even when no argument check names it (a Service name from the component's name)."""
    from infra.rules.grammar import object_problems

    service = {"kind": "Service", "metadata": {"name": "9x", "namespace": "park"}}
    job = {"kind": "RayJob", "metadata": {"name": "a" * 48, "namespace": "p"}}
    secret = {"kind": "Secret", "metadata": {"name": "a.b-c", "namespace": "Park"}}
    assert object_problems(service) and object_problems(job)
    assert [p for p in object_problems(secret) if "namespace" in p]
    assert not object_problems({"kind": "Secret", "metadata": {"name": "a.b", "namespace": "p"}})


# ---- 8. refusals name the component's argument, never a stack key --------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: pg.Storage("st", {"project": "my-project", "region": "us-east5",
                                  "node_service_account": "n@p.iam.gserviceaccount.com",
                                  "stack": "My_Stack"}),
        lambda: pg.Network("n", {"project": "my-project", "region": "us-east5", "stack": "X_Y"}),
        lambda: pg.Workspace("ws", {"project": "my-project", "stack": "a" * 60}),
        _job(stack="Bad_Stack"),
        lambda: pg.Cluster("c", {"project": "my-project", "location": "us-east5-b",
                                 "network": "n", "subnetwork": "s", "stack": "x" * 60}),
    ],
)  # fmt: skip
def test_a_name_derived_from_the_stack_is_said_under_args_stack(build):
    message = refusal(build)
    assert "args.stack" in message
    assert not re.search(r"(park|gcp):[a-zA-Z]", message), message


# ---- 8. pool references ------------------------------------------------------------------------


def test_a_typo_in_a_hand_written_pool_reference_is_refused():
    def program(ref: dict[str, Any]) -> Callable[[], Any]:
        def build() -> None:
            pg.TpuSlicePool("tp", {**ON_CLUSTER, **POOL})
            pg.RayTrainingJob(
                "job",
                {"project": "p", "location": "us-east5-b", "pool": ref, "training": {}},
            )

        return build

    assert "args.pool.name = 'trian'" in refusal(program({**POOL, "name": "trian"}))
    assert "args.pool.topology = '4x4'" in refusal(
        program({**POOL, "machine_type": "ct6e-standard-4t", "topology": "4x4"})
    )
    assert "args.pool.slices = 2" in refusal(program({**POOL, "slices": 2}))
    testing.run(program(dict(POOL)))  # the same reference, written by hand: fine


def _existing(labels: dict[str, str], machine: str = "ct6e-standard-8t") -> dict[str, Any]:
    return testing.existing_cluster(
        "team-gke",
        project="p",
        nodePools=[{"name": "tpu", "nodeConfigs": [{"labels": labels, "machineType": machine}]}],
    )


def test_an_existing_clusters_pool_is_checked_when_its_lookup_answers():
    """(A preview that fails inside an ExistingCluster's lookup leaves Python 3.11's AST
    recursion counter off, as the existing-cluster refusals of test_package.py do; imported
    first, hypothesis's plugin does not parse a module after it.)"""

    def build() -> None:
        cluster = pg.ExistingCluster(
            "cluster", {"project": "p", "location": "us-east5-b", "name": "team-gke"}
        )
        pg.LlmService(
            "llm",
            {"project": "p", "location": "us-east5-b", "pool": POOL, "models": [MODEL]},
            pulumi_options(cluster),
        )

    testing.run(build, project="p", clusters=[_existing({"park-gke/pool": "train"})])
    with pytest.raises(Exception) as info:
        testing.run(build, project="p", clusters=[_existing({"park-gke/pool": "serve"})])
    assert "args.pool.name = 'train'" in str(info.value)
    assert "park-gke/pool=train" in str(info.value)


def pulumi_options(cluster: Any) -> Any:
    import pulumi

    provider = pg.kubernetes_provider("k8s", cluster.kubeconfig, depends_on=[])
    return pulumi.ResourceOptions(providers={"kubernetes": provider})


# ---- 8. the schema per language -----------------------------------------------------------------


def test_inputs_every_language_must_give_are_required_in_the_schema():
    schema = json.loads((ROOT / "provider" / "schema.json").read_text())
    for pool in ("CpuPool", "TpuSlicePool", "GpuPool"):
        required = schema["resources"][f"park-gke:index:{pool}"]["requiredInputs"]
        assert {"cluster", "location", "nodeServiceAccount"} <= set(required), pool
        described = schema["resources"][f"park-gke:index:{pool}"]["inputProperties"]
        assert "in Python only" in described["location"]["description"]
    # Python may still leave them out by passing the cluster object (its documented form)
    refused = refusal(lambda: pg.TpuSlicePool("tp", {"cluster": "c", **POOL}))
    assert "args.location: required" in refused and "args.node_service_account" in refused
