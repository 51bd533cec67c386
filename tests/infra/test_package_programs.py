"""A new user's programs against park-gke, as printed: docs/components.md's Python (the program,
and the park_gke.testing snippet that runs it) and whole programs on an existing and on a new
cluster, each run under the mock engine and its manifests checked against the CRD schemas."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

import park_gke
from park_gke import testing
from park_gke.testing import ProgramError
from tests.infra.test_package_compose import (
    NODE_POOL,
    RAY_SERVICE,
    SA,
    ZONE,
    _head_and_submitter,
    _new_cluster,
    _service,
    _storage,
)

RAY_JOB = "kubernetes:ray.io/v1:RayJob"


# ---- the docs' Python runs as printed --------------------------------------------------------


def _readme_python() -> list[str]:
    from tests.conftest import ROOT

    section = (ROOT / "docs" / "components.md").read_text()
    return [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]


def test_the_readmes_python_runs_as_printed(tmp_path, monkeypatch):
    """The program snippet is a whole program (its imports, its bucket and registry), and the
    testing snippet runs it as printed, its own assertions included."""
    program, test = _readme_python()
    (tmp_path / "__main__.py").write_text(program)
    monkeypatch.chdir(tmp_path)
    scope: dict[str, Any] = {}
    exec(compile(test, "docs/components.md", "exec"), scope)
    result = scope["result"]
    # The pods' bucket and the KSA are what Storage and Workspace create in this program.
    (bucket,) = result.of_type("gcp:storage/bucket:Bucket")
    (ksa,) = result.of_type("kubernetes:core/v1:ServiceAccount")
    (service,) = result.of_type(RAY_SERVICE)
    head = service.inputs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == ksa.inputs["metadata"]["name"]
    mounted = {v["name"]: v for v in head["volumes"]}["gcs"]["csi"]["volumeAttributes"]
    assert mounted["bucketName"] == bucket.inputs["name"]
    (registry,) = result.of_type("gcp:artifactregistry/repository:Repository")
    image = head["containers"][0]["image"]
    assert f"/my-project/{registry.inputs['repositoryId']}/" in image
    assert "nodeSelector" not in head  # an existing cluster: no park CPU pool to select


def test_the_readme_snippet_check_can_fail(tmp_path, monkeypatch):
    """A snippet that uses a name it never imports fails here, as it would for a reader."""
    program, test = _readme_python()
    (tmp_path / "__main__.py").write_text(program.replace("import pulumi\n", "", 1))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProgramError) as err:
        exec(compile(test, "docs/components.md", "exec"), {})
    assert "name 'pulumi' is not defined" in str(err.value)


# ---- a new user's programs ---------------------------------------------------------------------


def _slice_bucket_and_workspace(
    cluster: park_gke.Cluster | park_gke.ExistingCluster,
    name: str,
    machine_type: str,
    topology: str,
) -> tuple[park_gke.TpuSlicePool, park_gke.Storage, park_gke.Workspace]:
    """A TPU slice pool `name` of `cluster`, the stack's bucket (its nodes may read it) and
    namespace, as every program that runs a workload declares them."""
    args = {"cluster": cluster, "machine_type": machine_type, "topology": topology}
    pool = park_gke.TpuSlicePool(name, args)  # type: ignore[arg-type]
    space = park_gke.Workspace("space", {"project": "p", "kubeconfig": cluster.kubeconfig})
    return pool, _storage(cluster, "p"), space


def test_an_existing_cluster_with_a_multi_host_training_job_composes():
    from infra.tools.schemas import validate_manifests

    def build() -> None:
        cluster = park_gke.ExistingCluster(
            "team", {"project": "p", "location": ZONE, "name": "team-gke"}
        )
        pool, storage, space = _slice_bucket_and_workspace(
            cluster, "train-pool", "ct6e-standard-4t", "4x4"
        )
        park_gke.RayTrainingJob(
            "train",
            {
                "project": "p",
                "location": ZONE,
                "pool": pool,
                "namespace": space,
                "bucket": storage,
                "kubeconfig": cluster.kubeconfig,
                "training": {"strategy": "fsdp2", "steps": 20, "global_batch_size": 64},
            },
            pulumi.ResourceOptions(depends_on=[*space.ready, *pool.node_pools]),
        )

    lookup = testing.existing_cluster("team-gke", project="p", node_service_account=SA)
    result = testing.run(build, project="p", clusters=[lookup])
    (job,) = result.of_type(RAY_JOB)
    (group,) = job.inputs["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert group["numOfHosts"] == 4  # a 4x4 slice of 4-chip hosts
    assert all("nodeSelector" not in pod for pod in _head_and_submitter(job))
    assert not validate_manifests(result.manifests(), "1.35.0")


def test_a_new_cluster_serving_an_open_model_composes():
    from infra.tools.schemas import validate_manifests

    def build() -> None:
        office = [{"cidr": "203.0.113.0/24", "name": "office"}]
        cluster = _new_cluster("p", deletion_protection=False, master_authorized_networks=office)
        cpu = park_gke.CpuPool("system", {"cluster": cluster})
        pool, storage, space = _slice_bucket_and_workspace(
            cluster, "serve", "ct6e-standard-8t", "2x4"
        )
        park_gke.LlmService(
            "chat",
            _service(
                pool=pool,
                namespace=space,
                bucket=storage,
                head_node_selector=cpu,
                kubeconfig=cluster.kubeconfig,
            ),
            pulumi.ResourceOptions(depends_on=[*space.ready, *pool.node_pools, cpu.node_pool]),
        )

    result = testing.run(build, project="p", stack="prod")
    (service,) = result.of_type(RAY_SERVICE)
    spec = service.inputs["spec"]["rayClusterConfig"]
    assert spec["headGroupSpec"]["template"]["spec"]["nodeSelector"] == {"park-gke/role": "system"}
    pools = {r.inputs["name"]: r.inputs for r in result.of_type(NODE_POOL)}
    assert set(pools) == {"system", "serve-s0"}
    cluster_id = f"projects/p/locations/{ZONE}/clusters/park-prod"  # park-<stack>
    assert all(p["cluster"] == cluster_id for p in pools.values())
    assert not validate_manifests(result.manifests(), "1.35.0")
