"""`park render --out` draws what `up` creates: resources.mmd, a Mermaid flowchart read back here
from its text, holds every resource of resources.json and every wait between components."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from infra.tools.cli import app
from infra.tools.flowchart import flowchart
from infra.tools.placement import placement_chart
from tests.conftest import ROOT, SHIPPED_STACKS, render_stack

NODE = re.compile(r'^\s*(r\d+|u\d+)\["(.*?)"\]$')
SUBGRAPH = re.compile(r'^\s*subgraph (u\d+)\["(.*?)"\]$')
EDGE = re.compile(r"^\s*(u\d+) --> (u\d+)$")


def _read(text: str) -> tuple[dict[str, str], dict[str, str], list[tuple]]:
    """(node id → label, box id → title, edges) of a flowchart's text."""
    nodes: dict[str, str] = {}
    boxes: dict[str, str] = {}
    edges = []
    inside = None
    lines = text.splitlines()
    assert lines[2] == "flowchart TB", lines[:3]
    for line in lines[3:]:
        if found := SUBGRAPH.match(line):
            inside = found.group(1)
            boxes[inside] = found.group(2)
        elif line.strip() == "end":
            inside = None
        elif found := NODE.match(line):
            nodes[found.group(1)] = found.group(2)
        elif found := EDGE.match(line):
            edges.append((found.group(1), found.group(2)))
        else:
            raise AssertionError(f"not a line of the flowchart: {line!r}")
    return nodes, boxes, edges


def _expected_waits(records: list[dict]) -> set[tuple[str, str]]:
    """(component or top-level resource, what waits for it), by title, read from the records:
    a resource's component is its top ancestor, a name first read as a component's."""
    components = {r["name"] for r in records if r["type"].startswith("park-gke:index:")}

    def top(record: dict) -> str:
        while record.get("parent"):
            name = record["parent"]
            record = next(
                r
                for r in records
                if r["name"] == name and (name not in components or "park-gke" in r["type"])
            )
        return _title(record)

    waits = set()
    for record in records:
        names = set(record["dependsOn"]) | ({record["provider"]} if "provider" in record else set())
        for other in records:
            if other is record or other["name"] not in names:
                continue
            if (
                other["type"].startswith("pulumi:providers:")
                and record.get("provider") != other["name"]
            ):
                continue
            if top(other) != top(record):
                waits.add((top(other), top(record)))
    return waits


def _title(record: dict) -> str:
    kind = record["type"].rsplit(":", 1)[-1]
    if record["type"].startswith("pulumi:providers:"):
        return f"{record['name']}<br/>provider {kind}"
    return f"{kind} {record['name']}"


def _check(records: list[dict], text: str) -> None:
    nodes, boxes, edges = _read(text)
    shown = {label for node, label in nodes.items() if node.startswith("r")}
    shown |= {label for node, label in nodes.items() if node.startswith("u")}
    titles = set(boxes.values()) | {nodes[n] for n in nodes if n.startswith("u")}
    for record in records:
        kind = record["type"].rsplit(":", 1)[-1]
        if record["type"].startswith("park-gke:index:"):
            assert _title(record) in titles, record["name"]
        else:
            assert f"{record['name']}<br/>{kind}" in shown or _title(record) in shown, record
    title_of = {**boxes, **{n: nodes[n] for n in nodes if n.startswith("u")}}
    drawn = {(title_of[a], title_of[b]) for a, b in edges}
    missing = _expected_waits(records) - drawn
    assert not missing, f"waits not drawn: {sorted(missing)}"
    # dependency order: a box is declared after every box it waits for
    declared = []
    for line in text.splitlines():
        if (found := SUBGRAPH.match(line) or NODE.match(line)) and found.group(1)[0] == "u":
            declared.append(found.group(1))
    for first, then in edges:
        assert declared.index(first) < declared.index(then), (title_of[first], title_of[then])
    assert len([n for n in nodes if n.startswith("r")]) + len(titles) == len(records)


def test_park_render_dev_writes_a_flowchart_of_every_resource_and_wait(tmp_path, monkeypatch):
    import infra.tools.render

    # the session's render of dev (tests/conftest.py), through the command's own writing
    rendered = render_stack("dev")
    monkeypatch.setattr(infra.tools.render, "render_stack_file", lambda *_: rendered)
    result = CliRunner().invoke(app, ["render", "dev", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "resources.mmd" in result.output
    records = json.loads((tmp_path / "resources.json").read_text())
    text = (tmp_path / "resources.mmd").read_text()
    _check(records, text)
    assert ("Cluster gke", "TpuSlicePool v6e-8") in {
        (a, b) for a, b in _expected_waits(records)
    }  # the reading finds real waits: a node pool waits for its cluster
    # beside it, what runs where (tests/infra/test_placement.py reads it)
    assert "placement.mmd" in result.output
    assert (tmp_path / "placement.mmd").read_text() == placement_chart(rendered.plan)


def test_the_check_fails_on_a_missing_wait_or_resource():
    records = json.loads((ROOT / "tests" / "golden" / "dev" / "resources.json").read_text())
    text = flowchart(records)
    edge = next(line for line in text.splitlines() if "-->" in line)
    with pytest.raises(AssertionError, match="waits not drawn"):
        _check(records, text.replace(edge + "\n", ""))
    node = next(line for line in text.splitlines() if "storage-bucket<br/>" in line)
    with pytest.raises(AssertionError):
        _check(records, text.replace(node + "\n", ""))


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_every_shipped_stacks_flowchart_holds_its_resources(stack):
    golden = ROOT / "tests" / "golden" / stack
    records = json.loads((golden / "resources.json").read_text())
    _check(records, flowchart(records))
    assert (golden / "resources.mmd").read_text() == flowchart(records), "run `make goldens`"
