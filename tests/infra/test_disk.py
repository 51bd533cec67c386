"""The disk model (infra/resolve/disk.py) against what the stacks render, and the data placement.

The proof of issue 19's disk item: for every shipped stack, each Ray pod's worst case from the
plan sits under the ephemeral-storage limit read back from the RENDERED RayJob / RayService
(and its emptyDirs under that limit); each node pool's rendered boot disk holds its pods within
what GKE leaves allocatable; prod's served model reaches the engine as a staged copy under the
bucket mount, never a hub id the engine would download into each host's scratch.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from infra import model_facts
from infra.plan import ray as ray_plan
from infra.plan.staging import staging_jobs
from infra.resolve import disk
from infra.rules import problems
from infra.schema.read import parse_values, read_stack_file
from infra.tools.manifests import pods as pod_reader
from tests.conftest import SHIPPED_STACKS, STACKS_DIR, render_stack

UNITS = {"": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6}
UNITS |= {"G": 10**9}


def quantity(text: Any) -> int:
    """A Kubernetes byte quantity ("16Gi", "7680Mi", "5G") in bytes."""
    match = re.fullmatch(r"([0-9.]+)([KMGT]i?|k)?", str(text))
    assert match, text
    return int(float(match.group(1)) * UNITS[match.group(2) or ""])


def _ray_manifests(stack: str) -> list[dict[str, Any]]:
    kinds = pod_reader.RAY_KINDS
    return [m for m in render_stack(stack).manifests() if m["kind"] in kinds]


def _limit(template: Any) -> int:
    (container,) = [c for c in template["spec"]["containers"]]
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert limits["ephemeral-storage"] == requests["ephemeral-storage"]
    return quantity(limits["ephemeral-storage"])


def _has_sidecar(template: Any) -> bool:
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    return annotations.get("gke-gcsfuse/volumes") == "true"


def _sidecar_limit(template: Any) -> int:
    """The GCS FUSE sidecar's ephemeral storage as the webhook will give it (request = limit,
    both from the pod's annotations)."""
    annotations = template["metadata"]["annotations"]
    request = quantity(annotations["gke-gcsfuse/ephemeral-storage-request"])
    assert request == quantity(annotations["gke-gcsfuse/ephemeral-storage-limit"])
    return request


def _empty_dirs(template: Any) -> dict[str, int]:
    return {
        v["name"]: quantity(v["emptyDir"]["sizeLimit"])
        for v in template["spec"]["volumes"]
        if "emptyDir" in v and v["emptyDir"].get("medium") != "Memory"
    }


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_pod_worst_case_fits_its_rendered_limit(stack: str):
    plan = render_stack(stack).plan
    assert plan.disk is not None
    seen = set()
    for manifest in _ray_manifests(stack):
        for ref in pod_reader.pod_templates(manifest["kind"], manifest["spec"]):
            # the budget the pod was sized from, as the rendered pod says
            annotations = (ref.template.get("metadata") or {}).get("annotations") or {}
            role = annotations[ray_plan.DISK_BUDGET_ANNOTATION]
            budget = plan.disk.pod(role)
            assert budget is not None, role
            limit = _limit(ref.template)
            # the worst case the plan derives (scratch + file cache + logs) fits the limit
            assert budget.worst_case_bytes <= limit, (stack, role)
            # the scratch and cache volumes cannot together outgrow the container's limit
            dirs = _empty_dirs(ref.template)
            assert dirs["tmp"] >= budget.scratch_bytes
            # the GCS FUSE sidecar's write buffer is the sidecar's, within its own limit
            buffer = dirs.pop(ray_plan.GCSFUSE_BUFFER_VOLUME, None)
            assert sum(dirs.values()) + disk.CONTAINER_LOGS_BYTES <= limit, (stack, role)
            assert (buffer is not None) == budget.mounts_bucket == _has_sidecar(ref.template)
            if buffer is not None:
                assert buffer + disk.CONTAINER_LOGS_BYTES <= _sidecar_limit(ref.template)
            seen.add(role)
    expected = {p.role for p in plan.disk.pods}
    assert seen == expected


def _mount_options(template: Any) -> dict[str, str]:
    (gcs,) = [v for v in template["spec"]["volumes"] if "csi" in v]
    options = gcs["csi"]["volumeAttributes"]["mountOptions"].split(",")
    return dict(o.rsplit(":", 1) for o in options if ":" in o)


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_serving_file_cache_is_sized_from_the_model_and_has_a_volume(stack: str):
    plan = render_stack(stack).plan
    if plan.serving is None:
        pytest.skip("no serving")
    (service,) = [m for m in _ray_manifests(stack) if m["kind"] == "RayService"]
    templates = {
        t.role: t.template for t in pod_reader.pod_templates("RayService", service["spec"])
    }
    worker = templates["worker"]
    cache_mb = int(_mount_options(worker)["file-cache:max-size-mb"])
    # The largest served model's weights, from its facts (parameters x stored dtype bytes).
    weights = max(
        m.facts.facts.params * m.facts.facts.dtype_bytes
        for m in plan.serving.models
        if m.facts.facts is not None and m.facts.facts.params
    )
    assert cache_mb * 2**20 >= weights - 2**20
    assert _empty_dirs(worker)["gke-gcsfuse-cache"] >= weights
    assert _limit(worker) >= weights
    # heads load no weights: no cache on them
    assert _mount_options(templates["head"])["file-cache:max-size-mb"] == "0"
    assert _mount_options(worker)["write:enable-streaming-writes"] == "true"


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_rendered_boot_disks_hold_their_pods(stack: str):
    rendered = render_stack(stack)
    plan = rendered.plan
    assert plan.disk is not None
    by_pool: dict[str, int] = {}
    for r in rendered.of_type("gcp:container/nodePool:NodePool"):
        labels = r.inputs["nodeConfig"].get("labels", {})
        pool = labels.get("park-gke/pool", "cpu")
        by_pool[pool] = int(r.inputs["nodeConfig"]["diskSizeGb"])
    for node in plan.disk.nodes:
        size = by_pool[node.pool]
        need = node.pods_bytes + disk.IMAGE_BYTES + disk.SYSTEM_PODS_BYTES
        assert disk.gke_allocatable_bytes(size) >= need, (stack, node.pool)
    # every TPU pod's limit is counted on its pool's node, with its GCS FUSE sidecar's
    for pod in plan.disk.pods:
        node = plan.disk.node(pod.pool)
        assert node is not None and node.pods_bytes >= pod.limit_bytes + pod.sidecar_bytes


# The GCS FUSE CSI webhook's default ephemeral-storage request for its sidecar, when a pod's
# annotations set none (gcs-fuse-csi-driver cmd/webhook flag --sidecar-ephemeral-storage-request).
WEBHOOK_DEFAULT_SIDECAR_REQUEST = 5 * 2**30


def _pod_request(template: Any) -> int:
    """A rendered pod's ephemeral-storage request on its node, as the scheduler sums it: its
    containers' and, when the CSI webhook injects one, its GCS FUSE sidecar's (the annotation,
    else the webhook's default)."""
    total = sum(
        quantity(c["resources"]["requests"]["ephemeral-storage"])
        for c in template["spec"]["containers"]
    )
    if _has_sidecar(template):
        annotations = template["metadata"]["annotations"]
        request = annotations.get("gke-gcsfuse/ephemeral-storage-request")
        total += quantity(request) if request else WEBHOOK_DEFAULT_SIDECAR_REQUEST
    return total


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_rendered_pods_with_their_sidecars_fit_the_rendered_boot_disks(stack: str):
    """From the manifests alone: every Ray pod's request, its FUSE sidecar's included, on the
    node pool it selects (all CPU-pool pods may share one node; one Ray pod per TPU host)."""
    rendered = render_stack(stack)
    sizes: dict[str, int] = {}
    for r in rendered.of_type("gcp:container/nodePool:NodePool"):
        labels = r.inputs["nodeConfig"].get("labels", {})
        sizes[labels.get("park-gke/pool", "cpu")] = int(r.inputs["nodeConfig"]["diskSizeGb"])
    cpu, tpu = 0, dict.fromkeys(sizes, 0)
    for manifest in _ray_manifests(stack):
        for ref in pod_reader.pod_templates(manifest["kind"], manifest["spec"]):
            selector = ref.template["spec"].get("nodeSelector") or {}
            pool = selector.get("park-gke/pool")
            if pool is None:
                cpu += _pod_request(ref.template)
            else:
                tpu[pool] = max(tpu.get(pool, 0), _pod_request(ref.template))
    tpu["cpu"] = cpu
    for pool, need in tpu.items():
        if pool not in sizes:
            continue  # a GPU pool's pods are sized by its own rules
        room = disk.gke_allocatable_bytes(sizes[pool]) - disk.IMAGE_BYTES - disk.SYSTEM_PODS_BYTES
        assert need <= room, (stack, pool, need / 2**30, room / 2**30)


def test_gke_allocatable_matches_the_documented_example():
    """GKE's node-sizing page shows a 100 GB boot disk with ~47 GB allocatable: the formula
    must not promise more than a few GB beyond it (the image allowance covers the rest)."""
    allocatable = disk.gke_allocatable_bytes(100)
    assert 40 * 10**9 < allocatable < 47_060_071_478 + disk.IMAGE_BYTES


def _serve_config(stack: str) -> dict[str, Any]:
    (service,) = [m for m in _ray_manifests(stack) if m["kind"] == "RayService"]
    return yaml.safe_load(service["spec"]["serveConfigV2"])


def test_prod_serves_its_hub_model_from_the_staged_copy_not_a_hub_download():
    plan = render_stack("prod").plan
    mount = plan.spec.storage.mount_path
    (llm,) = _serve_config("prod")["applications"][0]["args"]["llm_configs"]
    source = llm["model_loading_config"]["model_source"]
    spec_source = plan.spec.serving.models[0].source
    assert model_facts.is_hub_id(spec_source)  # the stack names a hub model...
    assert isinstance(source, str) and source.startswith(f"{mount}/")  # ...the engine a path
    assert not model_facts.is_hub_id(source) and "://" not in source
    assert source == disk.staged_path(mount, spec_source)
    # the copy the engine reads is the one the staging Job writes, in the stack's bucket
    jobs = {
        j["spec"]["template"]["spec"]["containers"][0]["command"][-1] for j in staging_jobs(plan)
    }
    assert disk.staged_uri(plan.names.bucket, spec_source) in jobs
    assert disk.staged_uri(plan.names.bucket, spec_source).removeprefix(
        f"gs://{plan.names.bucket}"
    ) == source.removeprefix(mount)
    # and the training run of prod loads its hub model from the bucket too
    (job,) = [m for m in _ray_manifests("prod") if m["kind"] == "RayJob"]
    assert (
        f"--model {disk.staged_path(mount, plan.spec.training.model)}" in job["spec"]["entrypoint"]
    )


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_no_engine_or_trainer_reads_a_hub_id(stack: str):
    plan = render_stack(stack).plan
    if plan.serving is not None:
        for llm in _serve_config(stack)["applications"][0]["args"]["llm_configs"]:
            source = llm["model_loading_config"]["model_source"]
            assert not (isinstance(source, str) and model_facts.is_hub_id(source)), source
    staged = {s.repo for s in plan.disk.staged} if plan.disk else set()
    for model in plan.serving.models if plan.serving else ():
        if model.source and model_facts.is_hub_id(model.source):
            assert model.source in staged


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_caches_and_tmp_live_on_the_sized_scratch(stack: str):
    for manifest in _ray_manifests(stack):
        for ref in pod_reader.pod_templates(manifest["kind"], manifest["spec"]):
            if ref.role == "submitter":
                continue
            (container,) = ref.template["spec"]["containers"]
            env = {e["name"]: e.get("value") for e in container["env"]}
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            for name in ("HOME", "TMPDIR", "HF_HOME", "XDG_CACHE_HOME", "PARK_CACHE_DIR"):
                assert env[name].startswith(mounts["tmp"]), (name, env[name])
            assert int(env["RAY_ROTATION_MAX_BYTES"]) == disk.RAY_LOG_ROTATE_BYTES


def _values(stack: str) -> dict[str, Any]:
    values, _ = read_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml")
    return dict(values)


def test_a_pinned_boot_disk_too_small_is_refused_naming_the_key():
    values = _values("prod")
    pools = [dict(p) for p in values["park:tpuPools"]]
    serve = next(i for i, p in enumerate(pools) if p["name"] == "serve-v6e-16")
    pools[serve]["diskSizeGb"] = 100
    values["park:tpuPools"] = pools
    found = problems(parse_values(values, "prod"))
    keys = [p.key for p in found]
    assert f"park:tpuPools[{serve}].diskSizeGb" in keys
    (problem,) = [p for p in found if p.key == f"park:tpuPools[{serve}].diskSizeGb"]
    assert "GB" in problem.message and problem.value == 100
    # large enough: accepted, and the node pool gets what the stack says
    pools[serve]["diskSizeGb"] = 400
    assert not [p for p in problems(parse_values(values, "prod")) if "diskSizeGb" in p.key]


def test_host_memory_allowances_read_from_the_sources():
    """The DCP staging figure is FileSystemWriter's own default; Ray's log rotation default is
    bigger than the one the pods get, so the plan's bound is what bounds Ray's logs."""
    import inspect

    from ray._common import ray_constants
    from torch.distributed.checkpoint import FileSystemWriter

    from infra.resolve import host_memory

    default = inspect.signature(FileSystemWriter.__init__).parameters["per_thread_copy_ahead"]
    assert default.default == host_memory.DCP_COPY_AHEAD_BYTES
    assert disk.RAY_LOG_ROTATE_BYTES < ray_constants.LOGGING_ROTATE_BYTES
    assert disk.RAY_LOG_BACKUPS <= ray_constants.LOGGING_ROTATE_BACKUP_COUNT


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_host_memory_fits_each_tpu_pods_request(stack: str):
    plan = render_stack(stack).plan
    assert plan.disk is not None
    if plan.training is not None or plan.serving is not None:
        assert plan.disk.memory
    for host in plan.disk.memory:
        assert host.fits, (stack, host.role, host.total_bytes, host.request_bytes)
