"""Day one, in order: on a new project every pod-creating resource waits for the APIs it needs,
the image it runs, the staging of every model it reads and its pools' nodes.

The order is read from what the program registers under Pulumi's mocks: each resource's
dependencies (explicit and from its inputs) and its provider, as the engine orders creation.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from infra import images
from infra.names import POOL_LABEL, ROLE_LABEL
from infra.plan import project
from infra.plan.staging import job_name
from infra.schema.read import read_stack_file
from infra.tools.render import Rendered, Resource, run_program
from tests.conftest import ROOT, STACKS_DIR
from tests.infra.nested import mappings

RAYJOB = "kubernetes:ray.io/v1:RayJob"
RAYSERVICE = "kubernetes:ray.io/v1:RayService"
JOB = "kubernetes:batch/v1:Job"
POD_MAKERS = (RAYJOB, RAYSERVICE, JOB)
SERVICE = "gcp:projects/service:Service"
IMAGE = "docker-build:index:Image"
NODE_POOL = "gcp:container/nodePool:NodePool"
# What any pod of the stack needs switched on before it exists: its node (compute, container),
# its image (artifactregistry), its Workload Identity (iam, iamcredentials), its bucket mount
# (storage).
POD_APIS = (
    "compute.googleapis.com",
    "container.googleapis.com",
    "artifactregistry.googleapis.com",
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",
    "storage.googleapis.com",
)


def _closure(rendered: Rendered, start: Resource) -> set[tuple[str, str]]:
    """Every (type, name) `start` waits for, directly or through what it waits for."""
    by_key = {(r.type, r.name): r for r in rendered.resources}
    seen: set[tuple[str, str]] = set()
    todo = list(start.waits)
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        found = by_key.get(key)
        if found is not None:
            todo += found.waits
    return seen


def _containers(inputs: Any) -> Iterator[dict[str, Any]]:
    if isinstance(inputs, dict):
        for key, value in inputs.items():
            if key == "containers" and isinstance(value, list):
                yield from value
            else:
                yield from _containers(value)
    elif isinstance(inputs, list):
        for value in inputs:
            yield from _containers(value)


def _selected_pools(inputs: Any) -> set[str]:
    """The node pools a workload's pods select: by park's pool label, or the CPU pool's role."""
    found: set[str] = set()
    for node in mappings(inputs):
        selector = node.get("nodeSelector")
        if isinstance(selector, dict):
            if POOL_LABEL in selector:
                found.add(selector[POOL_LABEL])
            elif selector.get(ROLE_LABEL) == "system":
                found.add("cpu")
    return found


def _reads(rendered: Rendered, workload: Resource) -> str | None:
    """The stack key prefix whose staged models a workload reads."""
    if workload.type == RAYSERVICE:
        return "park:serving."
    if workload.type == RAYJOB:
        return "park:rl." if workload.parent == "park-rl" else "park:training."
    return None


def order_problems(rendered: Rendered) -> list[str]:
    """What a pod-creating resource would be created before, on a first `pulumi up`."""
    plan = rendered.plan
    services = {(SERVICE, r.name): r.inputs["service"] for r in rendered.of_type(SERVICE)}
    builds = {r.inputs["tags"][0].split(":src-")[0]: r for r in rendered.of_type(IMAGE)}
    pool_nodes = {}
    for pool in rendered.of_type(NODE_POOL):
        labels = pool.inputs["nodeConfig"].get("labels", {})
        name = labels.get(POOL_LABEL) or ("cpu" if labels.get(ROLE_LABEL) == "system" else "")
        pool_nodes.setdefault(name, []).append((NODE_POOL, pool.name))
    stage_jobs = {job.inputs["metadata"]["name"]: (JOB, job.name) for job in rendered.of_type(JOB)}
    problems = []
    for workload in (r for r in rendered.resources if r.type in POD_MAKERS):
        waits = _closure(rendered, workload)
        what = f"{workload.type} {workload.name}"
        enabled = {services[k] for k in waits if k in services}
        problems += [f"{what}: before API {a}" for a in POD_APIS if a not in enabled]
        for container in _containers(workload.inputs):
            repository = str(container.get("image", "")).split(":src-")[0]
            build = builds.get(repository)
            if build is not None and (IMAGE, build.name) not in waits:
                problems.append(f"{what}: before its image {repository} is built")
        for pool in _selected_pools(workload.inputs):
            missing = [n for n in pool_nodes.get(pool, []) if n not in waits]
            if not pool_nodes.get(pool) or missing:
                problems.append(f"{what}: before pool {pool}'s nodes {missing}")
        prefix = _reads(rendered, workload)
        for model in plan.disk.staged if plan.disk and prefix else ():
            reads = any(key.startswith(prefix or "-") for key in model.used_by)
            if reads and stage_jobs.get(job_name(model.repo)) not in waits:
                problems.append(f"{what}: before {model.repo} is staged")
    return problems


def test_every_pod_waits_for_apis_image_staging_and_pools(rendered):
    assert rendered.of_type(SERVICE), "no project API is enabled"
    assert order_problems(rendered) == []


def test_the_order_check_sees_a_workload_that_would_start_before_its_staging(monkeypatch):
    """The check can fail: without the staging dependency, the trainer would start first."""
    from infra.components import staging as staging_component

    monkeypatch.setattr(staging_component.ModelStaging, "jobs_for", lambda self, repos: [])
    values, secrets = read_stack_file(STACKS_DIR / "Pulumi.dev.yaml")
    problems = order_problems(run_program(values, "dev", secrets))
    assert any("Qwen/Qwen3-1.7B is staged" in p for p in problems), problems


def test_every_declared_google_resource_has_its_api_enabled(rendered):
    enabled = {api.service for api in project.apis(rendered.plan)}
    for resource in rendered.resources:
        api = project.api_of_type(resource.type)
        if resource.type.startswith("gcp:") and api is None:
            pytest.fail(f"{resource.type}: which API serves it? (infra/plan/project.py)")
        if api is not None and api != "serviceusage.googleapis.com":
            assert api in enabled, f"{resource.type} {resource.name} needs {api}"
    declared = {r.inputs["service"] for r in rendered.of_type(SERVICE)}
    assert declared == enabled
    for service in rendered.of_type(SERVICE):
        assert service.inputs["disableOnDestroy"] is False  # other stacks may use it


def test_the_dashboard_stack_enables_iap_and_no_other_does(rendered):
    declared = {r.inputs["service"] for r in rendered.of_type(SERVICE)}
    assert ("iap.googleapis.com" in declared) == rendered.config.observability.expose_dashboard


def test_images_are_built_from_this_checkout_and_tagged_by_its_content(rendered):
    plan = rendered.plan
    (build,) = rendered.of_type(IMAGE)
    tag = images.context_tag(ROOT)
    assert build.inputs["tags"] == [f"{plan.names.registry_url}/park-workloads:{tag}"]
    assert build.inputs["push"] is True and build.inputs["buildOnPreview"] is False
    assert build.inputs["context"]["location"] == "."  # the repository root, `up`'s directory
    for container in _containers([m for m in rendered.manifests()]):
        image = container["image"]
        if image.startswith(plan.names.registry_url):
            # the pushed digest of this very build (the program's Output), never a bare tag
            assert image.startswith(f"{build.inputs['tags'][0]}@sha256:"), image


def test_the_image_tag_follows_the_context_and_nothing_else(tmp_path):
    """A change under workloads/ is a new tag; a file outside the context or a __pycache__ is
    not (what .dockerignore keeps out of the build)."""
    root = tmp_path / "repo"
    (root / "workloads" / "train").mkdir(parents=True)
    (root / "pyproject.toml").write_text("[project]\nname='x'\n")
    (root / "workloads" / "Dockerfile").write_text("FROM scratch\n")
    (root / "workloads" / "train" / "loop.py").write_text("print(1)\n")
    before = images.context_tag(root)
    (root / "README.md").write_text("docs\n")
    (root / "workloads" / "__pycache__").mkdir()
    (root / "workloads" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    images.context_tag.cache_clear()
    assert images.context_tag(root) == before
    (root / "workloads" / "train" / "loop.py").write_text("print(2)\n")
    images.context_tag.cache_clear()
    assert images.context_tag(root) != before


def test_dockerignore_sends_exactly_the_context_the_tag_digests():
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = sorted(line[1:] for line in lines if line.startswith("!"))
    assert allowed == sorted(images.IMAGE_CONTEXT)
    dockerfile = (ROOT / images.DOCKERFILE).read_text()
    for copied in ("pyproject.toml", "workloads"):
        assert f"COPY --chown=ray:users {copied}" in dockerfile


def test_a_pinned_image_builds_nothing():
    values, secrets = read_stack_file(STACKS_DIR / "Pulumi.dev.yaml")
    values = copy.deepcopy(values)
    pinned = "us-docker.pkg.dev/team/images/park-workloads@sha256:" + "a" * 64
    values["park:training"]["image"] = pinned
    values["park:serving"]["image"] = pinned
    rendered = run_program(values, "dev", secrets)
    assert rendered.of_type(IMAGE) == []
    assert {c["image"] for c in _containers(rendered.manifests())} == {pinned}


def test_stage_jobs_are_awaited_within_a_bound_from_the_model_and_heal():
    from infra.plan.staging import stage_jobs
    from infra.resolve.disk import STAGE_FLOOR_BYTES_PER_S, STAGE_START_S

    values, secrets = read_stack_file(STACKS_DIR / "Pulumi.prod.yaml")
    rendered = run_program(values, "prod", secrets)
    jobs = {j.model.repo: j for j in stage_jobs(rendered.plan)}
    assert set(jobs) == {"Qwen/Qwen3-8B", "Qwen/Qwen3-30B-A3B-Instruct-2507"}
    big = jobs["Qwen/Qwen3-30B-A3B-Instruct-2507"]
    assert big.model.weights_bytes and big.model.weights_bytes > 50 * 10**9
    floor = STAGE_START_S + big.model.weights_bytes / STAGE_FLOOR_BYTES_PER_S
    assert floor <= big.timeout_s < floor + 60  # whole minutes
    # One bound: what the trainer waits for its staged model is what `up` waits for its Job.
    (rayjob,) = [r for r in rendered.of_type("kubernetes:ray.io/v1:RayJob")]
    entrypoint = rayjob.inputs["spec"]["entrypoint"].split()
    wait_s = int(entrypoint[entrypoint.index("--model-wait-s") + 1])
    assert wait_s == jobs["Qwen/Qwen3-8B"].timeout_s
    for job in rendered.of_type(JOB):
        assert job.inputs["metadata"]["annotations"]["pulumi.com/replaceUnready"] == "true"
        assert "ttlSecondsAfterFinished" not in job.inputs["spec"]


def _training_job(run_id: str | None) -> Resource:
    values, secrets = read_stack_file(STACKS_DIR / "Pulumi.dev.yaml")
    values = copy.deepcopy(values)
    if run_id is not None:
        values["park:training"]["runId"] = run_id
    (job,) = run_program(values, "dev", secrets).of_type(RAYJOB)
    return job


def test_a_new_run_id_is_a_new_rayjob_and_the_same_one_changes_nothing():
    """pulumi-kubernetes replaces an object whose metadata.name changes (a new RayJob that
    KubeRay runs) and leaves one whose inputs are unchanged alone (a failed or finished run
    stays as it is)."""
    first, again = _training_job(None), _training_job(None)
    assert first.inputs == again.inputs and first.name == again.name
    second = _training_job("r2")
    assert second.name == first.name  # the same resource, so the old RayJob is replaced
    assert first.inputs["metadata"]["name"] == "park-train"
    assert second.inputs["metadata"]["name"] == "park-train-r2"
    entry = second.inputs["spec"]["entrypoint"]
    assert "--run-name dev-park-train-r2" in entry  # a new run folder: a new run
    labels = second.inputs["metadata"]["labels"]
    assert labels["app.kubernetes.io/name"] == "park-train"  # metrics still follow it


def test_the_dashboard_oauth_secret_is_created_after_its_namespace():
    values, secrets = read_stack_file(STACKS_DIR / "Pulumi.queued.yaml")
    values = dict(values, **{"park:iapOauthClientSecret": "GOCSPX-not-a-real-one"})
    rendered = run_program(values, "queued", [*secrets, "park:iapOauthClientSecret"])
    (secret,) = [
        r
        for r in rendered.of_type("kubernetes:core/v1:Secret")
        if r.inputs["metadata"]["name"] == "ray-dashboard-oauth"
    ]
    assert secret.inputs["stringData"] == {"key": "[secret]"}
    assert ("kubernetes:core/v1:Namespace", "workspace-namespace") in _closure(rendered, secret)
    assert "not-a-real-one" not in repr([r.inputs for r in rendered.resources])


def test_every_declared_resource_type_has_a_deploy_role(rendered):
    from infra.tools.roles import deploy_roles

    roles = deploy_roles(r.type for r in rendered.resources)  # raises for a type without one
    assert "roles/serviceusage.serviceUsageAdmin" in roles  # it enables the APIs itself
    if rendered.of_type(IMAGE):
        assert "roles/artifactregistry.writer" in roles


def test_a_resource_type_without_a_role_is_refused():
    from infra.tools.roles import UnknownType, roles_of_type

    with pytest.raises(UnknownType, match="gcp:bigquery/dataset:Dataset"):
        roles_of_type("gcp:bigquery/dataset:Dataset")


@pytest.mark.parametrize(
    ("workflow", "job"), [("deploy.yml", "up"), ("pull-request.yml", "preview")]
)
def test_ci_previews_and_deploys_every_shipped_stack(workflow, job):
    import yaml

    from tests.conftest import SHIPPED_STACKS

    document = yaml.safe_load((ROOT / ".github" / "workflows" / workflow).read_text())
    stacks = document["jobs"][job]["strategy"]["matrix"]["stack"]
    assert sorted(stacks) == SHIPPED_STACKS
    if workflow == "deploy.yml":
        assert stacks[-1] == "prod"  # the others first
        steps = [s.get("uses", "") for s in document["jobs"][job]["steps"]]
        buildx = next(i for i, u in enumerate(steps) if u.startswith("docker/setup-buildx"))
        assert buildx < next(i for i, u in enumerate(steps) if u.startswith("pulumi/actions"))
