"""What a TPU worker group of a Ray manifest must be: the one set of rules.

A Ray worker group on TPU is one pod per host of one slice per replica: `google.com/tpu` per
pod = the chips of a host (requests = limits), `numOfHosts` = the hosts of (machine type,
topology), node selectors on the accelerator and topology labels, and a toleration of the TPU
taint. KubeRay's TPU webhook rejects a group whose numOfHosts x chips ≠ the topology's chips.

`park validate` (infra/tools/checks.py) and the policy pack (policy/kuberay.py) both call
:func:`group_problems`; each problem names the field inside the group spec, so either side can
say where it is. Works on plain dicts and on Pulumi's read-only mappings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from infra import catalog
from infra.tools.manifests.pods import containers

Kind = Literal["shape", "toleration", "replicas"]


@dataclass(frozen=True)
class GroupProblem:
    kind: Kind  # shape: the slice geometry; toleration: the taint; replicas: min/max
    path: str  # inside the worker group spec, e.g. "numOfHosts"
    message: str


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(str(value))
    except (TypeError, ValueError):
        return None
    return int(number) if number.is_integer() else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def tpu_chips(container: Mapping[str, Any]) -> tuple[int, int]:
    """(requests, limits) of google.com/tpu; a missing side counts as the other (Kubernetes
    defaults requests to limits for extended resources)."""
    resources = _mapping(container.get("resources"))
    requests = _int(_mapping(resources.get("requests")).get(catalog.TPU_RESOURCE))
    limits = _int(_mapping(resources.get("limits")).get(catalog.TPU_RESOURCE))
    requests = requests if requests is not None else limits
    limits = limits if limits is not None else requests
    return requests or 0, limits or 0


def template_chips(template: Mapping[str, Any]) -> int:
    """TPU chips a pod of this template asks for (the largest container request)."""
    return max((max(tpu_chips(c)) for c in containers(template)), default=0)


def devices_per_chip(group: Mapping[str, Any]) -> int:
    """Ray's `TPU` units per chip the group's pods advertise: rayStartParams.resources' TPU
    over the pod's google.com/tpu (KubeRay's default when resources names no TPU: 1)."""
    chips = template_chips(_mapping(group.get("template")))
    raw = _mapping(group.get("rayStartParams")).get("resources")
    try:
        declared = json.loads(json.loads(raw)) if isinstance(raw, str) else {}
    except (ValueError, TypeError):
        return 1
    tpu = _int(_mapping(declared).get("TPU"))
    return tpu // chips if tpu and chips and tpu % chips == 0 else 1


def tolerates_tpu(tolerations: Any) -> bool:
    """Whether these tolerations let a pod onto TPU nodes (google.com/tpu=present:NoSchedule)."""
    items = tolerations if isinstance(tolerations, Sequence) else ()
    for toleration in items:
        t = _mapping(toleration)
        if t.get("effect") not in (None, "", catalog.TPU_TAINT_EFFECT):
            continue
        operator = t.get("operator", "Equal")
        key = t.get("key")
        if operator == "Exists" and key in (None, "", catalog.TPU_TAINT_KEY):
            return True
        if key == catalog.TPU_TAINT_KEY and t.get("value") == catalog.TPU_TAINT_VALUE:
            return True
    return False


def is_tpu_group(group: Mapping[str, Any]) -> bool:
    """A worker group that asks for TPU chips or selects a TPU accelerator."""
    template = _mapping(group.get("template"))
    selector = _mapping(_mapping(template.get("spec")).get("nodeSelector"))
    return bool(template_chips(template)) or catalog.ACCELERATOR_LABEL in selector


def group_slice(group: Mapping[str, Any]) -> tuple[str | None, int | None]:
    """(topology label, chips of that topology) the group selects, when it parses."""
    template = _mapping(group.get("template"))
    selector = _mapping(_mapping(template.get("spec")).get("nodeSelector"))
    topology = selector.get(catalog.TOPOLOGY_LABEL)
    if not topology:
        return None, None
    try:
        dims = catalog.topology_dims(str(topology))
    except catalog.CatalogError:
        return str(topology), None
    chips = 1
    for d in dims:
        chips *= d
    return str(topology), chips


def _slices_for(accelerator: str, topology: str) -> list[catalog.TpuSlice]:
    return [
        catalog.lookup(m.name, topology)
        for m in catalog.MACHINE_TYPES.values()
        if topology in m.topologies
        and catalog.GENERATIONS[m.generation].gke_accelerator == accelerator
    ]


def group_problems(group: Mapping[str, Any]) -> list[GroupProblem]:
    """Every problem of one TPU worker group (empty for a sound group or a non-TPU one)."""
    if not is_tpu_group(group):
        return []
    template = _mapping(group.get("template"))
    pod_spec = _mapping(template.get("spec"))
    problems: list[GroupProblem] = []
    for i, container in enumerate(containers(template)):
        requests, limits = tpu_chips(container)
        if limits and requests != limits:
            problems.append(
                GroupProblem(
                    "shape",
                    f"template.spec.containers[{i}].resources.requests",
                    f"container {container.get('name')}: {catalog.TPU_RESOURCE} requests "
                    f"({requests}) must equal limits ({limits})",
                )
            )
    if not tolerates_tpu(pod_spec.get("tolerations")):
        problems.append(
            GroupProblem(
                "toleration",
                "template.spec.tolerations",
                f"no toleration for the {catalog.TPU_TAINT_KEY}={catalog.TPU_TAINT_VALUE}:"
                f"{catalog.TPU_TAINT_EFFECT} taint: the pods never schedule; add one with "
                "operator Exists",
            )
        )
    problems += _replica_problems(group)
    problems += _shape_problems(group, template, pod_spec)
    return problems


def _shape_problems(
    group: Mapping[str, Any], template: Mapping[str, Any], pod_spec: Mapping[str, Any]
) -> list[GroupProblem]:
    selector = _mapping(pod_spec.get("nodeSelector"))
    accelerator = selector.get(catalog.ACCELERATOR_LABEL)
    topology = selector.get(catalog.TOPOLOGY_LABEL)
    at_selector = "template.spec.nodeSelector"
    if not accelerator or not topology:
        return [
            GroupProblem(
                "shape",
                at_selector,
                f"requests TPUs but nodeSelector lacks {catalog.ACCELERATOR_LABEL} and/or "
                f"{catalog.TOPOLOGY_LABEL}; its pods could land on any slice",
            )
        ]
    known = {g.gke_accelerator for g in catalog.GENERATIONS.values()}
    if accelerator not in known:
        return [
            GroupProblem(
                "shape",
                at_selector,
                f"{catalog.ACCELERATOR_LABEL} {accelerator!r} is not a known TPU; "
                f"allowed: {', '.join(sorted(known))}",
            )
        ]
    offered = _slices_for(str(accelerator), str(topology))
    if not offered:
        return [
            GroupProblem(
                "shape",
                at_selector,
                f"no {accelerator} machine type offers topology {topology} (e.g. 2x4, 4x4)",
            )
        ]
    chips = template_chips(template)
    at_limits = "template.spec.containers[0].resources.limits"
    if not chips:
        return [GroupProblem("shape", at_limits, f"no {catalog.TPU_RESOURCE} limit")]
    fitting = [s for s in offered if s.chips_per_host == chips]
    if not fitting:
        per_host = sorted({s.chips_per_host for s in offered})
        return [
            GroupProblem(
                "shape",
                at_limits,
                f"{catalog.TPU_RESOURCE} {chips} per pod does not fit topology {topology}: a "
                f"host has {' or '.join(map(str, per_host))} chips (one pod per host takes all)",
            )
        ]
    hosts = _int(group.get("numOfHosts", 1))
    if hosts not in {s.hosts for s in fitting}:
        expected = " or ".join(sorted({str(s.hosts) for s in fitting}))
        given = group.get("numOfHosts", 1) if hosts is None else hosts
        return [
            GroupProblem(
                "shape",
                "numOfHosts",
                f"numOfHosts is {given}; topology {topology} with {chips} "
                f"chips per host is {expected} host(s) (the TPU webhook rejects this group)",
            )
        ]
    return []


def _replica_problems(group: Mapping[str, Any]) -> list[GroupProblem]:
    lo, now, hi = (_int(group.get(k)) for k in ("minReplicas", "replicas", "maxReplicas"))
    problems = []
    if lo is not None and hi is not None and lo > hi:
        problems.append(
            GroupProblem("replicas", "minReplicas", f"minReplicas {lo} > maxReplicas {hi}")
        )
    if now is not None and hi is not None and now > hi:
        problems.append(GroupProblem("replicas", "replicas", f"replicas {now} > maxReplicas {hi}"))
    return problems
