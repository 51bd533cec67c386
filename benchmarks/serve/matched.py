"""Both sides at the same offered load: the figures, a paired sign test for each, and the goals.

Each side is driven open-loop at one request rate (``load.client_argv(request_rate=...)``: the
same seeded Poisson arrivals for every side), a rate below the slower side's capacity
(``rate_from_probe``) or given. At a matched rate every side serves the same requests in the
same wall time, so CPU divided by output tokens, or by wall seconds, compares like with like:
the slower side's per-token cost is not inflated by its own lower throughput, and the control
plane, which works per second, is reported in cores and never per request.

Rounds alternate the sides' order (``passes.order``), so round ``i`` of two sides ran minutes
apart: every figure is compared per round with a two-sided exact binomial sign test
(``sign_test``: ties dropped; n, wins, p), beside each side's median and min-max. A goal is
``met`` or ``missed`` when the sign test of its per-round values against the goal decides at
p < 0.05, or when the whole min-max spread lies on one side of it; else ``undecided``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from benchmarks.serve import cpu, stats

ALPHA = 0.05
MET, MISSED, UNDECIDED = "met", "missed", "undecided"
PROBE_FRACTION = 0.6  # of the slower side's closed-loop requests/s: below both capacities
PASS_SECONDS = 30.0  # each matched pass offers this many seconds of arrivals

FRONTEND = ("api_server", "llm_server_replica")  # vLLM's OpenAI frontend, per side
ENGINE = ("engine_core", "engine_worker")
REQUEST_PATH_RAY = (
    "haproxy",
    "llm_router_replica",
    "ingress_replica",
)  # Ray's hops a request takes
# No request crosses these under the shipped settings: cpu.CONTROL_PLANE (Serve's controller,
# GCS, raylet, the agents, idle workers...) and Serve's proxy actor (HAProxy forwards to the
# replica; the actor manages HAProxy and answers health checks).
CONTROL_PLANE = (*cpu.CONTROL_PLANE, "serve_proxy")

# Goals (issue 39), restated so they carry to a TPU host.
FRONTEND_CPU_RATIO = 1.15  # frontend CPU per output token <= 1.15x the bare server's
CONTROL_PLANE_CORES_PER_HOST = 0.1
GPU_TOKENS_RATIO = 0.97  # accelerator only
GPU_P50_TTFT_EXTRA_MS = 3.0  # accelerator only


# ---- the sign test ----------------------------------------------------------------------------


def sign_test(n: int, wins: int) -> float:
    """Two-sided exact binomial test of ``wins`` out of ``n`` against p = 1/2: twice the smaller
    tail, at most 1 (scipy.stats.binomtest's p-value for p = 1/2, where the law is symmetric)."""
    if not 0 <= wins <= n:
        raise ValueError(f"wins {wins} outside 0..{n}")
    if n == 0:
        return 1.0
    k = min(wins, n - wins)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(side: list[float], bare: list[float]) -> dict[str, Any]:
    """Round by round, is the side's figure above the bare server's? Ties are dropped."""
    diffs = [a - b for a, b in zip(side, bare, strict=True)]
    higher = sum(d > 0 for d in diffs)
    lower = sum(d < 0 for d in diffs)
    n = higher + lower
    p = sign_test(n, higher)
    if p >= ALPHA:
        says = f"no decision (p = {p:.3g})"
    else:
        says = f"side {'higher' if higher > lower else 'lower'} (p = {p:.3g})"
    return {"n": n, "wins": higher, "ties": len(diffs) - n, "p": round(p, 4), "says": says}


def spread(values: list[float], digits: int = 4) -> dict[str, Any]:
    """Median, min, max and every round's value (``stats.spread``, 4 digits)."""
    return stats.spread(values, digits)


def verdict(values: list[float], goal: float, at_most: bool) -> dict[str, Any]:
    """Per-round values against a goal (``<= goal`` when ``at_most``, else ``>= goal``): met or
    missed when the sign test of (meets, misses) decides at p < 0.05 or the whole spread lies on
    one side; undecided when neither (the spread straddles the goal)."""
    meets = [v <= goal if at_most else v >= goal for v in values]
    n, met = len(meets), sum(meets)
    p = sign_test(n, met)
    if p < ALPHA:
        says = MET if met > n - met else MISSED
    elif met == n:
        says = MET
    elif met == 0:
        says = MISSED
    else:
        says = UNDECIDED
    return {
        "goal": f"{'<=' if at_most else '>='} {goal:g}",
        **spread(values),
        "sign_test": {"n": n, "wins": met, "p": round(p, 4), "wins_are": "rounds meeting the goal"},
        "verdict": says,
    }


# ---- the matched-load accounting ----------------------------------------------------------------


def rate_from_probe(requests_per_s: dict[str, float], fraction: float = PROBE_FRACTION) -> float:
    """The offered rate for every side: ``fraction`` of the slowest side's closed-loop rate (its
    capacity, probed), rounded down to 0.1 request/s."""
    slowest = min(requests_per_s.values())
    if slowest <= 0:
        raise ValueError(f"a side served nothing in the probe: {requests_per_s}")
    return max(0.1, math.floor(10 * fraction * slowest) / 10)


def prompts_at(rate: float, seconds: float = PASS_SECONDS) -> int:
    """Prompts for a pass offering ``rate`` requests/s for ``seconds`` (at least 32)."""
    return max(32, round(rate * seconds))


def _groups(t: dict[str, Any], names: tuple[str, ...], key: str) -> float:
    return sum(v for g, v in t[key].items() if g in names)


def cpu_ms_per_token(t: dict[str, Any], names: tuple[str, ...]) -> float:
    return _groups(t, names, "server_cpu_ms_per_output_token")


def cores(t: dict[str, Any], names: tuple[str, ...]) -> float:
    return _groups(t, names, "cores_by_group")


# (name, getter) of each figure compared round by round (the closed loop's where they are alike).
_SHARED = ("output_tokens_per_s", "requests_per_s", "p50_ttft_ms", "mean_tpot_ms")
FIGURES: dict[str, Callable[[dict[str, Any]], float]] = {
    **{name: stats.FIGURES[name] for name in _SHARED},
    "p90_ttft_ms": lambda t: t["ttft_ms"]["p90"],
    "frontend_cpu_ms_per_output_token": lambda t: cpu_ms_per_token(t, FRONTEND),
    "engine_cpu_ms_per_output_token": lambda t: cpu_ms_per_token(t, ENGINE),
    "ray_request_path_cpu_ms_per_output_token": lambda t: cpu_ms_per_token(t, REQUEST_PATH_RAY),
    "server_cpu_ms_per_output_token": lambda t: sum(t["server_cpu_ms_per_output_token"].values()),
    "control_plane_cores": lambda t: cores(t, CONTROL_PLANE),
}


def per_process(trials: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each process group's CPU per output token (ms) over the rounds (0 where it did not run)."""
    groups = sorted({g for t in trials for g in t["server_cpu_ms_per_output_token"]})
    return {
        g: spread([t["server_cpu_ms_per_output_token"].get(g, 0.0) for t in trials]) for g in groups
    }


def compare(
    side: list[dict[str, Any]],
    bare: list[dict[str, Any]],
    hosts: int = 1,
    accelerator: bool = False,
) -> dict[str, Any]:
    """One side against the bare server at a matched rate: each figure's spread on both sides,
    the per-round ratio and the paired sign test; each goal's verdict. ``hosts``: the hosts the
    side's control plane served (one here)."""
    figures: dict[str, Any] = {}
    for name, get in FIGURES.items():
        a, b = [get(t) for t in side], [get(t) for t in bare]
        ratio = [x / y for x, y in zip(a, b, strict=True) if y]
        figures[name] = {
            "side": spread(a),
            "bare": spread(b),
            "ratio": spread(ratio) if len(ratio) == len(a) and ratio else None,
            "sign_test": paired(a, b),
        }
    pairs = list(zip(side, bare, strict=True))
    front = FIGURES["frontend_cpu_ms_per_output_token"]
    frontend = [front(a) / front(b) for a, b in pairs]
    control = [FIGURES["control_plane_cores"](t) / hosts for t in side]
    goals = {
        "frontend_cpu_per_output_token": {
            "on": "side frontend CPU per output token / bare server's, per round",
            **verdict(frontend, FRONTEND_CPU_RATIO, at_most=True),
        },
        "control_plane_cores_per_host": {
            "on": f"the side's control plane in cores per host ({hosts} host(s)), per round",
            **verdict(control, CONTROL_PLANE_CORES_PER_HOST, at_most=True),
        },
    }
    tok_s, ttft50 = FIGURES["output_tokens_per_s"], FIGURES["p50_ttft_ms"]
    tokens = [tok_s(a) / tok_s(b) for a, b in pairs]
    ttft = [ttft50(a) - ttft50(b) for a, b in pairs]
    for key, on, values, goal, at_most in (
        ("tokens_per_s", "side / bare output tokens/s, per round", tokens, GPU_TOKENS_RATIO, False),
        ("p50_ttft", "side - bare p50 TTFT (ms), per round", ttft, GPU_P50_TTFT_EXTRA_MS, True),
    ):
        judged = verdict(values, goal, at_most)
        goals[key] = {"on": on, "applies": accelerator, **judged}
        if not accelerator:
            goals[key]["verdict"] = f"not judged on CPU (would read: {judged['verdict']})"
    return {
        "figures": figures,
        "cpu_ms_per_output_token_by_process": {
            "side": per_process(side),
            "bare": per_process(bare),
        },
        "matched": matched_load(side, bare),
        "goals": goals,
    }


def matched_load(side: list[dict[str, Any]], bare: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the two sides did serve the same load: the same completed requests and output
    tokens, and achieved request rates within 5 % of each other, round by round."""
    rates = [a["requests_per_s"] / b["requests_per_s"] for a, b in zip(side, bare, strict=True)]
    same = all(
        a["completed"] == b["completed"] and a["output_tokens"] == b["output_tokens"]
        for a, b in zip(side, bare, strict=True)
    )
    within = all(abs(r - 1) <= 0.05 for r in rates)
    return {
        "same_requests_and_tokens": same,
        "achieved_rate_ratio": spread(rates),
        "matched": same and within,
    }
