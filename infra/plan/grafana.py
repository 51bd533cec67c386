"""The Grafana dashboard (a ConfigMap for Grafana's sidecar): a training run's loss, tokens/s
and TPU use, and the serving endpoints' request rate, latency, errors and generated tokens/s,
each panel about the workloads a RayMetrics watches."""

from __future__ import annotations

import json
from typing import Any

from infra.names import GRAFANA_CONFIGMAP, PART_OF
from infra.plan.metrics import (
    STACK_PROGRAM,
    WORKLOAD_SERIES_LABEL,
    Watched,
    series_selector,
    training_log_metrics,
)
from infra.resolve import StackPlan

GRAFANA_LABEL = "grafana_dashboard"  # what Grafana's dashboard sidecar watches for
QUANTILES = (0.5, 0.95, 0.99)  # serve latency percentiles on the dashboard
# Namespace-wide TPU panels: (title, unit, aggregation, Ray's series).
TPU_PANELS = (
    ("TPU TensorCore utilization", "percent", "avg", "ray_tpu_tensorcore_utilization"),
    ("TPU duty cycle", "percent", "avg", "ray_tpu_duty_cycle"),
    ("TPU HBM used", "bytes", "sum", "ray_tpu_memory_used"),
)

Panel = tuple[str, str, list[tuple[str, str]]]  # title, unit, (PromQL, legend) targets


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


def _serve_panels(ns: str, services: tuple[str, ...]) -> list[Panel]:
    """Request rate, latency, errors and generated tokens/s of the services: one series (one
    per latency quantile), or one per service when there are several."""
    serve = f"{ns},{series_selector(services)}"
    each = len(services) > 1
    by, legend = (f" by ({WORKLOAD_SERIES_LABEL})", "{{workload}}") if each else ("", "")
    le = f"le, {WORKLOAD_SERIES_LABEL}" if each else "le"
    latency = f"sum by ({le}) (rate(ray_serve_http_request_latency_ms_bucket{{{serve}}}[5m]))"
    errors_by = f"error_code, {WORKLOAD_SERIES_LABEL}" if each else "error_code"
    return [
        (
            "Serve requests/s",
            "reqps",
            [
                (
                    f"sum{by}(rate(ray_serve_num_http_requests_total{{{serve}}}[5m]))",
                    legend or "requests/s",
                )
            ],
        ),
        (
            "Serve latency",
            "ms",
            [
                (f"histogram_quantile({q}, {latency})", f"{legend} p{round(q * 100)}".strip())
                for q in QUANTILES
            ],
        ),
        (
            "Serve errors/s",
            "reqps",
            [
                (
                    f"sum by ({errors_by}) (rate(ray_serve_num_http_error_requests_total{{{serve}}}"
                    "[5m]))",
                    f"{legend} {{{{error_code}}}}".strip(),
                )
            ],
        ),
        (
            "vLLM generated tokens/s",
            "short",
            [
                (
                    f"sum{by}(rate(ray_vllm_generation_tokens_total{{{serve}}}[5m]))",
                    legend or "tokens/s",
                )
            ],
        ),
    ]


def grafana_dashboard(plan: StackPlan, watched: Watched = STACK_PROGRAM) -> dict[str, Any]:
    """One dashboard for what the README asks about: a run's loss, tokens/s and TPU use, and the
    serving endpoints' request rate, latency, errors and generated tokens/s."""
    ns = f'namespace="{plan.names.namespace}"'
    panels: list[Panel] = []
    for metric in training_log_metrics(plan, watched):
        mean = f"sum(rate({metric.promql}_sum[5m])) / sum(rate({metric.promql}_count[5m]))"
        unit = "none" if metric.field == "loss" else "short"
        panels.append((f"Training {metric.field.replace('_per_s', '/s')}", unit, [(mean, "mean")]))
    panels += [
        (title, unit, [(f"{agg} by (workload) ({series}{{{ns}}})", "{{workload}}")])
        for title, unit, agg, series in TPU_PANELS
    ]
    if watched.training:
        train = f"{ns},{series_selector(watched.training)}"
        utilization = f"avg(ray_tpu_tensorcore_utilization{{{train}}})"
        panels.append(
            ("Training TPU utilization (this run)", "percent", [(utilization, "tensorcore")])
        )
    if watched.serving:
        panels += _serve_panels(ns, watched.serving)
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


def grafana_configmap(plan: StackPlan, watched: Watched = STACK_PROGRAM) -> dict[str, Any] | None:
    """The dashboard as a ConfigMap for Grafana's sidecar (label grafana_dashboard=1)."""
    if not plan.spec.observability.grafana:
        return None
    dashboard = grafana_dashboard(plan, watched)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": GRAFANA_CONFIGMAP,
            "namespace": plan.names.namespace,
            "labels": {**PART_OF, GRAFANA_LABEL: "1"},
        },
        "data": {"park-gke.json": json.dumps(dashboard, indent=2, sort_keys=True)},
    }
