"""What people see of a run: Ray metrics in Managed Prometheus, training metrics from the logs,
an optional Grafana dashboard, and the Ray dashboard (private unless a stack opts in to IAP).

- Ray exports its metrics (core, Train, Serve, vLLM through Serve LLM, and the TPU chips' when
  TPU_DEVICE_PLUGIN_ADDR is set) on each pod's `metrics` port; PodMonitorings have Managed
  Prometheus scrape the head and the workers.
- The training loop prints `PARK_METRICS {json}` (workloads/train); log-based metrics turn loss
  and tokens/s into Cloud Monitoring series, queryable with PromQL like the rest.
- The dashboard: ClusterIP only, reached with `kubectl port-forward`. With
  `park:observability.exposeDashboard` the RayService's dashboard is served through a GKE Gateway
  with IAP in front (GCPBackendPolicy); only `iapMembers` get in.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from infra.names import (
    DASHBOARD_NAME,
    DASHBOARD_PORT,
    EXPOSE_DASHBOARD_ANNOTATION,
    GRAFANA_CONFIGMAP,
    METRICS_PORT_NAME,
    PART_OF,
    RAY_CLUSTER_LABEL,
    RAY_GROUP_LABEL,
    RAY_NODE_LABEL,
    RAY_NODE_TYPE_LABEL,
    SERVICE_NAME,
    TRAINING_JOB_NAME,
    WORKLOAD_LABEL,
)
from infra.resolve import StackPlan
from workloads.protocol import METRICS

GMP_API = "monitoring.googleapis.com/v1"
GATEWAY_API = "gateway.networking.k8s.io/v1"
GKE_NETWORKING_API = "networking.gke.io/v1"
# Ray's TPU chip series; dropped at scrape time when park:observability.tpuMetrics is false.
TPU_METRICS_REGEX = "ray_tpu_.*"
# A global external Application Load Balancer: the one IAP and Google-managed certificates serve.
GATEWAY_CLASS = "gke-l7-global-external-managed"
PRE_SHARED_CERT_OPTION = "networking.gke.io/pre-shared-certs"
IAP_ROLE = "roles/iap.httpsResourceAccessor"
GRAFANA_LABEL = "grafana_dashboard"  # what Grafana's dashboard sidecar watches for
QUANTILES = (0.5, 0.95, 0.99)  # serve latency percentiles on the dashboard


# ---------------------------------------------------------------------------------------------
# Managed Prometheus


def pod_monitoring(plan: StackPlan, node_type: str) -> dict[str, Any]:
    """Scrape Ray's `metrics` port on the head or worker pods of every Ray cluster in the
    namespace; series carry the workload (park-train / park-serve), the cluster and the group."""
    obs = plan.spec.observability
    endpoint: dict[str, Any] = {"port": METRICS_PORT_NAME, "interval": obs.scrape_interval}
    if not obs.tpu_metrics:
        endpoint["metricRelabeling"] = [
            {"sourceLabels": ["__name__"], "regex": TPU_METRICS_REGEX, "action": "drop"}
        ]
    return {
        "apiVersion": GMP_API,
        "kind": "PodMonitoring",
        "metadata": {
            "name": f"ray-{node_type}",
            "namespace": plan.names.namespace,
            "labels": PART_OF,
        },
        "spec": {
            "selector": {"matchLabels": {RAY_NODE_LABEL: "yes", RAY_NODE_TYPE_LABEL: node_type}},
            "endpoints": [endpoint],
            "targetLabels": {
                "fromPod": [
                    {"from": WORKLOAD_LABEL, "to": "workload"},
                    {"from": RAY_CLUSTER_LABEL, "to": "ray_cluster"},
                    {"from": RAY_GROUP_LABEL, "to": "ray_group"},
                ]
            },
        },
    }


def pod_monitorings(plan: StackPlan) -> list[dict[str, Any]]:
    if not plan.spec.observability.pod_monitoring:
        return []
    return [pod_monitoring(plan, "head"), pod_monitoring(plan, "worker")]


# ---------------------------------------------------------------------------------------------
# Training metrics from the logs


@dataclass(frozen=True)
class LogMetricPlan:
    """A log-based distribution metric (pulumi-gcp `logging.Metric` arguments)."""

    name: str  # Cloud Monitoring: logging.googleapis.com/user/<name>
    field: str  # the key of the PARK_METRICS JSON it extracts
    description: str
    unit: str
    growth_factor: float
    scale: float

    @property
    def promql(self) -> str:
        """The metric's name in PromQL (Cloud Monitoring's mapping of logging.googleapis.com)."""
        return f"logging_googleapis_com:user_{self.name}"


def training_log_filter(plan: StackPlan) -> str:
    """The log lines of this stack's training runs that carry metrics."""
    return "\n".join(
        (
            'resource.type="k8s_container"',
            f'resource.labels.cluster_name="{plan.names.cluster}"',
            f'resource.labels.namespace_name="{plan.names.namespace}"',
            f'textPayload:"{METRICS}"',
        )
    )


def value_extractor(field: str) -> str:
    """The number after `"<field>": ` in the JSON the loop prints (json.dumps' separators)."""
    return f'REGEXP_EXTRACT(textPayload, "\\"{field}\\": ([-+0-9.eE]+)")'


def training_log_metrics(plan: StackPlan) -> list[LogMetricPlan]:
    spec = plan.spec
    if not (spec.training.enabled and spec.observability.training_metrics):
        return []
    prefix, stack = plan.names.log_metric_prefix, spec.stack
    return [
        LogMetricPlan(
            name=f"{prefix}_loss",
            field="loss",
            description=f"Training loss of {TRAINING_JOB_NAME} (stack {stack})",
            unit="1",
            growth_factor=1.1,
            scale=0.01,
        ),
        LogMetricPlan(
            name=f"{prefix}_tokens_per_s",
            field="tokens_per_s",
            description=f"Training throughput in tokens/s of {TRAINING_JOB_NAME} (stack {stack})",
            unit="1/s",
            growth_factor=1.25,
            scale=100.0,
        ),
    ]


# ---------------------------------------------------------------------------------------------
# Grafana


def _panel(title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def grafana_dashboard(plan: StackPlan) -> dict[str, Any]:
    """One dashboard for what the README asks about: a run's loss, tokens/s and TPU use, and the
    serving endpoint's request rate, latency, errors and generated tokens/s."""
    ns = f'namespace="{plan.names.namespace}"'
    train = f'{ns},workload="{TRAINING_JOB_NAME}"'
    serve = f'{ns},workload="{SERVICE_NAME}"'
    latency = f"sum by (le) (rate(ray_serve_http_request_latency_ms_bucket{{{serve}}}[5m]))"
    panels: list[tuple[str, str, list[tuple[str, str]]]] = []
    for metric in training_log_metrics(plan):
        mean = f"sum(rate({metric.promql}_sum[5m])) / sum(rate({metric.promql}_count[5m]))"
        unit = "none" if metric.field == "loss" else "short"
        panels.append((f"Training {metric.field.replace('_per_s', '/s')}", unit, [(mean, "mean")]))
    panels += [
        (
            "TPU TensorCore utilization",
            "percent",
            [(f"avg by (workload) (ray_tpu_tensorcore_utilization{{{ns}}})", "{{workload}}")],
        ),
        (
            "TPU duty cycle",
            "percent",
            [(f"avg by (workload) (ray_tpu_duty_cycle{{{ns}}})", "{{workload}}")],
        ),
        (
            "TPU HBM used",
            "bytes",
            [(f"sum by (workload) (ray_tpu_memory_used{{{ns}}})", "{{workload}}")],
        ),
        (
            "Training TPU utilization (this run)",
            "percent",
            [(f"avg(ray_tpu_tensorcore_utilization{{{train}}})", "tensorcore")],
        ),
        (
            "Serve requests/s",
            "reqps",
            [(f"sum(rate(ray_serve_num_http_requests_total{{{serve}}}[5m]))", "requests/s")],
        ),
        (
            "Serve latency",
            "ms",
            [(f"histogram_quantile({q}, {latency})", f"p{round(q * 100)}") for q in QUANTILES],
        ),
        (
            "Serve errors/s",
            "reqps",
            [
                (
                    f"sum by (error_code) (rate(ray_serve_num_http_error_requests_total{{{serve}}}"
                    "[5m]))",
                    "{{error_code}}",
                )
            ],
        ),
        (
            "vLLM generated tokens/s",
            "short",
            [(f"sum(rate(ray_vllm_generation_tokens_total{{{serve}}}[5m]))", "tokens/s")],
        ),
    ]
    return {
        "uid": f"park-{plan.names.stack_id.replace('_', '-')}",
        "title": f"park-gke {plan.stack}: training and serving",
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "1m",
        "templating": {
            "list": [
                {"type": "datasource", "name": "datasource", "query": "prometheus", "current": {}}
            ]
        },
        "panels": [
            _panel(title, unit, targets, x=12 * (i % 2), y=8 * (i // 2))
            for i, (title, unit, targets) in enumerate(panels)
        ],
    }


def grafana_configmap(plan: StackPlan) -> dict[str, Any] | None:
    """The dashboard as a ConfigMap for Grafana's sidecar (label grafana_dashboard=1)."""
    if not plan.spec.observability.grafana:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": GRAFANA_CONFIGMAP,
            "namespace": plan.names.namespace,
            "labels": {**PART_OF, GRAFANA_LABEL: "1"},
        },
        "data": {"park-gke.json": json.dumps(grafana_dashboard(plan), indent=2, sort_keys=True)},
    }


# ---------------------------------------------------------------------------------------------
# The Ray dashboard behind IAP (opt-in)


@dataclass(frozen=True)
class DashboardAccess:
    """Everything the IAP opt-in declares: cloud names, IAM members and the manifests."""

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


def dashboard_access(plan: StackPlan) -> DashboardAccess | None:
    """None unless park:observability.exposeDashboard (config validation made sure IAP has
    members, a domain and an OAuth client). The Service selects the RayService's head by the
    workload label: KubeRay's own head Service is headless and named after a random cluster."""
    obs = plan.spec.observability
    if not obs.expose_dashboard:
        return None
    if not (obs.dashboard_domain and obs.iap_oauth_client_id and obs.iap_oauth_secret):
        raise ValueError("exposeDashboard without its IAP settings: validate the config first")
    base, namespace = plan.names.dashboard, plan.names.namespace
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _exposed(DASHBOARD_NAME, namespace),
        "spec": {
            "type": "ClusterIP",
            "selector": {RAY_NODE_TYPE_LABEL: "head", WORKLOAD_LABEL: SERVICE_NAME},
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
        address_name=base,
        certificate_name=base,
        domain=obs.dashboard_domain,
        iap_members=tuple(obs.iap_members),
        iap_condition={
            "title": f"{base} only",
            "description": f"IAP access to the Ray dashboard of stack {plan.stack}",
            # Built as a CEL string literal (JSON's escapes are CEL's), never pasted: the
            # domain is also checked as a DNS name (infra/rules/security.py).
            "expression": f"request.host == {json.dumps(obs.dashboard_domain)}",
        },
        manifests=(service, policy, gateway, route),
    )


# ---------------------------------------------------------------------------------------------
# Everything the metrics component creates


@dataclass(frozen=True)
class MetricsPlan:
    project: str  # where the log-based metrics live
    pod_monitorings: tuple[dict[str, Any], ...]
    log_metrics: tuple[LogMetricPlan, ...]
    log_filter: str
    grafana_configmap: dict[str, Any] | None


def metrics(plan: StackPlan) -> MetricsPlan:
    return MetricsPlan(
        project=plan.spec.project,
        pod_monitorings=tuple(pod_monitorings(plan)),
        log_metrics=tuple(training_log_metrics(plan)),
        log_filter=training_log_filter(plan),
        grafana_configmap=grafana_configmap(plan),
    )
