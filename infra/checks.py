"""Plan checks: rules the CRD schemas cannot express, checked on the manifests themselves.

The vendored CRD schemas say a RayJob is well-formed; they cannot say it will ever schedule or
that its flags agree with its pods. These checks read the emitted manifests (or hand-edited
copies of them) against the TPU catalog and the stack config, so a manifest someone changed by
hand is held to the same facts as the plan that rendered it. Each problem names the manifest and
the JSON path inside it, like the schema problems of `infra.validate`.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterator
from typing import Any

import yaml

from infra import catalog
from infra.config import StackConfig
from infra.plan.ray import TRAIN_MODULE
from infra.validate import ManifestProblem

_TOPOLOGY = catalog.TOPOLOGY_LABEL
_ACCELERATOR = catalog.ACCELERATOR_LABEL


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


def _chips(topology: str) -> int | None:
    try:
        return math.prod(catalog.topology_dims(topology))
    except catalog.CatalogError:
        return None


def _worker_groups(manifest: dict[str, Any]) -> tuple[str, list[Any]]:
    """(path of the RayCluster spec, its worker groups) for RayJob, RayService, RayCluster."""
    kind = manifest.get("kind")
    cluster = {"RayJob": "rayClusterSpec", "RayService": "rayClusterConfig"}.get(str(kind))
    base = f"spec.{cluster}" if cluster else "spec"
    spec = _get(manifest, "spec", cluster) if cluster else _get(manifest, "spec")
    groups = _get(spec, "workerGroupSpecs")
    return base, groups if isinstance(groups, list) else []


def _tpu_slice(group: dict[str, Any]) -> tuple[str | None, int | None, int | None]:
    """(topology, chips of the topology, google.com/tpu per pod) of a TPU worker group."""
    selector = _get(group, "template", "spec", "nodeSelector") or {}
    topology = selector.get(_TOPOLOGY)
    container = _get(group, "template", "spec", "containers", 0) or {}
    per_pod = _int(_get(container, "resources", "limits", catalog.TPU_RESOURCE))
    return topology, _chips(topology) if topology else None, per_pod


def _check_tpu_group(
    name: str, at: str, group: dict[str, Any], config: StackConfig | None
) -> Iterator[ManifestProblem]:
    """A TPU worker group must ask for exactly one slice per replica, as the webhook demands."""
    selector = _get(group, "template", "spec", "nodeSelector") or {}
    accelerator = selector.get(_ACCELERATOR)
    known = {g.gke_accelerator for g in catalog.GENERATIONS.values()}
    if accelerator not in known:
        yield ManifestProblem(
            name,
            f"{at}.template.spec.nodeSelector",
            f"{_ACCELERATOR} {accelerator!r} is not a known TPU; "
            f"allowed: {', '.join(sorted(known))}",
        )
        return
    topology, chips, per_pod = _tpu_slice(group)
    if topology is None or chips is None:
        yield ManifestProblem(
            name,
            f"{at}.template.spec.nodeSelector",
            f"a TPU worker group needs a {_TOPOLOGY} of the form AxB (got {topology!r})",
        )
        return
    offered = [
        m
        for m in catalog.MACHINE_TYPES.values()
        if topology in m.topologies
        and catalog.GENERATIONS[m.generation].gke_accelerator == accelerator
    ]
    if not offered:
        yield ManifestProblem(
            name,
            f"{at}.template.spec.nodeSelector",
            f"no {accelerator} machine type offers topology {topology}",
        )
        return
    container_at = f"{at}.template.spec.containers[0].resources"
    resources = _get(group, "template", "spec", "containers", 0, "resources") or {}
    requests = _int(_get(resources, "requests", catalog.TPU_RESOURCE))
    if per_pod is None:
        yield ManifestProblem(name, f"{container_at}.limits", f"no {catalog.TPU_RESOURCE} limit")
        return
    if requests is not None and requests != per_pod:
        yield ManifestProblem(
            name,
            f"{container_at}.requests",
            f"{catalog.TPU_RESOURCE} request {requests} differs from the limit {per_pod}",
        )
    per_host = sorted({m.chips_per_host for m in offered})
    if per_pod not in per_host:
        yield ManifestProblem(
            name,
            f"{container_at}.limits",
            f"{catalog.TPU_RESOURCE} {per_pod} per pod: a {topology} host has "
            f"{' or '.join(map(str, per_host))} chips (one pod per host takes all of them)",
        )
    hosts = _int(group.get("numOfHosts", 1))
    if hosts is not None and per_pod and hosts * per_pod != chips:
        yield ManifestProblem(
            name,
            f"{at}.numOfHosts",
            f"numOfHosts {hosts} x {per_pod} chips per pod = {hosts * per_pod}, but topology "
            f"{topology} has {chips} chips (the TPU webhook rejects this group)",
        )
    tolerations = _get(group, "template", "spec", "tolerations") or []
    if not any(isinstance(t, dict) and t.get("key") == catalog.TPU_TAINT_KEY for t in tolerations):
        yield ManifestProblem(
            name,
            f"{at}.template.spec.tolerations",
            f"no toleration for the {catalog.TPU_TAINT_KEY} taint: the pods never schedule",
        )
    yield from _check_replicas(name, at, group, config, topology)


def _check_replicas(
    name: str, at: str, group: dict[str, Any], config: StackConfig | None, topology: str
) -> Iterator[ManifestProblem]:
    lo, now, hi = (_int(group.get(k)) for k in ("minReplicas", "replicas", "maxReplicas"))
    if lo is not None and hi is not None and lo > hi:
        yield ManifestProblem(name, f"{at}.minReplicas", f"minReplicas {lo} > maxReplicas {hi}")
    if now is not None and hi is not None and now > hi:
        yield ManifestProblem(name, f"{at}.replicas", f"replicas {now} > maxReplicas {hi}")
    if config is None:
        return
    pools = {p.name: p for p in config.tpu_pools}
    pool = pools.get(str(group.get("groupName")))
    if pool is None:
        yield ManifestProblem(
            name,
            f"{at}.groupName",
            f"{group.get('groupName')!r} names no TPU pool of park:tpuPools "
            f"({', '.join(pools) or 'none'}); the group's replicas are that pool's slices",
        )
        return
    if pool.topology != topology:
        yield ManifestProblem(
            name,
            f"{at}.template.spec.nodeSelector",
            f"topology {topology} but pool {pool.name} has {pool.topology} slices",
        )
    if hi is not None and hi > pool.slices:
        yield ManifestProblem(
            name,
            f"{at}.maxReplicas",
            f"maxReplicas {hi} but pool {pool.name} has {pool.slices} slice(s)",
        )


def _flags(entrypoint: str) -> tuple[list[str], dict[str, str]]:
    """The words before the first flag, and each ``--flag value`` pair."""
    words = shlex.split(entrypoint)
    head: list[str] = []
    while words and not words[0].startswith("--"):
        head.append(words.pop(0))
    flags: dict[str, str] = {}
    while words:
        flag = words.pop(0)
        flags[flag] = words.pop(0) if words and not words[0].startswith("--") else "true"
    return head, flags


def _check_rayjob(
    manifest: dict[str, Any], groups: list[Any], base: str
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
        head, flags = _flags(entrypoint)
    except ValueError as err:
        yield ManifestProblem(name, "spec.entrypoint", f"not a shell command line: {err}")
        return
    if head[-2:] != ["-m", TRAIN_MODULE]:
        return  # not our training entrypoint: nothing more to compare
    tpu_groups = [
        (i, g)
        for i, g in enumerate(groups)
        if isinstance(g, dict) and _get(g, "template", "spec", "nodeSelector", _ACCELERATOR)
    ]
    if flags.get("--accelerator") != "tpu" or len(tpu_groups) != 1:
        return
    i, group = tpu_groups[0]
    topology, chips, per_pod = _tpu_slice(group)
    if chips is None:
        return
    slices = _int(group.get("replicas", 1)) or 1
    expected = {
        "--num-workers": str(chips * slices),
        "--tpu-topology": topology,
        "--chips-per-host": str(per_pod) if per_pod else None,
        "--num-slices": str(slices),
    }
    for flag, want in expected.items():
        have = flags.get(flag)
        if want is not None and have is not None and have != want:
            yield ManifestProblem(
                name,
                "spec.entrypoint",
                f"{flag} {have} but {base}.workerGroupSpecs[{i}] gives {want} "
                f"({slices} x {topology} slice(s), one worker per chip)",
            )


def _check_rayservice(
    manifest: dict[str, Any], groups: list[Any], base: str
) -> Iterator[ManifestProblem]:
    """Each TPU LLM must fit the worker group's slice; multi-host needs the Ray backend."""
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
    slices = {}
    for g in groups:
        if isinstance(g, dict) and _get(g, "template", "spec", "nodeSelector", _ACCELERATOR):
            topology, chips, per_pod = _tpu_slice(g)
            if topology and chips and per_pod:
                slices[topology] = (chips, per_pod)
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
            chips, per_host = slices[topology]
            tp = _int(_get(llm, "engine_kwargs", "tensor_parallel_size")) or 1
            if chips % tp or (tp > per_host and tp % per_host):
                yield ManifestProblem(
                    name,
                    f"{at}.engine_kwargs.tensor_parallel_size",
                    f"{tp} does not fit a {topology} slice ({chips} chips, {per_host} per host)",
                )
            env = _get(llm, "runtime_env", "env_vars") or {}
            if chips > per_host and tp > per_host and env.get("TPU_MULTIHOST_BACKEND") != "ray":
                yield ManifestProblem(
                    name,
                    f"{at}.runtime_env.env_vars",
                    "TP across hosts needs TPU_MULTIHOST_BACKEND=ray, else vLLM silently runs "
                    "on one host",
                )


def check_manifests(
    manifests: list[dict[str, Any]], config: StackConfig | None = None
) -> list[ManifestProblem]:
    """Every plan problem in these manifests; `config` adds the checks against the stack's pools."""
    problems: list[ManifestProblem] = []
    for manifest in manifests:
        kind = manifest.get("kind")
        if kind not in ("RayJob", "RayService", "RayCluster"):
            continue
        name = _name(manifest)
        base, groups = _worker_groups(manifest)
        for i, group in enumerate(groups):
            if _get(group, "template", "spec", "nodeSelector", _ACCELERATOR):
                problems += _check_tpu_group(name, f"{base}.workerGroupSpecs[{i}]", group, config)
        if kind == "RayJob":
            problems += _check_rayjob(manifest, groups, base)
        elif kind == "RayService":
            problems += _check_rayservice(manifest, groups, base)
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
    import sys

    if not serve_check_available():
        return [], "the workloads package is not installed (pip install -e '.[serve]')"
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SERVE_CHECK],
            input=serve_config_v2,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
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
