"""What people see of a run, assembled: what a RayMetrics creates (infra/plan/metrics.py:
PodMonitorings and log-based training metrics; infra/plan/grafana.py: the dashboard). The Ray
dashboard behind IAP is infra/plan/dashboard_access.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.plan.grafana import grafana_configmap
from infra.plan.metrics import (
    STACK_PROGRAM,
    LogMetricPlan,
    Watched,
    pod_monitorings,
    training_log_filter,
    training_log_metrics,
)
from infra.resolve import StackPlan


@dataclass(frozen=True)
class MetricsPlan:
    project: str  # where the log-based metrics live
    pod_monitorings: tuple[dict[str, Any], ...]
    log_metrics: tuple[LogMetricPlan, ...]
    log_filter: str
    grafana_configmap: dict[str, Any] | None


def metrics(plan: StackPlan, watched: Watched = STACK_PROGRAM) -> MetricsPlan:
    """Everything a RayMetrics watching `watched` creates."""
    return MetricsPlan(
        project=plan.spec.project,
        pod_monitorings=tuple(pod_monitorings(plan, watched)),
        log_metrics=tuple(training_log_metrics(plan, watched)),
        log_filter=training_log_filter(plan),
        grafana_configmap=grafana_configmap(plan, watched),
    )
