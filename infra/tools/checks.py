"""Plan checks: rules the CRD schemas cannot express, checked on the manifests themselves.

The vendored CRD schemas say a RayJob is well-formed; they cannot say it will ever schedule or
that its flags agree with its pods. These checks read the emitted manifests (or hand-edited
copies of them) against the TPU catalog and the stack config, so a manifest someone changed by
hand is held to the same facts as the plan that rendered it. Each problem names the manifest and
the JSON path inside it, like the schema problems of `infra.tools.schemas`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from infra import engines
from infra.engine import tensor_parallel_options
from infra.resolve import StackPlan
from infra.tools.manifests import tpu_groups
from infra.tools.manifests.pods import cluster_spec
from infra.tools.schemas import ManifestProblem
from workloads import protocol


def _name(manifest: dict[str, Any]) -> str:
    return f"{manifest.get('kind', '?')}/{(manifest.get('metadata') or {}).get('name', '?')}"


def _get(node: Any, *path: str | int) -> Any:
    for part in path:
        if isinstance(part, int):
            node = node[part] if isinstance(node, list) and len(node) > part else None
        else:
            node = node.get(part) if isinstance(node, dict) else None
    return node


def _int(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def _tpu_groups(manifest: dict[str, Any]) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    """(path of the RayCluster spec, its TPU worker groups with their index)."""
    base, spec = cluster_spec(str(manifest.get("kind")), manifest.get("spec") or {})
    groups = _get(spec, "workerGroupSpecs")
    found = [
        (i, g)
        for i, g in enumerate(groups if isinstance(groups, list) else [])
        if isinstance(g, dict) and tpu_groups.is_tpu_group(g)
    ]
    return base, found


def _check_group(
    name: str, at: str, group: dict[str, Any], plan: StackPlan | None
) -> Iterator[ManifestProblem]:
    """The shared worker-group rules, then the group against the stack's pools."""
    for problem in tpu_groups.group_problems(group):
        yield ManifestProblem(name, f"{at}.{problem.path}", problem.message)
    if plan is None:
        return
    pools = {p.name: p for p in plan.tpu_pools}
    pool = pools.get(str(group.get("groupName")))
    if pool is None:
        yield ManifestProblem(
            name,
            f"{at}.groupName",
            f"{group.get('groupName')!r} names no TPU pool of park:tpuPools "
            f"({', '.join(pools) or 'none'}); the group's replicas are that pool's slices",
        )
        return
    topology, _ = tpu_groups.group_slice(group)
    if topology is not None and pool.slice.topology != topology:
        yield ManifestProblem(
            name,
            f"{at}.template.spec.nodeSelector",
            f"topology {topology} but pool {pool.name} has {pool.slice.topology} slices",
        )
    hi = _int(group.get("maxReplicas"))
    if hi is not None and hi > pool.slices:
        yield ManifestProblem(
            name,
            f"{at}.maxReplicas",
            f"maxReplicas {hi} but pool {pool.name} has {pool.slices} slice(s)",
        )


def _check_rayjob(
    manifest: dict[str, Any], groups: list[tuple[int, dict[str, Any]]], base: str
) -> Iterator[ManifestProblem]:
    """The entrypoint's flags must match the TPU the job's worker group asks for."""
    name = _name(manifest)
    spec = manifest.get("spec") or {}
    runtime_env = spec.get("runtimeEnvYAML")
    if runtime_env is not None:
        try:
            parsed = yaml.safe_load(runtime_env)
        except yaml.YAMLError as err:
            parsed = err
        if not isinstance(parsed, dict):
            yield ManifestProblem(
                name, "spec.runtimeEnvYAML", f"must be a YAML mapping (a runtime_env): {parsed}"
            )
    entrypoint = spec.get("entrypoint")
    if not isinstance(entrypoint, str):
        return
    try:
        head, fields = protocol.split_entrypoint(entrypoint)
    except ValueError as err:
        yield ManifestProblem(name, "spec.entrypoint", f"not a shell command line: {err}")
        return
    if head[-2:] == ["-m", "workloads.rl"]:
        yield from _check_rl_entrypoint(name, fields, groups, base)
        return
    if not protocol.runs_training(head):
        return  # not our training entrypoint: nothing more to compare
    if fields.get("accelerator") != "tpu" or len(groups) != 1:
        return
    i, group = groups[0]
    topology, chips = tpu_groups.group_slice(group)
    per_pod = tpu_groups.template_chips(group.get("template") or {})
    if chips is None:
        return
    slices = _int(group.get("replicas", 1)) or 1
    per_chip = tpu_groups.devices_per_chip(group)  # a worker per Ray TPU unit (device)
    expected = {
        "num_workers": str(chips * per_chip * slices),
        "tpu_topology": topology,
        "chips_per_host": str(per_pod) if per_pod else None,
        "num_slices": str(slices),
    }
    for field, want in expected.items():
        have = fields.get(field)
        if want is not None and have is not None and have != want:
            yield ManifestProblem(
                name,
                "spec.entrypoint",
                f"{protocol.flag(field)} {have} but {base}.workerGroupSpecs[{i}] gives {want} "
                f"({slices} x {topology} slice(s), one worker per Ray TPU unit, "
                f"{per_chip} per chip)",
            )


def _check_rl_entrypoint(
    name: str,
    fields: dict[str, str | None],
    groups: list[tuple[int, dict[str, Any]]],
    base: str,
) -> Iterator[ManifestProblem]:
    """The RL job (infra/plan/rl.py): the learner's workers are the chips of its group (the
    first), and the engines fit in the rollout group's chips when it is a TPU group."""
    if not groups or groups[0][0] != 0:
        return
    for i, group in groups:
        _, chips = tpu_groups.group_slice(group)
        if chips is None:
            continue
        slices = _int(group.get("replicas", 1)) or 1
        if i == 0:
            have, want = fields.get("num_workers"), str(chips * slices)
            if have is not None and have != want:
                yield ManifestProblem(
                    name,
                    "spec.entrypoint",
                    f"--num-workers {have} but the learner group {base}.workerGroupSpecs[0] "
                    f"gives {want} chips, one worker each",
                )
            continue
        engines = _int(fields.get("rollout_engines")) or 1
        tp = _int(fields.get("rollout_tensor_parallel_size")) or 1
        if engines * tp > chips * slices:
            yield ManifestProblem(
                name,
                "spec.entrypoint",
                f"--rollout-engines {engines} x --rollout-tensor-parallel-size {tp} chips, but "
                f"the rollout group {base}.workerGroupSpecs[{i}] has {chips * slices}",
            )


def _check_rayservice(
    manifest: dict[str, Any], groups: list[tuple[int, dict[str, Any]]], engine_name: str
) -> Iterator[ManifestProblem]:
    """Each TPU LLM must fit the worker group's slice; multi-host needs the Ray backend."""
    from infra import catalog

    name = _name(manifest)
    text = _get(manifest, "spec", "serveConfigV2")
    if text is None:
        return
    try:
        serve = yaml.safe_load(text)
    except yaml.YAMLError as err:
        yield ManifestProblem(name, "spec.serveConfigV2", f"not YAML: {err}")
        return
    if not isinstance(serve, dict) or not isinstance(serve.get("applications"), list):
        yield ManifestProblem(name, "spec.serveConfigV2", "must be a mapping with applications")
        return
    slices: dict[str, catalog.TpuSlice] = {}
    for _, group in groups:
        topology, _chips = tpu_groups.group_slice(group)
        per_pod = tpu_groups.template_chips(group.get("template") or {})
        for candidate in catalog.all_slices():
            if candidate.topology == topology and candidate.chips_per_host == per_pod:
                slices[candidate.topology] = candidate
    for a, app in enumerate(serve["applications"]):
        llms = _get(app, "args", "llm_configs")
        for m, llm in enumerate(llms if isinstance(llms, list) else []):
            if not isinstance(llm, dict):
                continue
            at = f"spec.serveConfigV2: applications[{a}].args.llm_configs[{m}]"
            accel = llm.get("accelerator_config") or {}
            if accel.get("kind") != "tpu":
                continue
            topology = accel.get("topology")
            if topology not in slices:
                yield ManifestProblem(
                    name,
                    f"{at}.accelerator_config.topology",
                    f"{topology!r}: no TPU worker group of the RayService has this topology "
                    f"({', '.join(slices) or 'none'})",
                )
                continue
            tpu = slices[topology]
            tp = _int(_get(llm, "engine_kwargs", "tensor_parallel_size")) or 1
            if tp not in tensor_parallel_options(engine_name, tpu):
                yield ManifestProblem(
                    name,
                    f"{at}.engine_kwargs.tensor_parallel_size",
                    f"{tp} does not fit a {topology} slice ({tpu.devices} devices, "
                    f"{tpu.devices_per_host} per host)",
                )
            env = _get(llm, "runtime_env", "env_vars") or {}
            needed = engines.get(engine_name).multi_host_env
            missing = [f"{k}={v}" for k, v in needed if env.get(k) != v]
            if tp > tpu.devices_per_host and missing:
                yield ManifestProblem(
                    name,
                    f"{at}.runtime_env.env_vars",
                    f"TP across hosts needs {', '.join(missing)}, else vLLM silently runs "
                    "on one host",
                )


GCS_FUSE_DRIVER = "gcsfuse.csi.storage.gke.io"


def _bucket_mounts(template: dict[str, Any]) -> dict[str, str]:
    """mount path → bucket of a pod template's GCS FUSE volumes (in its first container)."""
    spec = template.get("spec") or {}
    buckets = {
        v.get("name"): _get(v, "csi", "volumeAttributes", "bucketName")
        for v in spec.get("volumes") or []
        if _get(v, "csi", "driver") == GCS_FUSE_DRIVER
    }
    containers = spec.get("containers") or [{}]
    return {
        m["mountPath"].rstrip("/"): buckets[m["name"]]
        for m in containers[0].get("volumeMounts") or []
        if m.get("name") in buckets and m.get("mountPath")
    }


def _check_bucket_sources(
    manifest: dict[str, Any], plan: StackPlan | None
) -> Iterator[ManifestProblem]:
    """A model loaded from a path (the bucket mount, e.g. a training run's export) must be
    readable where the engine runs: every pod of the RayService mounts a bucket there, as a
    service account; with the plan, the stack's own bucket, and a `source: training` model
    exactly where the training run exports."""
    from infra.tools.manifests.pods import pod_templates

    name = _name(manifest)
    try:
        serve = yaml.safe_load(_get(manifest, "spec", "serveConfigV2") or "") or {}
    except yaml.YAMLError:
        return  # reported by _check_rayservice
    templates = list(pod_templates("RayService", manifest.get("spec")))
    for a, app in enumerate(serve.get("applications") or []):
        for m, llm in enumerate(_get(app, "args", "llm_configs") or []):
            source = _get(llm, "model_loading_config", "model_source")
            if not isinstance(source, str) or not source.startswith("/"):
                continue
            at = f"spec.serveConfigV2: applications[{a}].args.llm_configs[{m}]"
            for pod in templates:
                mounts = _bucket_mounts(dict(pod.template))
                under = [p for p in mounts if source == p or source.startswith(p + "/")]
                if not under:
                    yield ManifestProblem(
                        name,
                        f"{pod.path}.spec.volumes",
                        f"{at}.model_loading_config.model_source {source!r} is under no GCS "
                        "FUSE mount of this pod: the engine cannot read it",
                    )
                    continue
                if not (pod.template.get("spec") or {}).get("serviceAccountName"):
                    yield ManifestProblem(
                        name,
                        f"{pod.path}.spec.serviceAccountName",
                        "unset: the pod cannot reach the bucket through Workload Identity",
                    )
                if plan is not None and mounts[under[0]] != plan.names.bucket:
                    yield ManifestProblem(
                        name,
                        f"{pod.path}.spec.volumes",
                        f"mounts bucket {mounts[under[0]]!r} at {under[0]}, not the stack's "
                        f"{plan.names.bucket!r} (where the training run writes)",
                    )
            model_id = _get(llm, "model_loading_config", "model_id")
            models = plan.serving.models if plan is not None and plan.serving else ()
            trained = [sm for sm in models if sm.from_training and sm.spec.name == model_id]
            if plan is not None and trained and trained[0].source:
                export = trained[0].source  # the run's export (training or rl), as resolved
                expected = export.replace(
                    f"gs://{plan.names.bucket}", plan.spec.storage.mount_path, 1
                )
                if source != expected:
                    yield ManifestProblem(
                        name,
                        f"{at}.model_loading_config.model_source",
                        f"{source!r}: the run exports to {export} ({expected} through the mount)",
                    )


def check_manifests(
    manifests: list[dict[str, Any]], plan: StackPlan | None = None
) -> list[ManifestProblem]:
    """Every plan problem in these manifests; `plan` adds the checks against the stack's pools."""
    problems: list[ManifestProblem] = []
    for manifest in manifests:
        kind = manifest.get("kind")
        if kind not in ("RayJob", "RayService", "RayCluster"):
            continue
        name = _name(manifest)
        base, groups = _tpu_groups(manifest)
        for i, group in groups:
            problems += _check_group(name, f"{base}.workerGroupSpecs[{i}]", group, plan)
        if kind == "RayJob":
            problems += _check_rayjob(manifest, groups, base)
        elif kind == "RayService":
            engine_name = plan.spec.serving.engine if plan is not None else engines.DEFAULT_ENGINE
            problems += _check_rayservice(manifest, groups, engine_name)
            problems += _check_bucket_sources(manifest, plan)
    return problems


# ---------------------------------------------------------------------------------------------
# Ray's own classes, in a subprocess

SERVE_VALIDATOR = "workloads.serve.validate"
_SERVE_CHECK = f"""
import json, sys
try:
    from {SERVE_VALIDATOR} import validate_serve_config
    problems = validate_serve_config(sys.stdin.read())
except ModuleNotFoundError as err:
    print("PARK_SERVE_CHECK " + json.dumps({{"skipped": f"{{err}}"}}))
else:
    print("PARK_SERVE_CHECK " + json.dumps({{"problems": problems}}))
"""


def serve_check_available() -> bool:
    """Whether the serving workload's validator can run here (without importing it)."""
    import importlib.util

    return importlib.util.find_spec(SERVE_VALIDATOR.split(".")[0]) is not None


def ray_serve_check(serve_config_v2: str, timeout_s: float = 600) -> tuple[list[str], str | None]:
    """(problems, why skipped) from Ray's own ServeDeploySchema / LLMConfig classes.

    Runs `workloads.serve.validate` in a subprocess: infra never imports workloads, and Ray
    plus vLLM take ~10 s to import, which only this check should pay.
    """
    import subprocess

    from infra.tools.pychild import run_python

    if not serve_check_available():
        return [], "the workloads package is not installed (pip install -e '.[serve]')"
    try:
        done = run_python(_SERVE_CHECK, serve_config_v2, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [f"Ray's serve config check did not finish in {timeout_s:.0f}s"], None
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("PARK_SERVE_CHECK "):
            import json

            result = json.loads(line.removeprefix("PARK_SERVE_CHECK "))
            if "skipped" in result:
                return [], f"cannot import it ({result['skipped']})"
            return [str(p) for p in result["problems"]], None
    tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
    return [f"Ray's serve config check crashed (exit {done.returncode}): {' | '.join(tail)}"], None
