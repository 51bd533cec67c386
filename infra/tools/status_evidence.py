"""Reading the cluster's answers as evidence, for `park status` (infra/tools/status.py).

API objects come as the API returns them (dicts of its JSON). Conditions are read as
metav1.Condition (type, status, reason, message); a pending pod's story is its PodScheduled
condition and the events about it: the scheduler's FailedScheduling, the cluster autoscaler's
NotTriggerScaleUp / TriggeredScaleUp / FailedScaleUp, and what Compute Engine said through
them (a quota exceeded, a zone out of TPUs, a reservation that does not match).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.schema.safe import one_line

Json = dict[str, Any]
PENDING, STARTING = "pending", "starting"


@dataclass(frozen=True)
class Verdict:
    """A piece's say: a state and why when it holds the workload back (state None when it
    does not); what it rests on either way."""

    state: str | None
    why: str
    evidence: tuple[str, ...]


def items(response: Json | None) -> list[Json]:
    """A list response's items (none for a list not read)."""
    return list((response or {}).get("items") or [])


def conditions(obj: Mapping[str, Any] | None) -> dict[str, Json]:
    """status.conditions by type."""
    found = ((obj or {}).get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in found if "type" in c}


def is_true(conds: Mapping[str, Json], kind: str) -> bool:
    return (conds.get(kind) or {}).get("status") == "True"


def first_line(text: str, limit: int = 300) -> str:
    """A message from the cluster on one line, cut at `limit` characters, control characters
    escaped (it reaches a terminal)."""
    return one_line(" ".join(str(text).split()), limit)


def said(condition: Mapping[str, Any] | None, kind: str = "condition") -> str:
    """A condition as evidence: `Type=Status (Reason): message`."""
    if not condition:
        return f"{kind} not set"
    text = f"{condition.get('type')}={condition.get('status')}"
    if condition.get("reason"):
        text += f" ({condition['reason']})"
    if condition.get("message"):
        text += f": {first_line(condition['message'])}"
    return text


# ---- pending pods -----------------------------------------------------------------------------

# What Compute Engine said, through the autoscaler's or the scheduler's events, most telling
# first: each names what the user can act on.
_CLOUD_CAUSES = (
    (
        re.compile(
            r"ZONE_RESOURCE_POOL_EXHAUSTED|GCE out of resources|stockout|"
            r"does not have enough resources available",
            re.IGNORECASE,
        ),
        "no capacity left in the zone (stockout)",
    ),
    (
        re.compile(r"quota[^.]*exceeded|exceeded[^.]*quota|QUOTA_EXCEEDED", re.IGNORECASE),
        "the project's quota is exhausted",
    ),
    (
        re.compile(r"reservation", re.IGNORECASE),
        "the reservation does not match or has no room",
    ),
)
# The scheduler's and the autoscaler's own words, when the cloud said nothing.
_SCHEDULER_CAUSES = (
    ("NotTriggerScaleUp", PENDING, "no node pool can take it"),
    ("FailedScaleUp", PENDING, "the scale-up failed"),
    ("TriggeredScaleUp", STARTING, "a node pool is scaling up for it"),
    ("FailedScheduling", PENDING, "no node fits it"),
)
# A scheduled pod whose container cannot start.
_STUCK_CONTAINERS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "CrashLoopBackOff",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
_EVENTS_SHOWN = 6


def _when(event: Mapping[str, Any]) -> str:
    meta = event.get("metadata") or {}
    return str(
        event.get("lastTimestamp")
        or event.get("eventTime")
        or event.get("firstTimestamp")
        or meta.get("creationTimestamp")
        or ""
    )


def _event_line(event: Mapping[str, Any]) -> str:
    source = (event.get("source") or {}).get("component") or event.get("reportingComponent")
    count = event.get("count") or (event.get("series") or {}).get("count") or 1
    about = (event.get("involvedObject") or {}).get("name")
    head = f"event {event.get('reason')} on {about} ({source or '?'}, x{count}, {_when(event)})"
    return f"{head}: {first_line(event.get('message') or '')}"


def unscheduled(pods: list[Json]) -> list[Json]:
    """Pods the scheduler has not placed."""
    return [
        p
        for p in pods
        if (p.get("status") or {}).get("phase") == "Pending"
        and not (p.get("spec") or {}).get("nodeName")
    ]


def _stuck(pods: list[Json]) -> list[tuple[str, str, str, str]]:
    """(pod, container, reason, message) of placed pods whose container cannot start."""
    found = []
    for pod in pods:
        status = pod.get("status") or {}
        for container in (status.get("initContainerStatuses") or []) + (
            status.get("containerStatuses") or []
        ):
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _STUCK_CONTAINERS:
                name = pod["metadata"]["name"]
                message = first_line(waiting.get("message") or "", 160)
                found.append((name, container.get("name", "?"), waiting["reason"], message))
    return found


def _cause(events: list[Json], pending: list[Json]) -> tuple[str, str]:
    """(state, why) of the pending pods, from the newest telling event."""
    for pattern, what in _CLOUD_CAUSES:
        for event in events:
            if pattern.search(event.get("message") or ""):
                return PENDING, f"{what}: {first_line(event['message'], 200)}"
    for reason, state, what in _SCHEDULER_CAUSES:
        for event in events:
            if event.get("reason") == reason:
                return state, f"{what}: {first_line(event.get('message') or '', 200)}"
    for pod in pending:
        scheduled = conditions(pod).get("PodScheduled") or {}
        if scheduled.get("status") == "False" and scheduled.get("message"):
            return PENDING, f"unschedulable: {first_line(scheduled['message'], 200)}"
    return PENDING, "no scheduling event about them yet"


def scheduling(pods: list[Json], events: list[Json]) -> Verdict | None:
    """The Ray pods' say: None when there are none; a state when some are pending (not placed)
    or placed with a container that cannot start."""
    if not pods:
        return None
    pending = unscheduled(pods)
    names = {p["metadata"]["name"] for p in pending}
    about = [
        e
        for e in events
        if (e.get("involvedObject") or {}).get("kind") == "Pod"
        and (e.get("involvedObject") or {}).get("name") in names
    ]
    about.sort(key=_when, reverse=True)
    evidence = [f"{len(pods)} Ray pod(s), {len(pending)} not scheduled"]
    for waiting in pending[:3]:
        scheduled = conditions(waiting).get("PodScheduled")
        evidence.append(
            f"pod {waiting['metadata']['name']}: Pending, {said(scheduled, 'PodScheduled')}"
        )
    evidence += [_event_line(e) for e in about[:_EVENTS_SHOWN]]
    if pending:
        state, why = _cause(about, pending)
        return Verdict(state, f"{len(pending)} pod(s) not scheduled: {why}", tuple(evidence))
    stuck = _stuck(pods)
    if stuck:
        pod, container, reason, message = stuck[0]
        why = f"pod {pod}: container {container} {reason}" + (f": {message}" if message else "")
        evidence += [f"pod {p}: container {c} {r}" for p, c, r, _ in stuck]
        return Verdict(PENDING, why, tuple(evidence))
    return Verdict(None, "", tuple(evidence))
