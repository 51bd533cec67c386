"""RayMetrics watches the workloads it is handed: two LlmServices and a RayTrainingJob of a
package user's program get PodMonitorings and a dashboard that select their own pods (by the
labels those pods really carry), and nothing of a workload it was not handed."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import park_gke
from infra.names import RAY_NODE_LABEL, RAY_NODE_TYPE_LABEL, WORKLOAD_LABEL
from park_gke import testing
from park_gke.testing import ProgramError

ZONE = "us-east5-b"
# Plain dicts, as a program writes them (the components check them, not the type checker).
SERVE_POOL: Any = {"name": "serve", "machine_type": "ct6e-standard-8t", "topology": "2x4"}
TRAIN_POOL: Any = {"name": "train", "machine_type": "ct6e-standard-4t", "topology": "4x4"}
QWEN: Any = [{"name": "qwen", "source": "Qwen/Qwen3-1.7B"}]
WORKLOAD_KINDS = ("RayService", "RayJob")


def _service() -> Any:
    return {"project": "p", "location": ZONE, "pool": SERVE_POOL, "models": QWEN}


def _program() -> Any:
    def program() -> None:
        chat = park_gke.LlmService("chat", _service())
        code = park_gke.LlmService("code", _service())
        park_gke.LlmService("other", _service())  # not handed to RayMetrics
        training: Any = {"project": "p", "location": ZONE, "pool": TRAIN_POOL, "training": {}}
        job = park_gke.RayTrainingJob("tune", training)
        # the workloads themselves: the TypedDict says what they stand for (their names)
        args: Any = {"project": "p", "cluster_name": "gke", "grafana": True}
        args.update(training_jobs=[job], services=[chat, code])
        park_gke.RayMetrics("metrics", args)

    return program


def _pods(workload: dict[str, Any]) -> list[dict[str, str]]:
    """The labels of a Ray workload's pods: its templates' own, plus the two KubeRay sets on
    every Ray pod (ray.io/is-ray-node, ray.io/node-type)."""
    spec = workload["spec"].get("rayClusterSpec") or workload["spec"]["rayClusterConfig"]
    groups = [("head", spec["headGroupSpec"])] + [("worker", g) for g in spec["workerGroupSpecs"]]
    return [
        {**g["template"]["metadata"]["labels"], RAY_NODE_LABEL: "yes", RAY_NODE_TYPE_LABEL: role}
        for role, g in groups
    ]


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes LabelSelector (matchLabels, matchExpressions In/NotIn/Exists)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        value, op = labels.get(expr["key"]), expr["operator"]
        if op == "In" and value not in expr["values"]:
            return False
        if op == "NotIn" and value in expr["values"]:
            return False
        if op == "Exists" and value is None:
            return False
    return True


def _matchers(expr: str, label: str) -> list[re.Pattern[str]]:
    """The PromQL matchers of `label` in `expr`, as the regex each one fully matches."""
    found = []
    for op, value in re.findall(rf'\b{label}\s*(=~|=)\s*"([^"]*)"', expr):
        found.append(re.compile(value if op == "=~" else re.escape(value)))
    return found


@pytest.fixture(scope="module")
def rendered() -> testing.Result:
    return testing.run(_program(), project="p")


def _workloads(result: testing.Result) -> dict[str, list[dict[str, str]]]:
    """Each Ray workload's pod labels, by its object's name."""
    return {
        m["metadata"]["name"]: _pods(m) for m in result.manifests() if m["kind"] in WORKLOAD_KINDS
    }


def test_pod_monitorings_select_the_pods_of_the_handed_workloads_only(rendered):
    workloads = _workloads(rendered)
    assert set(workloads) == {"chat", "code", "other", "tune"}
    monitors = [m for m in rendered.manifests() if m["kind"] == "PodMonitoring"]
    assert len(monitors) == 2
    for name, pods in workloads.items():
        for pod in pods:
            selecting = [m for m in monitors if _selects(m["spec"]["selector"], pod)]
            # each watched pod by exactly one monitor (its node type's), the unwatched by none
            assert len(selecting) == (0 if name == "other" else 1), (name, pod)


def _series_label(result: testing.Result) -> str:
    """The series label the monitors copy the pods' workload label into."""
    (monitor, *_) = [m for m in result.manifests() if m["kind"] == "PodMonitoring"]
    (mapped,) = [
        t for t in monitor["spec"]["targetLabels"]["fromPod"] if t["from"] == WORKLOAD_LABEL
    ]
    return str(mapped["to"])


def test_the_dashboard_queries_select_each_handed_workload_by_its_pods_label(rendered):
    workloads = _workloads(rendered)
    value = {name: pods[0][WORKLOAD_LABEL] for name, pods in workloads.items()}
    label = _series_label(rendered)
    (configmap,) = [m for m in rendered.manifests() if m["kind"] == "ConfigMap"]
    (board,) = configmap["data"].values()
    panels = {p["title"]: p for p in json.loads(board)["panels"]}
    serve = [p for t, p in panels.items() if t.startswith(("Serve", "vLLM"))]
    train = panels["Training TPU utilization (this run)"]
    assert serve
    for panel, wanted in [*((p, {"chat", "code"}) for p in serve), (train, {"tune"})]:
        for target in panel["targets"]:
            (matcher,) = _matchers(target["expr"], label)
            selected = {n for n, v in value.items() if matcher.fullmatch(v)}
            assert selected == wanted, (panel["title"], target["expr"])
    # two services: one series each, told apart by their workload label
    assert all(
        f"by ({label}" in t["expr"] or f", {label})" in t["expr"]
        for p in serve
        for t in p["targets"]
    )


def test_log_metrics_are_the_handed_training_jobs(rendered):
    metrics = rendered.of_type("gcp:logging/metric:Metric")
    assert {m.inputs["name"].rsplit("_train_", 1)[-1] for m in metrics} == {"loss", "tokens_per_s"}
    assert all("tune" in m.inputs["description"] for m in metrics)


def test_without_a_training_job_there_are_no_training_metrics_nor_panels():
    def program() -> None:
        chat = park_gke.LlmService("chat", _service())
        args: Any = {"project": "p", "cluster_name": "gke", "grafana": True, "services": [chat]}
        park_gke.RayMetrics("metrics", args)

    result = testing.run(program, project="p")
    assert not result.of_type("gcp:logging/metric:Metric")
    (configmap,) = [m for m in result.manifests() if m["kind"] == "ConfigMap"]
    titles = {p["title"] for p in json.loads(*configmap["data"].values())["panels"]}
    assert not any(t.startswith("Training") for t in titles) and "Serve latency" in titles


def test_workloads_by_name_for_other_languages_and_a_bad_name_refused():
    def program(services: list[Any]) -> Any:
        args: Any = {"project": "p", "cluster_name": "gke", "services": services}
        return lambda: park_gke.RayMetrics("metrics", args)

    result = testing.run(program(["chat"]), project="p")
    (head, _) = [m for m in result.manifests() if m["kind"] == "PodMonitoring"]
    assert _selects(
        head["spec"]["selector"],
        {WORKLOAD_LABEL: "chat", RAY_NODE_LABEL: "yes", RAY_NODE_TYPE_LABEL: "head"},
    )
    with pytest.raises(ProgramError) as err:
        testing.run(program(['chat"} or vector(1) #']), project="p")
    assert "args.services[0]" in str(err.value) and "RayMetrics 'metrics'" in str(err.value)


def test_the_rl_job_handed_as_a_training_job_is_scraped_by_its_pods_label():
    from infra.components.rl import RayRlJob
    from infra.plan.ray import ray_pods
    from tests.infra.test_observability import _config

    plan = _config("rl")
    assert plan.rl is not None

    def program() -> None:
        job = RayRlJob.of_plan("rl", plan.rl, ray_pods(plan), False, plan.rl.image, None)
        args: Any = {"project": "p", "cluster_name": "gke", "training_jobs": [job]}
        park_gke.RayMetrics("metrics", args)

    result = testing.run(program, project="p")
    pods = _workloads(result)
    monitors = [m for m in result.manifests() if m["kind"] == "PodMonitoring"]
    assert pods and all(
        sum(_selects(m["spec"]["selector"], pod) for m in monitors) == 1
        for labels in pods.values()
        for pod in labels
    )
