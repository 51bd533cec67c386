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
import re
from dataclasses import dataclass
from typing import Any

from infra.config import StackConfig
from infra.plan.ray import (
    DASHBOARD_PORT,
    EXPOSE_DASHBOARD_ANNOTATION,
    SERVICE_NAME,
    TRAINING_JOB_NAME,
    WORKLOAD_LABEL,
)

GMP_API = "monitoring.googleapis.com/v1"
GATEWAY_API = "gateway.networking.k8s.io/v1"
GKE_NETWORKING_API = "networking.gke.io/v1"
METRICS_PORT_NAME = "metrics"  # the container port Ray's metrics agent listens on (ray.py)
PART_OF = {"app.kubernetes.io/part-of": "park-gke"}
# Ray's TPU chip series; dropped at scrape time when park:observability.tpuMetrics is false.
TPU_METRICS_REGEX = "ray_tpu_.*"
# Printed by the training loop before each report (workloads/train/metrics.py METRICS_PREFIX).
TRAIN_METRICS_PREFIX = "PARK_METRICS "
DASHBOARD_NAME = "ray-dashboard"
# A global external Application Load Balancer: the one IAP and Google-managed certificates serve.
GATEWAY_CLASS = "gke-l7-global-external-managed"
PRE_SHARED_CERT_OPTION = "networking.gke.io/pre-shared-certs"
IAP_ROLE = "roles/iap.httpsResourceAccessor"
GRAFANA_LABEL = "grafana_dashboard"  # what Grafana's dashboard sidecar watches for
QUANTILES = (0.5, 0.95, 0.99)  # serve latency percentiles on the dashboard


# ---------------------------------------------------------------------------------------------
# Managed Prometheus


def pod_monitoring(config: StackConfig, node_type: str) -> dict[str, Any]:
    """Scrape Ray's `metrics` port on the head or worker pods of every Ray cluster in the
    namespace; series carry the workload (park-train / park-serve), the cluster and the group."""
    endpoint: dict[str, Any] = {
        "port": METRICS_PORT_NAME,
        "interval": config.observability.scrape_interval,
    }
    if not config.observability.tpu_metrics:
        endpoint["metricRelabeling"] = [
            {"sourceLabels": ["__name__"], "regex": TPU_METRICS_REGEX, "action": "drop"}
        ]
    return {
        "apiVersion": GMP_API,
        "kind": "PodMonitoring",
        "metadata": {"name": f"ray-{node_type}", "namespace": config.namespace, "labels": PART_OF},
        "spec": {
            "selector": {
                "matchLabels": {"ray.io/is-ray-node": "yes", "ray.io/node-type": node_type}
            },
            "endpoints": [endpoint],
            "targetLabels": {
                "fromPod": [
                    {"from": WORKLOAD_LABEL, "to": "workload"},
                    {"from": "ray.io/cluster", "to": "ray_cluster"},
                    {"from": "ray.io/group", "to": "ray_group"},
                ]
            },
        },
    }


def pod_monitorings(config: StackConfig) -> list[dict[str, Any]]:
    if not config.observability.pod_monitoring:
        return []
    return [pod_monitoring(config, "head"), pod_monitoring(config, "worker")]


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


def _metric_id(text: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", text.lower())


def training_log_filter(config: StackConfig) -> str:
    """The log lines of this stack's training runs that carry metrics."""
    return "\n".join(
        (
            'resource.type="k8s_container"',
            f'resource.labels.cluster_name="{config.cluster.name}"',
            f'resource.labels.namespace_name="{config.namespace}"',
            f'textPayload:"{TRAIN_METRICS_PREFIX.strip()}"',
        )
    )


def value_extractor(field: str) -> str:
    """The number after `"<field>": ` in the JSON the loop prints (json.dumps' separators)."""
    return f'REGEXP_EXTRACT(textPayload, "\\"{field}\\": ([-+0-9.eE]+)")'


def training_log_metrics(config: StackConfig) -> list[LogMetricPlan]:
    if not (config.training.enabled and config.observability.training_metrics):
        return []
    prefix = f"park_{_metric_id(config.stack)}_train"
    return [
        LogMetricPlan(
            name=f"{prefix}_loss",
            field="loss",
            description=f"Training loss of {TRAINING_JOB_NAME} (stack {config.stack})",
            unit="1",
            growth_factor=1.1,
            scale=0.01,
        ),
        LogMetricPlan(
            name=f"{prefix}_tokens_per_s",
            field="tokens_per_s",
            description=f"Training throughput in tokens/s of {TRAINING_JOB_NAME} "
            f"(stack {config.stack})",
            unit="1/s",
            growth_factor=1.25,
            scale=100.0,
        ),
    ]


# ---------------------------------------------------------------------------------------------
# Grafana


def _panel(title: str, unit: str, targets: list[tuple[str, str]], x: int, y: int) -> dict:
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


def grafana_dashboard(config: StackConfig) -> dict[str, Any]:
    """One dashboard for what the README asks about: a run's loss, tokens/s and TPU use, and the
    serving endpoint's request rate, latency, errors and generated tokens/s."""
    ns = f'namespace="{config.namespace}"'
    train = f'{ns},workload="{TRAINING_JOB_NAME}"'
    serve = f'{ns},workload="{SERVICE_NAME}"'
    latency = f"sum by (le) (rate(ray_serve_http_request_latency_ms_bucket{{{serve}}}[5m]))"
    panels: list[tuple[str, str, list[tuple[str, str]]]] = []
    for metric in training_log_metrics(config):
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
        "uid": f"park-{_metric_id(config.stack).replace('_', '-')}",
        "title": f"park-gke {config.stack}: training and serving",
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


def grafana_configmap(config: StackConfig) -> dict[str, Any] | None:
    """The dashboard as a ConfigMap for Grafana's sidecar (label grafana_dashboard=1)."""
    if not config.observability.grafana:
        return None
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "park-grafana-dashboards",
            "namespace": config.namespace,
            "labels": {**PART_OF, GRAFANA_LABEL: "1"},
        },
        "data": {"park-gke.json": json.dumps(grafana_dashboard(config), indent=2, sort_keys=True)},
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
    manifests: tuple[dict[str, Any], ...]


def _exposed(name: str, config: StackConfig) -> dict[str, Any]:
    """Metadata of an object that opens the dashboard: the annotation the policy pack wants."""
    return {
        "name": name,
        "namespace": config.namespace,
        "labels": PART_OF,
        "annotations": {EXPOSE_DASHBOARD_ANNOTATION: "true"},
    }


def dashboard_access(config: StackConfig) -> DashboardAccess | None:
    """None unless park:observability.exposeDashboard (config validation made sure IAP has
    members, a domain and an OAuth client). The Service selects the RayService's head by the
    workload label: KubeRay's own head Service is headless and named after a random cluster."""
    obs = config.observability
    if not obs.expose_dashboard:
        return None
    if not (obs.dashboard_domain and obs.iap_oauth_client_id and obs.iap_oauth_secret):
        raise ValueError("exposeDashboard without its IAP settings: validate the config first")
    base = f"{config.cluster.name}-{DASHBOARD_NAME}"
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _exposed(DASHBOARD_NAME, config),
        "spec": {
            "type": "ClusterIP",
            "selector": {"ray.io/node-type": "head", WORKLOAD_LABEL: SERVICE_NAME},
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
        "metadata": _exposed(DASHBOARD_NAME, config),
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
        "metadata": _exposed(DASHBOARD_NAME, config),
        "spec": {
            "parentRefs": [{"name": DASHBOARD_NAME, "sectionName": "https"}],
            "hostnames": [obs.dashboard_domain],
            "rules": [{"backendRefs": [{"name": DASHBOARD_NAME, "port": DASHBOARD_PORT}]}],
        },
    }
    policy = {
        "apiVersion": GKE_NETWORKING_API,
        "kind": "GCPBackendPolicy",
        "metadata": {"name": DASHBOARD_NAME, "namespace": config.namespace, "labels": PART_OF},
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
        manifests=(service, policy, gateway, route),
    )
