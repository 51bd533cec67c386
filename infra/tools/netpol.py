"""NetworkPolicy semantics, offline: would this connection reach that pod?

Kubernetes' rules (networking.k8s.io/v1, "Network Policies" in the Kubernetes docs):
- a pod is isolated for ingress once any policy of its namespace selects it with policyType
  Ingress (policyTypes defaults to ["Ingress"], plus "Egress" when egress rules exist);
- an isolated pod accepts a connection when any rule of any selecting policy allows it: the
  port matches (no ports: every port; a named port resolves through the pod's container
  ports; protocol defaults to TCP; endPort makes a range) and a peer matches (no `from`: every
  source). A peer with podSelector alone means pods of the policy's namespace; with
  namespaceSelector alone, every pod of the selected namespaces; both in one peer, pods that
  match both; ipBlock, sources whose address is in the CIDR and not in an `except`;
- selectors: matchLabels AND matchExpressions (In, NotIn, Exists, DoesNotExist); `{}` is all.
Namespaces carry `kubernetes.io/metadata.name: <name>`. Policies are additive; none denies.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from infra.names import NAMESPACE_NAME_LABEL


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str]
    ports: Mapping[str, int] = field(default_factory=dict)  # container port name → number


@dataclass(frozen=True)
class Peer:
    """The source of a connection: a pod, or an address outside the cluster."""

    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    ip: str | None = None

    def all_namespace_labels(self) -> dict[str, str]:
        if self.namespace is None:
            return {}
        return {**self.namespace_labels, NAMESPACE_NAME_LABEL: self.namespace}


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions) against a set of labels."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = set(expression.get("values") or [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in ("In", "NotIn", "Exists", "DoesNotExist"):
            raise ValueError(f"unknown selector operator {operator!r}")
    return True


def _peer_matches(peer: Mapping[str, Any], source: Peer, policy_namespace: str) -> bool:
    if "ipBlock" in peer:
        if source.ip is None:
            return False  # pods are selected by labels; ipBlock is for traffic from outside
        block = peer["ipBlock"]
        address = ipaddress.ip_address(source.ip)
        if address not in ipaddress.ip_network(block["cidr"]):
            return False
        return not any(address in ipaddress.ip_network(c) for c in block.get("except") or [])
    if source.namespace is None:
        return False  # pod and namespace selectors only ever match pods
    pod_selector, ns_selector = peer.get("podSelector"), peer.get("namespaceSelector")
    if ns_selector is None:
        in_namespace = source.namespace == policy_namespace
    else:
        in_namespace = selects(ns_selector, source.all_namespace_labels())
    return in_namespace and (pod_selector is None or selects(pod_selector, source.labels))


def _port_matches(rule_ports: Sequence[Mapping[str, Any]] | None, pod: Pod, port: int) -> bool:
    if not rule_ports:
        return True
    for entry in rule_ports:
        if entry.get("protocol", "TCP") != "TCP":
            continue
        wanted = entry.get("port")
        if wanted is None:
            return True
        number = pod.ports.get(wanted) if isinstance(wanted, str) else int(wanted)
        if number is None:
            continue
        end = int(entry.get("endPort", number))
        if number <= port <= end:
            return True
    return False


def _policy_types(spec: Mapping[str, Any]) -> list[str]:
    types = spec.get("policyTypes")
    if types:
        return list(types)
    return ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]


def allowed(
    policies: Sequence[Mapping[str, Any]], source: Peer, pod: Pod, port: int
) -> tuple[bool, str]:
    """(allowed, why) for a TCP connection from `source` to `pod` on `port`."""
    selecting = [
        p
        for p in policies
        if p.get("kind") == "NetworkPolicy"
        and (p.get("metadata") or {}).get("namespace") == pod.namespace
        and "Ingress" in _policy_types(p.get("spec") or {})
        and selects((p.get("spec") or {}).get("podSelector"), pod.labels)
    ]
    if not selecting:
        return True, "no policy selects the pod (not isolated)"
    for policy in selecting:
        name = policy["metadata"]["name"]
        for i, rule in enumerate((policy.get("spec") or {}).get("ingress") or []):
            if not _port_matches(rule.get("ports"), pod, port):
                continue
            peers = rule.get("from")
            if not peers or any(_peer_matches(p, source, pod.namespace) for p in peers):
                return True, f"{name}: ingress[{i}]"
    names = ", ".join(p["metadata"]["name"] for p in selecting)
    return False, f"isolated by {names}; no rule allows it"


# ---- the stack's flows against its rendered policies ----------------------------------------


def _pods_of(manifests: Sequence[Mapping[str, Any]]) -> dict[str, list[Pod]]:
    """Head and worker pods KubeRay will create, with their labels and named ports."""
    from infra.tools.manifests.pods import derived_pods

    pods: dict[str, list[Pod]] = {"head": [], "worker": []}
    for manifest in manifests:
        for doc in derived_pods(manifest):
            labels = doc["metadata"].get("labels") or {}
            role = labels.get("ray.io/node-type")
            if role not in pods:
                continue
            ports = {
                p["name"]: int(p["containerPort"])
                for c in doc["spec"].get("containers") or []
                for p in c.get("ports") or []
                if "name" in p
            }
            pods[role].append(Pod(doc["metadata"]["namespace"], labels, ports))
    return pods


def flow_problems(manifests: Sequence[Mapping[str, Any]], plan: Any) -> list[str]:
    """Each flow of infra/plan/network_policy.flows that the rendered policies get wrong."""
    from infra.names import KUBERAY_NAMESPACE
    from infra.plan.network_policy import exposure, flows

    policies = [m for m in manifests if m.get("kind") == "NetworkPolicy"]
    pods = _pods_of(manifests)
    pods["webhook"] = [Pod(KUBERAY_NAMESPACE, {"app": "kuberay-tpu-webhook"}, {"https": 443})]
    problems = []
    for flow in flows(exposure(plan)):
        src = flow.source
        peer = Peer(src.namespace, src.labels, ip=src.ip)
        for pod in pods[flow.role]:
            ok, why = allowed(policies, peer, pod, flow.port)
            if ok != flow.allowed:
                verb = "refused" if flow.allowed else "allowed"
                need = "needs it" if flow.allowed else "must stay closed"
                where = pod.labels.get("park-gke/workload", pod.namespace)
                problems.append(
                    f"{flow.name} (port {flow.port}, {where} {flow.role}): {verb} ({why}); "
                    f"Ray on GKE {need}"
                )
    return problems
