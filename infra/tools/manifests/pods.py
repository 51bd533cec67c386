"""The pods KubeRay will create, read out of RayJob / RayService / RayCluster manifests.

Scanners such as checkov skip custom resources, and policies must look at every container
wherever it hides in a Ray spec. Both ask this module, so "which pod templates does this
manifest hold" is answered once. Works on plain dicts and on Pulumi's read-only mappings.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from infra.names import RAY_GROUP_LABEL, RAY_NODE_LABEL, RAY_NODE_TYPE_LABEL
from infra.plan.ray.pods import RAY_KINDS as RAY_KINDS


@dataclass(frozen=True)
class PodTemplate:
    """One pod template inside a Ray custom resource."""

    role: Literal["head", "worker", "submitter", "workload"]
    group: str  # worker group name; "head" / "submitter" otherwise
    path: str  # where it sits in the spec, for messages
    template: Mapping[str, Any]
    group_spec: Mapping[str, Any]  # the head / worker group spec (empty for the submitter)


def cluster_spec(kind: str, spec: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """(path, body) of the RayCluster spec inside a RayJob, RayService or RayCluster spec."""
    if kind == "RayJob":
        return "spec.rayClusterSpec", spec.get("rayClusterSpec") or {}
    if kind == "RayService":
        return "spec.rayClusterConfig", spec.get("rayClusterConfig") or {}
    return "spec", spec


def pod_templates(kind: str, spec: Mapping[str, Any] | None) -> Iterator[PodTemplate]:
    """Head, every worker group and (RayJob) the submitter, in that order."""
    if kind not in RAY_KINDS or not isinstance(spec, Mapping):
        return
    prefix, cluster = cluster_spec(kind, spec)
    head = cluster.get("headGroupSpec")
    if isinstance(head, Mapping) and isinstance(head.get("template"), Mapping):
        yield PodTemplate(
            "head", "head", f"{prefix}.headGroupSpec.template", head["template"], head
        )
    workers = cluster.get("workerGroupSpecs")
    if isinstance(workers, Sequence) and not isinstance(workers, str):
        for i, group in enumerate(workers):
            if isinstance(group, Mapping) and isinstance(group.get("template"), Mapping):
                yield PodTemplate(
                    "worker",
                    str(group.get("groupName", i)),
                    f"{prefix}.workerGroupSpecs[{i}].template",
                    group["template"],
                    group,
                )
    submitter = spec.get("submitterPodTemplate") if kind == "RayJob" else None
    if isinstance(submitter, Mapping):
        yield PodTemplate("submitter", "submitter", "spec.submitterPodTemplate", submitter, {})


# Core kinds and where their pod template sits (a bare Pod is its own template).
_CORE_TEMPLATE_PATHS = {
    "Deployment": ("template",),
    "StatefulSet": ("template",),
    "DaemonSet": ("template",),
    "ReplicaSet": ("template",),
    "Job": ("template",),
    "CronJob": ("jobTemplate", "spec", "template"),
}


def workload_pod_templates(kind: str, body: Mapping[str, Any]) -> Iterator[PodTemplate]:
    """Pod templates of any workload manifest: Ray's kinds as above, core kinds (Pod,
    Deployment, Job, ...) as their single template; nothing for other kinds."""
    spec = body.get("spec")
    if kind in RAY_KINDS:
        yield from pod_templates(kind, spec)
        return
    if not isinstance(spec, Mapping):
        return
    if kind == "Pod":
        template = {"metadata": body.get("metadata") or {}, "spec": spec}
        yield PodTemplate("workload", kind, "spec", template, {})
        return
    path = _CORE_TEMPLATE_PATHS.get(kind)
    node: Any = spec
    for part in path or ():
        node = node.get(part) if isinstance(node, Mapping) else None
    if path and isinstance(node, Mapping):
        yield PodTemplate("workload", kind, "spec." + ".".join(path), node, {})


def containers(template: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Init containers and containers of a pod template."""
    pod_spec = template.get("spec") or {}
    out: list[Mapping[str, Any]] = []
    for key in ("initContainers", "containers"):
        items = pod_spec.get(key) or []
        out += [c for c in items if isinstance(c, Mapping)]
    return out


def _true(value: Any) -> bool:
    """True for True and "true" (a manifest edited by hand may quote it)."""
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def hardening_problems(template: Mapping[str, Any]) -> Iterator[str]:
    """What one pod template lacks or holds that a Ray or workload pod must not: each
    container's CPU and memory requests and limits, privileged, privilege escalation, non-root
    (pod or container level), and a hostPath volume (the node's files in the pod). One judge
    for the policy pack (policy/security.py pod_hardening) and `park validate --manifests`."""
    pod_spec = template.get("spec") or {}
    pod_non_root = _true((pod_spec.get("securityContext") or {}).get("runAsNonRoot"))
    for container in containers(template):
        where = f"container {container.get('name')}"
        resources = container.get("resources") or {}
        missing = [
            f"{side}.{what}"
            for side in ("requests", "limits")
            for what in ("cpu", "memory")
            if (resources.get(side) or {}).get(what) in (None, "")
        ]
        if missing:
            yield f"{where}: set resources {', '.join(missing)}"
        context = container.get("securityContext") or {}
        if _true(context.get("privileged")):
            yield f"{where}: privileged containers are not allowed"
        if context.get("allowPrivilegeEscalation") is not False:
            yield f"{where}: set securityContext.allowPrivilegeEscalation false"
        if not (pod_non_root or _true(context.get("runAsNonRoot"))):
            yield f"{where}: set runAsNonRoot true (pod or container)"
    for i, volume in enumerate(pod_spec.get("volumes") or []):
        if isinstance(volume, Mapping) and volume.get("hostPath") is not None:
            yield (
                f"volumes[{i}] ({volume.get('name')}): hostPath volumes are not allowed (the "
                "node's own files in the pod); use the bucket's mount or an emptyDir"
            )


def _plain(value: Any) -> Any:
    """A deep, mutable copy made of dicts and lists (Pulumi hands out read-only mappings)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_plain(v) for v in value]
    return value


def derived_pods(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Pod documents for each template of a Ray manifest, named `<cr>-<role>[-<group>]`.

    What our manifest declares, plus only the labels KubeRay puts on head and worker pods (so
    a scanner can tell which NetworkPolicy covers them). Nothing else KubeRay adds at run time
    (the `ray start` command, probes, its env) is invented here: a finding is about our spec.
    """
    kind = str(manifest.get("kind", ""))
    metadata = manifest.get("metadata") or {}
    name = str(metadata.get("name", kind.lower()))
    pods = []
    for ref in pod_templates(kind, manifest.get("spec")):
        template_meta = _plain(ref.template.get("metadata") or {})
        suffix = ref.role if ref.role != "worker" else f"worker-{ref.group}"
        pod_meta: dict[str, Any] = {
            **template_meta,
            "name": f"{name}-{suffix}",
            "namespace": metadata.get("namespace", "default"),
        }
        if ref.role in ("head", "worker"):
            pod_meta["labels"] = {
                **(template_meta.get("labels") or {}),
                RAY_NODE_LABEL: "yes",
                RAY_NODE_TYPE_LABEL: ref.role,
                RAY_GROUP_LABEL: "headgroup" if ref.role == "head" else ref.group,
            }
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": pod_meta,
                "spec": _plain(ref.template.get("spec") or {}),
            }
        )
    return pods
