"""Each side measured alone: a pass starts its side's server, lets it settle, measures, and
stops it; nothing of another side is alive meanwhile, and the run checks that it is so.

Why: on a 2-core machine a resident Ray cluster (its control plane, its replica, vLLM's engine
that busy-polls for a second after every message) takes CPU from whatever else runs, and a
frozen server takes none: measuring one side beside the other, resident or frozen, charges one
side for the other's work. A fresh server per pass costs a start-up per pass (Ray: 1.5-2.5 min
on 2 cores) and buys symmetry: every side pays for its own processes and nothing else. vLLM's
own warm-ups (``--num-warmups``) run in every pass, after the settle.

Rounds interleave the sides (``order``: ABC, CBA, ...), so drifts of the machine's load fall on
every side alike; over an even number of rounds every side is as often early in a round as late.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from benchmarks.serve import cpu, servers

SETTLE_WINDOW_S = 5.0
SETTLE_WITHIN = 0.05  # cores: two windows in a row this close = start-up work is done
SETTLE_LIMIT_S = 120.0

Start = Callable[[str, str], AbstractContextManager[servers.Server]]  # (side, tag) -> server


def order(sides: list[str], rounds: int) -> list[list[str]]:
    """One pass of every side per round, the order reversed every other round (ABBA...)."""
    return [sides if r % 2 == 0 else list(reversed(sides)) for r in range(rounds)]


class NotAlone(RuntimeError):
    """A process of another pass of this run was alive where none may be."""


@dataclass
class Run:
    """One benchmark run: its id (the prefix of every server's tag) and the session of every
    server it started, by tag."""

    id: str
    sessions: dict[str, int] = field(default_factory=dict)

    def others_alive(self, tag: str) -> dict[str, list[int]]:
        """Live processes of this run's servers other than pass ``tag``'s, by tag: carrying
        their tag, or in their session (empty: the pass is alone)."""
        seen = servers.census()
        out: dict[str, set[int]] = {}
        for s in seen:
            if s.tag is not None and s.tag.startswith(f"{self.id}/") and s.tag != tag:
                out.setdefault(s.tag, set()).add(s.pid)
        for other, sid in self.sessions.items():
            if other != tag:
                for s in seen:
                    if s.sid == sid:
                        out.setdefault(other, set()).add(s.pid)
        return {t: sorted(pids) for t, pids in sorted(out.items())}

    def check_alone(self, tag: str, when: str) -> None:
        if left := self.others_alive(tag):
            raise NotAlone(f"{when} of pass {tag}: other servers of this run alive: {left}")


@contextmanager
def alone(
    run: Run, side: str, label: str, start: Start, window_s: float = SETTLE_WINDOW_S
) -> Iterator[servers.Server]:
    """Side ``side``'s server for one pass: started once nothing of the run is alive, settled
    (``settle``), yielded; stopped on exit with every process gone (``servers.stop``)."""
    tag = f"{run.id}/{side}/{label}"
    run.check_alone(tag, "before the start")
    with start(side, tag) as server:
        run.sessions[tag] = server.sid
        server.tag = tag
        server.settle = settle(server.sid, window_s)
        run.check_alone(tag, "after the settle")
        yield server
    run.check_alone("", "after the stop")


def settle(
    sid: int,
    window_s: float = SETTLE_WINDOW_S,
    within: float = SETTLE_WITHIN,
    limit_s: float = SETTLE_LIMIT_S,
) -> dict[str, Any]:
    """Wait until a fresh server's idle CPU is steady: two ``window_s`` windows in a row whose
    rates (cores) differ by less than ``within`` (Ray's agents and dashboard, vLLM's engine
    spinning after the readiness probe settle down), at most ``limit_s``. Returns the time
    taken and the last window's idle CPU per group (CPU-s per s)."""
    started, previous = time.monotonic(), None
    while True:
        idle = cpu.idle_cost(sid, window_s)
        rate = sum(idle.values())
        steady = previous is not None and abs(rate - previous) < within
        if steady or time.monotonic() - started >= limit_s:
            return {
                "settled": steady,
                "settle_s": round(time.monotonic() - started, 1),
                "idle_cpu_s_per_s": round(rate, 3),
                "idle_by_group": idle,
            }
        previous = rate
