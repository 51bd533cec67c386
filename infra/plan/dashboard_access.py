"""The Ray dashboard behind IAP (opt-in): ClusterIP only unless a stack sets
park:observability.exposeDashboard; then the RayService's dashboard is served through a GKE
Gateway with IAP in front (GCPBackendPolicy), and only `iapMembers` get in."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from infra.names import (
    DASHBOARD_NAME,
    DASHBOARD_PORT,
    EXPOSE_DASHBOARD_ANNOTATION,
    PART_OF,
    RAY_NODE_TYPE_LABEL,
    SERVICE_NAME,
    WORKLOAD_LABEL,
)
from infra.resolve import StackPlan

GATEWAY_API = "gateway.networking.k8s.io/v1"
GKE_NETWORKING_API = "networking.gke.io/v1"
# A global external Application Load Balancer: the one IAP and Google-managed certificates serve.
GATEWAY_CLASS = "gke-l7-global-external-managed"
PRE_SHARED_CERT_OPTION = "networking.gke.io/pre-shared-certs"
IAP_ROLE = "roles/iap.httpsResourceAccessor"


@dataclass(frozen=True)
class DashboardAccess:
    """Everything the IAP opt-in declares: cloud names, IAM members and the manifests, with
    where they go (the project, the stack its objects are claimed for, the namespace) and the
    name of the Secret holding the OAuth client's secret."""

    project: str
    stack: str
    namespace: str
    oauth_secret: str
    address_name: str  # global static IP, for the DNS record of `domain`
    certificate_name: str  # Google-managed certificate for `domain`
    domain: str
    iap_members: tuple[str, ...]
    # The grant is project-wide (GKE names the backend service), so it is conditioned on this
    # stack's host name: two stacks granting one group are then two bindings, and a destroy of
    # one does not revoke the other's (IAM conditions on IAP: request.host).
    iap_condition: dict[str, str]
    manifests: tuple[dict[str, Any], ...]


def _exposed(name: str, namespace: str) -> dict[str, Any]:
    """Metadata of an object that opens the dashboard: the annotation the policy pack wants."""
    return {
        "name": name,
        "namespace": namespace,
        "labels": PART_OF,
        "annotations": {EXPOSE_DASHBOARD_ANNOTATION: "true"},
    }


def dashboard_access(plan: StackPlan, service: str = SERVICE_NAME) -> DashboardAccess | None:
    """None unless park:observability.exposeDashboard (config validation made sure IAP has
    members, a domain and an OAuth client). The Service selects the head of the RayService
    `service` by the workload label its pods carry: KubeRay's own head Service is headless and
    named after a random cluster."""
    obs = plan.spec.observability
    if not obs.expose_dashboard:
        return None
    if not (obs.dashboard_domain and obs.iap_oauth_client_id and obs.iap_oauth_secret):
        raise ValueError("exposeDashboard without its IAP settings: validate the config first")
    base, namespace = plan.names.dashboard, plan.names.namespace
    head = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _exposed(DASHBOARD_NAME, namespace),
        "spec": {
            "type": "ClusterIP",
            "selector": {RAY_NODE_TYPE_LABEL: "head", WORKLOAD_LABEL: service},
            "ports": [
                {
                    "name": "dashboard",
                    "protocol": "TCP",
                    "port": DASHBOARD_PORT,
                    "targetPort": "dashboard",
                }
            ],
        },
    }
    gateway = {
        "apiVersion": GATEWAY_API,
        "kind": "Gateway",
        "metadata": _exposed(DASHBOARD_NAME, namespace),
        "spec": {
            "gatewayClassName": GATEWAY_CLASS,
            "addresses": [{"type": "NamedAddress", "value": base}],
            "listeners": [
                {
                    "name": "https",
                    "protocol": "HTTPS",
                    "port": 443,
                    "hostname": obs.dashboard_domain,
                    "tls": {"mode": "Terminate", "options": {PRE_SHARED_CERT_OPTION: base}},
                    "allowedRoutes": {"namespaces": {"from": "Same"}},
                }
            ],
        },
    }
    route = {
        "apiVersion": GATEWAY_API,
        "kind": "HTTPRoute",
        "metadata": _exposed(DASHBOARD_NAME, namespace),
        "spec": {
            "parentRefs": [{"name": DASHBOARD_NAME, "sectionName": "https"}],
            "hostnames": [obs.dashboard_domain],
            "rules": [{"backendRefs": [{"name": DASHBOARD_NAME, "port": DASHBOARD_PORT}]}],
        },
    }
    policy = {
        "apiVersion": GKE_NETWORKING_API,
        "kind": "GCPBackendPolicy",
        "metadata": {"name": DASHBOARD_NAME, "namespace": namespace, "labels": PART_OF},
        "spec": {
            "default": {
                "iap": {
                    "enabled": True,
                    "clientID": obs.iap_oauth_client_id,
                    "oauth2ClientSecret": {"name": obs.iap_oauth_secret},
                }
            },
            "targetRef": {"group": "", "kind": "Service", "name": DASHBOARD_NAME},
        },
    }
    return DashboardAccess(
        project=plan.spec.project,
        stack=plan.stack,
        namespace=namespace,
        oauth_secret=obs.iap_oauth_secret,
        address_name=base,
        certificate_name=base,
        domain=obs.dashboard_domain,
        iap_members=tuple(obs.iap_members),
        iap_condition={
            "title": f"{base} only",
            "description": f"IAP access to the Ray dashboard of stack {plan.stack}",
            # Built as a CEL string literal (JSON's escapes are CEL's), never pasted: the
            # domain is also checked as a DNS name (infra/rules/values.py).
            "expression": f"request.host == {json.dumps(obs.dashboard_domain)}",
        },
        manifests=(head, policy, gateway, route),
    )
