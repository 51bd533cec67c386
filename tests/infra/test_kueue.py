"""Queued TPU capacity (DWS through Kueue): config rules, the Kueue objects, the RayJob that
waits in its queue, and the rendered stacks with and without queued pools."""

from __future__ import annotations

import copy
import re

import pytest

from infra import catalog
from infra.names import QUEUE_NAME_LABEL, QUEUED_TAINT_KEY, local_queue_name
from infra.plan import kueue, node_pools
from infra.plan import ray as ray_plan
from infra.stack import from_values
from infra.tools.schemas import validate_manifests
from tests.conftest import SHIPPED_STACKS, render_stack
from tests.infra.stack_problems import problems_of, shipped_values

QUEUED = "queued"


def _values(stack: str = QUEUED) -> dict:
    return shipped_values(stack)


def _plan(values: dict | None = None, stack: str = QUEUED):
    return from_values(values or _values(stack), stack)


def _problems(values: dict) -> dict[str, str]:
    return problems_of(values, QUEUED)


def _queued_pool(values: dict) -> dict:
    return next(p for p in values["park:tpuPools"] if p["capacity"] == "queued")


# ---------------------------------------------------------------------------------------------
# Config rules


def test_queued_stack_is_valid_and_queued():
    plan = _plan()
    assert [p.name for p in plan.kueue_pools] == ["train-v6e-16"]


def test_queued_pool_must_start_at_zero_nodes():
    values = _values()
    _queued_pool(values)["autoscaling"] = False
    problems = _problems(values)
    assert "needs autoscaling" in problems["park:tpuPools[0].autoscaling"]


def test_queued_pool_takes_no_reservation():
    values = _values()
    _queued_pool(values)["reservation"] = "my-reservation"
    problems = _problems(values)
    assert "not 'queued'" in problems["park:tpuPools[0].reservation"]


def test_serving_from_a_queued_pool_is_rejected():
    values = _values()
    values["park:serving"]["pool"] = "train-v6e-16"
    values["park:training"]["enabled"] = False
    problems = _problems(values)
    assert "queued pool" in problems["park:serving.pool"]


def test_kueue_version_is_a_chart_version():
    values = _values()
    values["park:kueue"] = {"version": "v0.19.2"}
    assert "no leading 'v'" in _problems(values)["park:kueue.version"]


def test_queued_gpu_pool_is_still_rejected():
    values = _values()
    values["park:gpuPools"] = [
        {
            "name": "h100",
            "machineType": "a3-highgpu-8g",
            "acceleratorType": "nvidia-h100-80gb",
            "capacity": "queued",
        }
    ]
    assert "park:gpuPools[0].capacity" in _problems(values)


# ---------------------------------------------------------------------------------------------
# The plan


def test_no_queued_pool_means_no_kueue():
    for stack in SHIPPED_STACKS:
        plan = _plan(_values(stack), stack)
        if plan.kueue_pools or plan.training is None:  # the rl stack runs no training RayJob
            continue
        assert kueue.manifests(plan) == []
        assert kueue.helm_release(plan) is None
        assert plan.training and plan.training.queue_name is None
        assert "suspend" not in ray_plan.rayjob(plan.training, ray_plan.ray_pods(plan))["spec"]


def test_helm_release_is_pinned_oci_chart():
    release = kueue.helm_release(_plan())
    assert release is not None
    assert release.chart == "oci://registry.k8s.io/kueue/charts/kueue"
    assert re.fullmatch(r"\d+\.\d+\.\d+", release.version or "")
    assert release.repo is None


def test_flavor_matches_the_node_pools_it_stands_for():
    """Kueue injects the flavor's labels as a nodeSelector and admits only pods tolerating its
    taints: both must be exactly what GKE puts on the queued pool's nodes."""
    stack = _plan()
    pool = stack.kueue_pools[0]
    flavor = kueue.resource_flavor(pool)["spec"]
    for plan in node_pools.tpu_slice_pools(pool, stack.spec.zone):
        node_labels = {**plan.args["node_config"]["labels"], **pool.slice.node_labels()}
        for key, value in flavor["nodeLabels"].items():
            assert node_labels[key] == value
        gke_taints = {(t["key"], t["value"]) for t in plan.taints}
        assert {(t["key"], t["value"]) for t in flavor["nodeTaints"]} == gke_taints
        assert {t["effect"] for t in flavor["nodeTaints"]} == {"NoSchedule"}


def test_cluster_queue_tpu_quota_is_slices_times_chips():
    plan = _plan()
    pool = plan.kueue_pools[0]
    queue = kueue.cluster_queue(plan, pool)["spec"]
    tpu_group = queue["resourceGroups"][0]
    assert tpu_group["coveredResources"] == [catalog.TPU_RESOURCE]
    (quota,) = tpu_group["flavors"][0]["resources"]
    tpu = catalog.lookup(pool.spec.machine_type, pool.spec.topology)
    assert quota["nominalQuota"] == str(pool.spec.slices * tpu.chips) == "32"
    assert queue["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": plan.spec.namespace
    }


def _quantity(value: str) -> float:
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", value)
    assert match, value
    return float(match.group(1)) * units.get(match.group(2), 1)


def _pod_requests(rayjob: dict) -> dict[str, float]:
    """What Kueue charges for the job: every pod of every pod set (head, workers, submitter)."""
    cluster = rayjob["spec"]["rayClusterSpec"]
    pod_sets = [(cluster["headGroupSpec"]["template"], 1)]
    for group in cluster["workerGroupSpecs"]:
        pod_sets.append((group["template"], group["replicas"] * group.get("numOfHosts", 1)))
    pod_sets.append((rayjob["spec"]["submitterPodTemplate"], 1))
    total: dict[str, float] = {}
    for template, count in pod_sets:
        for container in template["spec"]["containers"]:
            for name, value in container["resources"]["requests"].items():
                total[name] = total.get(name, 0) + count * _quantity(str(value))
    return total


def test_cluster_queue_covers_everything_the_training_job_requests():
    """A resource the queue does not cover, or a quota below one job, leaves the job pending
    forever: every request of the rendered RayJob must fit."""
    plan = _plan()
    assert plan.training is not None
    job = ray_plan.rayjob(plan.training, ray_plan.ray_pods(plan))
    quota: dict[str, float] = {}
    for group in kueue.cluster_queue(plan, plan.training.pool)["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for resource in flavor["resources"]:
                quota[resource["name"]] = _quantity(resource["nominalQuota"])
    for name, needed in _pod_requests(job).items():
        assert name in quota, f"{name} is not covered by the ClusterQueue"
        assert needed <= quota[name], f"{name}: job needs {needed}, quota {quota[name]}"


def test_objects_reference_each_other():
    plan = _plan()
    objects = {(m["kind"], m["metadata"]["name"]): m for m in kueue.manifests(plan)}
    pool = plan.kueue_pools[0]
    local = objects[("LocalQueue", local_queue_name(pool.name))]
    assert local["metadata"]["namespace"] == plan.spec.namespace
    cq = objects[("ClusterQueue", local["spec"]["clusterQueue"])]
    flavors = {f["name"] for g in cq["spec"]["resourceGroups"] for f in g["flavors"]}
    assert all(("ResourceFlavor", f) in objects for f in flavors)
    (check,) = cq["spec"]["admissionChecksStrategy"]["admissionChecks"]
    admission = objects[("AdmissionCheck", check["name"])]
    assert set(check["onFlavors"]) <= flavors
    assert admission["spec"]["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    params = admission["spec"]["parameters"]
    prc = objects[(params["kind"], params["name"])]
    assert prc["spec"]["provisioningClassName"] == "queued-provisioning.gke.io"
    assert prc["spec"]["managedResources"] == [catalog.TPU_RESOURCE]
    # admitted pods pinned to the nodes DWS made for them, retries stated
    (pin,) = prc["spec"]["podSetUpdates"]["nodeSelector"]
    assert pin == {
        "key": "autoscaling.gke.io/provisioning-request",
        "valueFromProvisioningClassDetail": "ResizeRequestName",
    }
    assert set(prc["spec"]["retryStrategy"]) == {
        "backoffLimitCount",
        "backoffBaseSeconds",
        "backoffMaxSeconds",
    }


def test_training_rayjob_waits_in_its_pools_queue():
    plan = _plan()
    assert plan.training is not None
    job = ray_plan.rayjob(plan.training, ray_plan.ray_pods(plan))
    pool = plan.training.pool
    assert job["metadata"]["labels"][QUEUE_NAME_LABEL] == local_queue_name(pool.name)
    assert job["spec"]["suspend"] is True
    assert job["spec"]["shutdownAfterJobFinishes"] is True  # Kueue rejects a job without it
    worker = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]
    assert {"key": QUEUED_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in (
        worker["tolerations"]
    )
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert "tolerations" not in head  # the head stays on the CPU pool


def test_kueue_manifests_validate_against_vendored_crds():
    plan = _plan()
    manifests = kueue.manifests(plan)
    assert {m["kind"] for m in manifests} == {
        "ResourceFlavor",
        "ClusterQueue",
        "LocalQueue",
        "AdmissionCheck",
        "ProvisioningRequestConfig",
    }
    assert validate_manifests(manifests) == []
    broken = copy.deepcopy(kueue.cluster_queue(plan, plan.kueue_pools[0]))
    broken["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] = "lots"
    assert validate_manifests([broken]), "the ClusterQueue schema must reject a bad quantity"


# ---------------------------------------------------------------------------------------------
# Rendered under mocks


def test_queued_stack_renders_kueue_and_a_suspended_rayjob():
    rendered = render_stack(QUEUED)
    release = rendered.one("kubernetes:helm.sh/v3:Release", "kueue")
    assert release.parent == "kueue"
    assert release.inputs["chart"] == kueue.CHART
    assert release.inputs["version"] == rendered.config.kueue.version
    by_kind: dict[str, list[str]] = {}
    for manifest in rendered.manifests():
        by_kind.setdefault(manifest["kind"], []).append(manifest["metadata"]["name"])
    assert by_kind["ResourceFlavor"] == ["park-host", "park-train-v6e-16"]
    assert by_kind["ClusterQueue"] == ["park-train-v6e-16"]
    assert by_kind["LocalQueue"] == ["train-v6e-16"]
    assert by_kind["AdmissionCheck"] == by_kind["ProvisioningRequestConfig"] == ["park-dws"]
    job = next(m for m in rendered.manifests() if m["kind"] == "RayJob")
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"][QUEUE_NAME_LABEL] == "train-v6e-16"
    pools = {r.name: r.inputs for r in rendered.of_type("gcp:container/nodePool:NodePool")}
    assert pools["train-v6e-16-s0"]["queuedProvisioning"] == {"enabled": True}


def _kueue_free(stack: str) -> bool:
    return not _plan(_values(stack), stack).kueue_pools


@pytest.mark.parametrize("stack", [s for s in SHIPPED_STACKS if _kueue_free(s)])
def test_stacks_without_queued_pools_have_no_kueue(stack):
    rendered = render_stack(stack)
    assert not [r for r in rendered.resources if "kueue.x-k8s.io" in r.type]
    assert not [r for r in rendered.of_type("kubernetes:helm.sh/v3:Release") if r.name == "kueue"]
    assert not [m for m in rendered.manifests() if m["apiVersion"].startswith("kueue.x-k8s.io")]
    job = next((m for m in rendered.manifests() if m["kind"] == "RayJob"), None)
    if job is not None:
        assert QUEUE_NAME_LABEL not in job["metadata"]["labels"]
        assert "suspend" not in job["spec"]


def test_every_rendered_manifest_of_the_queued_stack_validates():
    manifests = render_stack(QUEUED).manifests()
    assert len(manifests) > 10
    assert validate_manifests(manifests) == []


def test_kueue_objects_wait_for_the_release():
    """Kueue's CRDs come with its Helm release: every Kueue object must depend on it, and the
    LocalQueue on the namespace it lives in (dependencies as the engine records them)."""
    from tests.conftest import render_stack

    rendered = render_stack("queued")
    config = rendered.config
    objects = [r for r in rendered.resources if r.type.startswith("kubernetes:kueue.x-k8s.io")]
    assert len(objects) == len(kueue.manifests(rendered.plan))
    (namespace,) = [  # the Workspace's child for the namespace (named after the component)
        r.name
        for r in rendered.of_type("kubernetes:core/v1:Namespace")
        if r.inputs["metadata"]["name"] == config.namespace
    ]
    for resource in objects:
        assert "kueue" in resource.dependencies, resource.name
        assert namespace in resource.dependencies, resource.name
