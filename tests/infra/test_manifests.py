"""KubeRay manifests: valid against KubeRay 1.7.0's CRDs with no unknown field, and TPU-correct."""

from __future__ import annotations

import copy

import pytest
import yaml

from infra import catalog
from infra.plan import ray as ray_plan
from infra.tools.schemas import (
    KUBERNETES_VERSION,
    crd_schemas,
    validate_manifest,
    validate_manifests,
)
from workloads.serve.validate import LLM_BUILDERS


def _clusters(manifest):
    spec = manifest["spec"]
    return spec.get("rayClusterSpec") or spec["rayClusterConfig"]


def test_every_emitted_manifest_is_schema_valid(rendered):
    manifests = rendered.manifests()
    kinds = {m["kind"] for m in manifests}
    assert {"Namespace", "ServiceAccount", "NetworkPolicy"} <= kinds
    assert validate_manifests(manifests) == []


def test_kubernetes_version_follows_the_gke_floor():
    assert KUBERNETES_VERSION == "1.31.0"  # without a stack: the v6e floor's minor


def test_schemas_follow_the_stacks_cluster_version(rendered):
    version = rendered.plan.cluster_version
    assert rendered.plan.kubernetes_version == f"{version.major}.{version.minor}.0"
    assert validate_manifests(rendered.manifests(), rendered.plan.kubernetes_version) == []


def test_unknown_field_is_caught_as_the_api_server_would_prune_it(rendered):
    (job,) = [m for m in rendered.manifests() if m["kind"] in ("RayJob", "RayService")][:1]
    broken = copy.deepcopy(job)
    _clusters(broken)["workerGroupSpecs"][0]["numberOfHosts"] = 4
    problems = validate_manifest(broken)
    assert any("numberOfHosts" in p.message for p in problems)
    assert any("workerGroupSpecs[0]" in p.path for p in problems)


def test_non_string_ray_start_param_is_caught(rendered):
    job = next(m for m in rendered.manifests() if m["kind"] in ("RayJob", "RayService"))
    broken = copy.deepcopy(job)
    _clusters(broken)["headGroupSpec"]["rayStartParams"]["num-cpus"] = 0
    assert any("rayStartParams" in p.path for p in validate_manifest(broken))


def test_core_objects_are_checked_strictly(rendered):
    policy = copy.deepcopy(next(m for m in rendered.manifests() if m["kind"] == "NetworkPolicy"))
    policy["spec"]["podSelectr"] = {}
    assert validate_manifest(policy)


def _core_verdict_of_kubernetes_validate(manifest, version: str) -> tuple[str, str] | None:
    """kubernetes-validate's own verdict (its validate(), strict), as (path, message)."""
    import kubernetes_validate

    try:
        kubernetes_validate.validate(manifest, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        return ".".join(str(p) for p in err.path), err.message
    except kubernetes_validate.SchemaNotFoundError:
        return "", "no schema"
    return None


def _broken_variants(manifest):
    """The manifest as it is, with an unknown field, with a wrong type, of an unknown kind."""
    yield manifest
    yield {**manifest, "spek": {}}
    yield {**manifest, "metadata": {**manifest["metadata"], "labels": {"a": 1}}}
    yield {**manifest, "kind": f"{manifest['kind']}Typo"}


@pytest.mark.parametrize("version", [KUBERNETES_VERSION, "1.33.0"])
def test_core_checks_give_kubernetes_validates_own_verdicts(version):
    """Our cached core validators (infra.tools.schemas._core_validator) against the library's
    own validate(), on each core kind of the shipped stacks' goldens, sound and broken."""
    from tests.conftest import SHIPPED_STACKS
    from tests.infra.goldens import golden_manifests

    by_kind = {
        (manifest["apiVersion"], manifest["kind"]): manifest  # one of each (the library is slow)
        for stack in SHIPPED_STACKS
        for manifest in golden_manifests(stack).values()
    }
    core = [manifest for key, manifest in sorted(by_kind.items()) if key not in crd_schemas()]
    broken = 0
    for variant in (v for manifest in core for v in _broken_variants(manifest)):
        ours = validate_manifest(variant, version)
        theirs = _core_verdict_of_kubernetes_validate(variant, version)
        assert bool(ours) == (theirs is not None), (variant["kind"], ours, theirs)
        if theirs is None:
            continue
        (problem,) = ours
        assert problem.path.replace("[", ".").replace("]", "") == theirs[0]
        if theirs[1] == "no schema":
            assert problem.message.startswith("no schema for"), problem
        else:
            assert problem.message == theirs[1]
        broken += 1
    assert len(core) >= 8 and broken >= 3 * len(core)


def _pool(config, name: str):
    """The config pool and its slice, asked of the catalog directly (not of infra.resolve)."""
    pool = next(p for p in config.tpu_pools if p.name == name)
    return pool, catalog.lookup(pool.machine_type, pool.topology)


def test_worker_groups_follow_the_catalog(rendered):
    config = rendered.config
    for manifest in rendered.manifests():
        if manifest["kind"] not in ("RayJob", "RayService"):
            continue
        cluster = _clusters(manifest)
        assert cluster["rayVersion"] == "2.60.0"
        head = cluster["headGroupSpec"]
        assert head["serviceType"] == "ClusterIP"  # the dashboard stays inside the cluster
        assert head["template"]["spec"]["nodeSelector"] == {"park-gke/role": "system"}
        assert all(isinstance(v, str) for v in head["rayStartParams"].values())
        for group in cluster["workerGroupSpecs"]:  # training/serving: one; RL: two
            pool, tpu = _pool(config, group["groupName"])
            assert group["numOfHosts"] == tpu.hosts
            pod = group["template"]["spec"]
            resources = pod["containers"][0]["resources"]
            assert resources["requests"]["google.com/tpu"] == str(tpu.chips_per_host)
            assert resources["limits"]["google.com/tpu"] == str(tpu.chips_per_host)
            expected = {**tpu.node_labels(), "park-gke/pool": pool.name}
            if pool.capacity == "spot":
                expected[catalog.SPOT_LABEL] = "true"
            assert pod["nodeSelector"] == expected
            assert {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
                "tolerations"
            ]
            assert pod["serviceAccountName"] == f"park-{rendered.plan.stack}-workload"
            (gcs,) = [v for v in pod["volumes"] if "csi" in v]
            assert gcs["csi"]["driver"] == "gcsfuse.csi.storage.gke.io"
            assert gcs["csi"]["volumeAttributes"]["bucketName"] == rendered.plan.names.bucket
            if manifest["metadata"]["name"] == "park-rl":
                assert group["replicas"] == group["maxReplicas"] <= pool.slices
            elif manifest["kind"] == "RayJob":
                assert group["replicas"] == config.training.num_slices
            else:
                # one whole slice per replica (infra/resolve/stack.py): the models' replicas, summed
                models = config.serving.models
                assert group["maxReplicas"] == sum(m.max_replicas for m in models) <= pool.slices
                assert group["replicas"] == sum(m.min_replicas for m in models)
                assert group["minReplicas"] == 0


def test_rayjob_runs_the_training_module_and_releases_tpus(rendered):
    config = rendered.config
    if not config.training.enabled:
        pytest.skip("no training RayJob (the RL job's entrypoint: tests/infra/test_rl_stack.py)")
    (job,) = [m for m in rendered.manifests() if m["kind"] == "RayJob"]
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] == config.training.ttl_seconds_after_finished
    # the run's budget, plus the trainer's wait for a staged model (tests/infra/test_waits.py)
    limits = rendered.plan.training.limits
    assert limits.active_deadline_s == config.training.active_deadline_seconds + (
        limits.model_wait_s or 0
    )
    assert spec["activeDeadlineSeconds"] == limits.active_deadline_s
    _, tpu = _pool(config, config.training.pool)
    entry = spec["entrypoint"]
    assert entry.startswith("python -m workloads.train ")
    for flag, value in [
        ("--num-workers", tpu.devices * config.training.num_slices),  # a worker per device
        ("--tpu-topology", tpu.topology),
        ("--torch-tpu-topology", tpu.torch_tpu_topology),
        ("--tpu-accelerator-type", tpu.ray_accelerator_type),
        ("--strategy", config.training.strategy),
        ("--storage-path", f"gs://{rendered.plan.names.bucket}/checkpoints"),
    ]:
        assert f"{flag} {value}" in entry
    assert yaml.safe_load(spec["runtimeEnvYAML"])["env_vars"]
    # only a pool Kueue fronts (queued, or a ladder) starts suspended: Kueue admits it
    kueue = next(p for p in rendered.plan.tpu_pools if p.name == config.training.pool).kueue
    assert spec.get("suspend", False) is kueue


def test_rayservice_serves_through_ray_serve_llm(rendered):
    config = rendered.config
    if not config.serving.enabled:
        pytest.skip("no RayService")
    (service,) = [m for m in rendered.manifests() if m["kind"] == "RayService"]
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    (app,) = serve["applications"]
    assert app["import_path"] == "workloads.serve.app:build_app"  # over Ray's, same args
    # park validate checks the LLM configs of the builders it knows: this one among them
    assert app["import_path"] in LLM_BUILDERS
    _, tpu = _pool(config, config.serving.pool)
    for model, llm in zip(config.serving.models, app["args"]["llm_configs"], strict=True):
        assert llm["accelerator_type"] == tpu.ray_accelerator_type
        assert llm["accelerator_config"] == {"kind": "tpu", "topology": tpu.topology}
        assert llm["engine_kwargs"]["tensor_parallel_size"] == (
            model.tensor_parallel_size or tpu.devices
        )
        env = llm["runtime_env"]["env_vars"]
        # Ray counts a TPU unit per device where a chip is two (Ray 2.60 get_tpu_resource_per_chip)
        assert env.get("RAY_TPU_RESOURCE_PER_CHIP") == (
            str(tpu.generation.devices_per_chip) if tpu.generation.devices_per_chip > 1 else None
        )
        assert (env.get("TPU_MULTIHOST_BACKEND") == "ray") == tpu.multi_host
    svc = service["spec"]["serveService"]["spec"]
    assert svc["type"] == "ClusterIP"
    assert service["spec"]["upgradeStrategy"]["type"] == config.serving.upgrade_strategy


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("org/model", "/data/models/org/model"),  # the copy staged in the bucket
        ("gs://other-bucket/models/m", {"bucket_uri": "gs://other-bucket/models/m"}),
        ("gs://my-gcp-project-dev-park/models/m", "/data/models/m"),
    ],
)
def test_model_source_mount_or_mirror(source, expected):
    from tests.conftest import render_stack

    pods = ray_plan.ray_pods(render_stack("dev").plan)
    assert ray_plan.model_source(pods, source) == expected
