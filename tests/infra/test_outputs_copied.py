"""Values only copied into a manifest take Outputs (issue 30 item 6): an image built in the same
program, a training run's export as a served model's source. Values the plan computes with
must still be known at preview."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

import park_gke
from park_gke import testing
from park_gke.testing import ProgramError
from tests.infra.nested import mappings

ZONE = "us-east5-b"
TRAIN_POOL = {"name": "train", "machine_type": "ct6e-standard-8t", "topology": "2x4"}
SERVE_POOL = {"name": "serve", "machine_type": "ct6e-standard-8t", "topology": "2x4"}
REPOSITORY = "us-east5-docker.pkg.dev/p/team/park-workloads"
JOB = "kubernetes:batch/v1:Job"


def _images(inputs: Any) -> set[str]:
    return {
        value
        for node in mappings(inputs)
        for key, value in node.items()
        if key == "image" and isinstance(value, str)
    }


def _program(source: Any = None) -> None:
    image = park_gke.WorkloadImage("img", {"repository": REPOSITORY, "tag": "v1"})
    job = park_gke.RayTrainingJob(
        "tune",
        {
            "project": "p",
            "location": ZONE,
            "pool": TRAIN_POOL,
            "image": image.ref,
            "training": {"model": "park:tiny-llama", "steps": 10, "global_batch_size": 8},
        },
    )
    park_gke.LlmService(
        "chat",
        {
            "project": "p",
            "location": ZONE,
            "pool": SERVE_POOL,
            "image": image.ref,
            "models": [
                {
                    "name": "tuned",
                    "source": job.export_path if source is None else source,
                    "base_model": "Qwen/Qwen3-1.7B",
                    "tensor_parallel_size": 8,
                }
            ],
        },
    )


def test_an_image_built_in_the_program_is_what_the_pods_run():
    result = testing.run(_program, project="p")
    (build,) = result.of_type("docker-build:index:Image")
    assert build.inputs["tags"] == [f"{REPOSITORY}:v1"]
    for kind in ("kubernetes:ray.io/v1:RayJob", "kubernetes:ray.io/v1:RayService"):
        (workload,) = result.of_type(kind)
        (image,) = _images(workload.inputs)
        assert image.startswith(f"{REPOSITORY}:v1@sha256:")  # the pushed digest


def test_a_training_runs_export_path_is_a_served_models_source():
    result = testing.run(_program, project="p")
    (service,) = result.of_type("kubernetes:ray.io/v1:RayService")
    config = yaml.safe_load(service.inputs["spec"]["serveConfigV2"])
    (llm,) = config["applications"][0]["args"]["llm_configs"]
    # gs://<project>-<stack>-park/checkpoints/<run>/export/final, read through the mount
    source = llm["model_loading_config"]["model_source"]
    assert source.startswith("/data/checkpoints/") and source.endswith("/export/final")
    assert llm["engine_kwargs"]["tensor_parallel_size"] == 8


def test_an_output_source_that_is_a_hub_id_is_read_from_its_staged_copy():
    import pulumi

    result = testing.run(lambda: _program(pulumi.Output.from_input("Qwen/Qwen3-1.7B")), project="p")
    (service,) = result.of_type("kubernetes:ray.io/v1:RayService")
    config = yaml.safe_load(service.inputs["spec"]["serveConfigV2"])
    (llm,) = config["applications"][0]["args"]["llm_configs"]
    assert llm["model_loading_config"]["model_source"] == "/data/models/Qwen/Qwen3-1.7B"


def test_staging_takes_hub_ids_and_an_image_output():
    def build() -> None:
        image = park_gke.WorkloadImage("img", {"repository": REPOSITORY, "tag": "v1"})
        park_gke.ModelStaging(
            "models",
            {"project": "p", "models": ["Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B"], "image": image.ref},
        )

    result = testing.run(build, project="p")
    jobs = result.of_type(JOB)
    from infra.plan.staging import job_name

    assert sorted(j.inputs["metadata"]["name"] for j in jobs) == sorted(
        job_name(repo) for repo in ("Qwen/Qwen3-1.7B", "Qwen/Qwen3-8B")
    )
    for job in jobs:
        (image,) = _images(job.inputs)
        assert image.startswith(f"{REPOSITORY}:v1@sha256:")
        command = job.inputs["spec"]["template"]["spec"]["containers"][0]["command"]
        assert command[-1].startswith("gs://p-test-park/models/Qwen/")
        assert "nodeSelector" not in job.inputs["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("component", "args", "fragment"),
    [
        ("ProjectApis", {"project": "p", "services": ["container"]}, "args.services"),
        (
            "ModelStaging",
            {"project": "p", "models": ["/data/models/mine"], "image": "x"},
            "args.models",
        ),
        (
            "WorkloadImage",
            {"repository": "docker.io/me/park", "tag": "v1"},
            "args.repository",
        ),
    ],
)
def test_the_first_deploy_components_refuse_by_argument(component, args, fragment):
    with pytest.raises(ProgramError, match=fragment):
        testing.run(lambda: getattr(park_gke, component)("x", args), project="p")
