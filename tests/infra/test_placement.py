"""`park render --out` draws what runs where (placement.mmd; test_flowchart checks the file):
read back from its Mermaid text, each workload's pods sit in the pool the plan puts them on,
with the plan's numbers, and the chart is well formed (every box closed, every edge between
drawn nodes)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from infra.stack import from_file
from infra.tools.placement import HEADER, placement_chart
from tests.conftest import SHIPPED_STACKS, STACKS_DIR

SUBGRAPH = re.compile(r'^  subgraph (\w+)\["(.*)"\]$')
NODE = re.compile(r'^    (\w+)\["(.*)"\]$')
BUCKET = re.compile(r'^  (bucket)\[\("(.*)"\)\]$')
EDGE = re.compile(r"^    (\w+) (?:-->|---|-\. [^.]+ \.->) (\w+)$")


def _read(text: str) -> tuple[dict[str, str], dict[str, str], list[tuple[str, str]]]:
    """(node id -> (its box's title), node id -> label, edges) of a placement chart."""
    lines = text.splitlines()
    assert lines[:2] == [HEADER, "flowchart LR"], lines[:2]
    box_of: dict[str, str] = {}
    labels: dict[str, str] = {}
    edges: list[tuple[str, str]] = []
    inside: str | None = None
    for line in lines[2:]:
        if found := SUBGRAPH.match(line):
            assert inside is None, f"a box inside a box: {line!r}"
            inside = found.group(2)
        elif line == "  end":
            assert inside is not None, "an end without a box"
            inside = None
        elif (found := NODE.match(line)) and inside is not None:
            assert found.group(1) not in labels, f"node {found.group(1)} drawn twice"
            labels[found.group(1)], box_of[found.group(1)] = found.group(2), inside
        elif found := BUCKET.match(line):
            labels["bucket"], box_of["bucket"] = found.group(2), ""
        elif found := EDGE.match(line):
            edges.append((found.group(1), found.group(2)))
        else:
            raise AssertionError(f"not a line of the chart: {line!r}")
    assert inside is None, "a box left open"
    for left, right in edges:
        assert left in labels and right in labels, (left, right)
    return box_of, labels, edges


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_each_workload_sits_on_its_pool_with_the_plans_numbers(stack):
    plan = from_file(STACKS_DIR / f"Pulumi.{stack}.yaml")
    box_of, labels, edges = _read(placement_chart(plan))
    assert f"gs://{plan.names.bucket}" in labels["bucket"]
    assert box_of["operator"].startswith("CPU pool: ")
    assert ("kueue" in labels) == bool(plan.kueue_pools)
    if plan.training is not None:
        run = plan.training
        assert box_of["train_workers"].startswith(f"TPU pool {run.pool.name}: ")
        assert f"Ray Train: {run.workers} workers" in labels["train_workers"]
        assert ("train_head", "train_workers") in edges
        assert ("train_workers", "bucket") in edges
    if plan.serving is not None:
        assert box_of["serve_workers"].startswith(f"TPU pool {plan.serving.pool.name}: ")
        for model in plan.serving.models:
            assert f"{model.spec.name} TP {model.tensor_parallel}" in labels["serve_workers"]
    if plan.rl is not None:
        assert box_of["rl_learner"].startswith(f"TPU pool {plan.rl.learner.name}: ")
        assert f"{plan.rl.rollout.pool_name}" in box_of["rl_rollout"]
        assert f"TP {plan.rl.rollout.tensor_parallel}" in labels["rl_rollout"]
    for pool in plan.tpu_pools:
        title = f"TPU pool {pool.name}: {pool.slices} x {pool.slice.ray_pod_type} "
        assert [t for t in set(box_of.values()) if t.startswith(title)], (title, box_of)


def test_a_pool_no_workload_uses_is_drawn_empty_and_a_dropped_workload_leaves():
    """The chart follows the plan: without serving, its pods and head are gone and its pool
    says nothing runs there."""
    plan = from_file(STACKS_DIR / "Pulumi.dev.yaml")
    assert plan.serving is not None
    box_of, labels, _ = _read(placement_chart(replace(plan, serving=None)))
    assert "serve_workers" not in labels and "serve_head" not in labels
    idle = [node for node, label in labels.items() if label == "nothing scheduled here"]
    assert [box_of[node] for node in idle] == [
        t for t in set(box_of.values()) if t.startswith(f"TPU pool {plan.serving.pool.name}:")
    ]
