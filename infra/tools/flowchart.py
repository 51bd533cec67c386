"""What `pulumi up` creates, as a Mermaid flowchart: `park render --out` writes it beside
resources.json (resources.mmd), from resources.json's records alone, and the docs embed one per
shipped stack (infra/tools/docs.py).

Each park-gke component is a subgraph holding every resource it creates; a top-level resource
that is not a component (the Kubernetes provider) is a node of its own. An arrow goes from what
is created first to what waits for it: one arrow per pair of components whose resources wait on
one another (`dependsOn` and `provider`), drawn in dependency order. Logical names repeat across
types (the GKE cluster, its component and the Kubernetes provider share one), so a name is read
as the record it can be: a resource never waits for itself, and only a resource created with a
provider waits for that provider.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

COMPONENT = "park-gke:index:"
PROVIDER = "pulumi:providers:"
HEADER = (
    "%% What `pulumi up` creates, from resources.json (park render): each box a park-gke\n"
    "%% component and the resources it creates; an arrow from what is created first.\n"
    "flowchart TB"
)

Record = Mapping[str, Any]


def short_type(type_token: str) -> str:
    """A resource's kind as a node shows it: `Bucket`, `Job`, `provider kubernetes`."""
    if type_token.startswith(PROVIDER):
        return f"provider {type_token.removeprefix(PROVIDER)}"
    return type_token.rsplit(":", 1)[-1]


def _quoted(text: str) -> str:
    return text.replace('"', "#quot;")


def _named(records: Sequence[Record]) -> dict[str, list[int]]:
    by_name: dict[str, list[int]] = {}
    for index, record in enumerate(records):
        by_name.setdefault(record["name"], []).append(index)
    return by_name


def _waited_for(records: Sequence[Record], index: int, by_name: dict[str, list[int]]) -> set[int]:
    """The records resource `index` waits for: each name it depends on, read as the record it
    can be (never itself; a provider only when it is created with that provider)."""
    record = records[index]
    names = set(record.get("dependsOn") or [])
    if record.get("provider"):
        names.add(record["provider"])
    found: set[int] = set()
    for name in names:
        for other in by_name.get(name, []):
            token = records[other]["type"]
            if other == index or (token.startswith(PROVIDER) and record.get("provider") != name):
                continue
            found.add(other)
    return found


def tops(records: Sequence[Record]) -> list[int]:
    """For each record, the index of the top-level record it belongs to (itself at the top):
    a parent named by a component is that component."""
    by_name = _named(records)

    def parent_of(index: int) -> int | None:
        name = records[index].get("parent")
        if not name:
            return None
        candidates = [i for i in by_name.get(name, []) if i != index]
        components = [i for i in candidates if records[i]["type"].startswith(COMPONENT)]
        chosen = components or candidates
        return chosen[0] if chosen else None

    found = []
    for index in range(len(records)):
        current, seen = index, {index}
        while (up := parent_of(current)) is not None and up not in seen:
            current = up
            seen.add(up)
        found.append(current)
    return found


def unit_edges(records: Sequence[Record]) -> set[tuple[int, int]]:
    """(created first, waits for it) between top-level records, from every resource's waits."""
    by_name, top = _named(records), tops(records)
    edges = set()
    for index in range(len(records)):
        for other in _waited_for(records, index, by_name):
            if top[other] != top[index]:
                edges.add((top[other], top[index]))
    return edges


def _in_order(units: list[int], edges: set[tuple[int, int]]) -> list[int]:
    """`units` in dependency order (Kahn's, ties in resources.json's order); a unit left in a
    cycle follows in that order."""
    waiting = {u: {a for a, b in edges if b == u and a != u} for u in units}
    ordered: list[int] = []
    while len(ordered) < len(units):
        ready = [u for u in units if u not in ordered and not waiting[u] - set(ordered)]
        ordered.append((ready or [u for u in units if u not in ordered])[0])
    return ordered


def flowchart(records: Sequence[Record]) -> str:
    """resources.json's records as a Mermaid flowchart (see the module's docstring)."""
    top = tops(records)
    units = sorted(set(top))
    edges = unit_edges(records)
    members: dict[int, list[int]] = {u: [] for u in units}
    for index, unit in enumerate(top):
        if index != unit:
            members[unit].append(index)
    order = _in_order(units, edges)
    lines = [HEADER]
    for unit in order:
        record = records[unit]
        label = f"{short_type(record['type'])} {record['name']}"
        if not members[unit]:
            lines.append(f'  u{unit}["{_quoted(record["name"])}<br/>{short_type(record["type"])}"]')
            continue
        lines.append(f'  subgraph u{unit}["{_quoted(label)}"]')
        for index in members[unit]:
            child = records[index]
            lines.append(
                f'    r{index}["{_quoted(child["name"])}<br/>{short_type(child["type"])}"]'
            )
        lines.append("  end")
    place = {unit: n for n, unit in enumerate(order)}
    ranked = sorted(edges, key=lambda edge: (place[edge[0]], place[edge[1]]))
    lines += [f"  u{first} --> u{then}" for first, then in ranked]
    return "\n".join(lines) + "\n"
