"""Ray metrics in Managed Prometheus and training metrics from the logs, for the workloads a
RayMetrics watches.

- Ray exports its metrics (core, Train, Serve, vLLM through Serve LLM, and the TPU chips' when
  TPU_DEVICE_PLUGIN_ADDR is set) on each pod's `metrics` port; PodMonitorings have Managed
  Prometheus scrape the heads and the workers.
- The training loop prints `PARK_METRICS {json}` (workloads/train); log-based metrics turn loss
  and tokens/s into Cloud Monitoring series, queryable with PromQL like the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.names import (
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
# Ray's TPU chip series; dropped at scrape time when park:observability.tpuMetrics is false.
TPU_METRICS_REGEX = "ray_tpu_.*"
# The series label PodMonitorings copy the workload label into (targetLabels).
WORKLOAD_SERIES_LABEL = "workload"


@dataclass(frozen=True)
class Watched:
    """The workloads metrics are about, by the workload label their pods carry (their
    component's name). `only`: the PodMonitorings select these workloads' pods; otherwise
    every Ray pod of the namespace (the stack program's, whose workloads are the defaults)."""

    training: tuple[str, ...] = (TRAINING_JOB_NAME,)
    serving: tuple[str, ...] = (SERVICE_NAME,)
    only: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        return (*self.training, *self.serving)


STACK_PROGRAM = Watched()


def series_selector(names: tuple[str, ...]) -> str:
    """The PromQL matcher of the series of `names` (RFC 1035 names: nothing to escape)."""
    if len(names) == 1:
        return f'{WORKLOAD_SERIES_LABEL}="{names[0]}"'
    return f'{WORKLOAD_SERIES_LABEL}=~"{"|".join(names)}"'


# ---------------------------------------------------------------------------------------------
# Managed Prometheus


def pod_monitoring(
    plan: StackPlan, node_type: str, watched: Watched = STACK_PROGRAM
) -> dict[str, Any]:
    """Scrape Ray's `metrics` port on the head or worker pods (of the watched workloads, or of
    every Ray cluster in the namespace); series carry the workload, the cluster and the group."""
    obs = plan.spec.observability
    endpoint: dict[str, Any] = {"port": METRICS_PORT_NAME, "interval": obs.scrape_interval}
    if not obs.tpu_metrics:
        endpoint["metricRelabeling"] = [
            {"sourceLabels": ["__name__"], "regex": TPU_METRICS_REGEX, "action": "drop"}
        ]
    selector: dict[str, Any] = {
        "matchLabels": {RAY_NODE_LABEL: "yes", RAY_NODE_TYPE_LABEL: node_type}
    }
    if watched.only:
        selector["matchExpressions"] = [
            {"key": WORKLOAD_LABEL, "operator": "In", "values": list(watched.names)}
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
            "selector": selector,
            "endpoints": [endpoint],
            "targetLabels": {
                "fromPod": [
                    {"from": WORKLOAD_LABEL, "to": WORKLOAD_SERIES_LABEL},
                    {"from": RAY_CLUSTER_LABEL, "to": "ray_cluster"},
                    {"from": RAY_GROUP_LABEL, "to": "ray_group"},
                ]
            },
        },
    }


def pod_monitorings(plan: StackPlan, watched: Watched = STACK_PROGRAM) -> list[dict[str, Any]]:
    if not plan.spec.observability.pod_monitoring or not watched.names:
        return []
    return [pod_monitoring(plan, "head", watched), pod_monitoring(plan, "worker", watched)]


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


# The PARK_METRICS fields turned into series: (field, what, unit, bucket growth, first bucket).
TRAINING_SERIES = (
    ("loss", "Training loss", "1", 1.1, 0.01),
    ("tokens_per_s", "Training throughput in tokens/s", "1/s", 1.25, 100.0),
)


def training_log_metrics(plan: StackPlan, watched: Watched = STACK_PROGRAM) -> list[LogMetricPlan]:
    """Loss and tokens/s of the stack's training run (one per stack: its run folder is)."""
    spec = plan.spec
    if not (spec.training.enabled and spec.observability.training_metrics and watched.training):
        return []
    prefix, stack, job = plan.names.log_metric_prefix, spec.stack, ", ".join(watched.training)
    return [
        LogMetricPlan(
            name=f"{prefix}_{field}",
            field=field,
            description=f"{what} of {job} (stack {stack})",
            unit=unit,
            growth_factor=growth,
            scale=scale,
        )
        for field, what, unit, growth, scale in TRAINING_SERIES
    ]
