"""Figures over interleaved rounds: median and spread (min-max), never a best-of, and a verdict
only where the spreads say one.

Every side runs one pass per round (each alone, ``passes``), the order alternating, so pass
``i`` of two sides ran minutes apart under the same machine: a ratio is taken per round
(``paired``) and reported as its median and min-max over the rounds. Two sides differ (a
verdict) only when their spreads separate: every round of one side above every round of the
other. A goal on a ratio holds (or fails) only when the whole spread of the per-round ratio lies
on one side of it. The self-check (the bare server as a second side) says whether the bench
itself is even: its per-round ratio must span 1.0, or the cell is marked unreliable.
"""

from __future__ import annotations

import statistics
from typing import Any

GOAL_CONCURRENCY = 8
GOAL_ENDPOINT = "completions"
GOAL_THROUGHPUT_RATIO = 0.90  # Ray Serve LLM output tokens/s >= 0.90x bare vLLM
GOAL_TTFT_RATIO = 1.5  # Ray Serve LLM mean TTFT <= 1.5x bare vLLM
HOLDS, FAILS, UNDECIDED = "holds", "does NOT hold", "undecided (the spread straddles the goal)"

# (name, getter) of the headline figures.
FIGURES = {
    "output_tokens_per_s": lambda t: t["output_tokens_per_s"],
    "requests_per_s": lambda t: t["requests_per_s"],
    "mean_ttft_ms": lambda t: t["ttft_ms"]["mean"],
    "p50_ttft_ms": lambda t: t["ttft_ms"]["p50"],
    "p99_ttft_ms": lambda t: t["ttft_ms"]["p99"],
    "mean_tpot_ms": lambda t: t["tpot_ms"]["mean"],
    "mean_itl_ms": lambda t: t["itl_ms"]["mean"],
    "mean_e2el_ms": lambda t: t["e2el_ms"]["mean"],
    "server_cpu_s_per_1k_tokens": lambda t: t["server_cpu_s_per_1k_tokens"],
    # Server CPU per request outside vLLM's engine: the request path and the control plane.
    "cpu_ms_per_request_outside_engine": lambda t: (
        t["cpu_ms_per_request_by_role"].get("request_path", 0.0)
        + t["cpu_ms_per_request_by_role"].get("control_plane", 0.0)
    ),
}
# The figures a verdict is given on, and the self-check's (the goal's two).
VERDICT_FIGURES = (
    "output_tokens_per_s",
    "mean_ttft_ms",
    "mean_tpot_ms",
    "cpu_ms_per_request_outside_engine",
)
SELF_CHECK_FIGURES = ("output_tokens_per_s", "mean_ttft_ms")


def spread(values: list[float], digits: int = 2) -> dict[str, Any]:
    """Median, min, max and every value, in trial order."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "trials": [round(v, digits) for v in values],
    }


def _median_dict(dicts: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for d in dicts for k in d})
    return {k: round(statistics.median(d.get(k, 0.0) for d in dicts), 1) for k in keys}


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """One side in one cell: each headline figure's spread, the CPU per request (median per
    group and role), and the machine's load per trial."""
    return {
        "trials": len(trials),
        **{name: spread([get(t) for t in trials]) for name, get in FIGURES.items()},
        "failed": sum(t["failed"] for t in trials),
        "server_cpu_ms_per_request": _median_dict([t["server_cpu_ms_per_request"] for t in trials]),
        "cpu_ms_per_request_by_role": _median_dict(
            [t["cpu_ms_per_request_by_role"] for t in trials]
        ),
        "control_plane_cpu_s_per_s": spread([t["control_plane_cpu_s_per_s"] for t in trials], 3),
        "other_jobs_cpu_s": [t["other_jobs_cpu_s"] for t in trials],
        "load_average_1m": [t["load_average_1m"] for t in trials],
        "per_trial": trials,
    }


def ratios(side: list[dict[str, Any]], bare: list[dict[str, Any]]) -> dict[str, Any]:
    """side / bare for each headline figure: per round (paired) and of the medians."""
    out: dict[str, Any] = {}
    for name, get in FIGURES.items():
        pairs = [get(a) / get(b) for a, b in zip(side, bare, strict=False) if get(b)]
        a = statistics.median(get(t) for t in side)
        b = statistics.median(get(t) for t in bare)
        out[name] = {
            "paired": spread(pairs, 3) if pairs else None,
            "of_medians": round(a / b, 3) if b else None,
        }
    return out


def extra_cpu_per_request(side: dict[str, Any], bare: dict[str, Any]) -> dict[str, float]:
    """What a Ray side spends per request beyond the bare server (medians), by role."""
    r, b = side["cpu_ms_per_request_by_role"], bare["cpu_ms_per_request_by_role"]
    return {k: round(r.get(k, 0.0) - b.get(k, 0.0), 1) for k in sorted({*r, *b})}


def separation(a: list[float], b: list[float]) -> str:
    """Where ``a``'s spread lies against ``b``'s: "below" (every value of ``a`` under every value
    of ``b``), "above" (the reverse) or "overlap" (they overlap or touch: no verdict)."""
    if max(a) < min(b):
        return "below"
    if min(a) > max(b):
        return "above"
    return "overlap"


def compare(
    side: list[dict[str, Any]], bare: list[dict[str, Any]], name: str, check: dict[str, Any]
) -> dict[str, Any]:
    """``name``'s figures against the bare server's: each side's median and spread, and a
    verdict only when the spreads separate and the cell's self-check (``check``) held."""
    out: dict[str, Any] = {}
    for figure in VERDICT_FIGURES:
        get = FIGURES[figure]
        a, b = [get(t) for t in side], [get(t) for t in bare]
        sep = separation(a, b)
        if not check.get("ran", True):
            verdict = "no verdict: the self-check did not run"
        elif not check["reliable"]:
            verdict = "no verdict: the self-check failed in this cell"
        elif sep == "overlap":
            verdict = "no verdict: the spreads overlap on this machine"
        else:
            verdict = f"{name} {sep} the bare server in every round"
        out[figure] = {name: spread(a), "vllm": spread(b), "spreads": sep, "verdict": verdict}
    return out


def self_check(again: list[dict[str, Any]], bare: list[dict[str, Any]]) -> dict[str, Any]:
    """The bare server measured as two sides: its per-round ratio must span 1.0 for each of
    ``SELF_CHECK_FIGURES`` (else something in the bench favours one position), and its spread
    is what this run can resolve."""
    figures: dict[str, Any] = {}
    for figure in SELF_CHECK_FIGURES:
        get = FIGURES[figure]
        pairs = [get(a) / get(b) for a, b in zip(again, bare, strict=False) if get(b)]
        if not pairs:
            figures[figure] = {"paired": None, "within": False}
            continue
        ratio = spread(pairs, 3)
        figures[figure] = {"paired": ratio, "within": ratio["min"] <= 1.0 <= ratio["max"]}
    reliable = all(f["within"] for f in figures.values())
    summary = ", ".join(
        f"{k} {f['paired']['median']:.2f}x ({f['paired']['min']:.2f}-{f['paired']['max']:.2f})"
        for k, f in figures.items()
        if f["paired"]
    )
    return {
        **figures,
        "reliable": reliable,
        "outside_engine_cpu": outside_engine(again, bare, output_len=None),
        "verdict": f"bare vs bare: {summary}: "
        + ("1.0 within the spread, reliable" if reliable else "1.0 OUTSIDE the spread: UNRELIABLE"),
    }


def _role(t: dict[str, Any], role: str) -> float:
    return float(t["cpu_ms_per_request_by_role"].get(role, 0.0))


FRONTEND = ("api_server", "llm_server_replica")  # where vLLM's OpenAI frontend runs, per side


def outside_engine(
    side: list[dict[str, Any]], bare: list[dict[str, Any]], output_len: int | None
) -> dict[str, Any]:
    """The figure that carries to an accelerator: server CPU per request outside vLLM's engine
    (the engine's own CPU is whatever its busy-polling finds free, on any host), the side's
    minus the bare server's, per round; split into the request path (per request on any host)
    and the control plane (per second: ``control_plane_cpu_s_per_s``, in cores), and by group
    (the frontend compared with the frontend)."""

    outside = FIGURES["cpu_ms_per_request_outside_engine"]
    pairs = list(zip(side, bare, strict=False))
    extra = spread([outside(a) - outside(b) for a, b in pairs], 1)
    path = spread([_role(a, "request_path") - _role(b, "request_path") for a, b in pairs], 1)

    def by_group(trials: list[dict[str, Any]]) -> dict[str, float]:
        merged = [
            {
                ("frontend" if g in FRONTEND else g): v
                for g, v in t["server_cpu_ms_per_request"].items()
                if g not in ("engine_core", "engine_worker")
            }
            for t in trials
        ]
        keys = {k for d in merged for k in d}  # a group may run in some rounds only
        return {k: statistics.median(d.get(k, 0.0) for d in merged) for k in keys}

    a, b = by_group(side), by_group(bare)
    groups = {k: round(a.get(k, 0.0) - b.get(k, 0.0), 1) for k in {*a, *b}}
    out: dict[str, Any] = {
        "extra_ms_per_request": extra,
        "request_path_extra_ms_per_request": path,
        "control_plane_ms_per_request": spread([_role(t, "control_plane") for t in side], 1),
        "control_plane_cores": spread([t["control_plane_cpu_s_per_s"] for t in side], 3),
        "side_ms_per_request": spread([outside(t) for t in side], 1),
        "bare_ms_per_request": spread([outside(t) for t in bare], 1),
        "extra_by_group_ms_per_request": dict(sorted(groups.items(), key=lambda kv: -abs(kv[1]))),
    }
    if output_len:
        out["extra_ms_per_token"] = round(extra["median"] / output_len, 3)
    return out


def goals(cells: dict[str, dict[str, Any]], side: str) -> dict[str, Any]:
    """The issue's goals for one side in the goal's cell, on the per-round ratio: "holds" when
    its whole spread meets the goal, "does not hold" when none of it does, else "undecided";
    nothing is judged when the cell's self-check failed."""
    key = f"{GOAL_ENDPOINT}/c{GOAL_CONCURRENCY}"
    cell = cells.get(key, {})
    ratio = cell.get("ratio", {}).get(side)
    if not ratio or not ratio["output_tokens_per_s"]["paired"]:
        return {"evaluated": False, "why": f"no {key} cell for vllm and {side}"}
    reliable = cell.get("self_check", {}).get("reliable", False)
    tput, ttft = ratio["output_tokens_per_s"]["paired"], ratio["mean_ttft_ms"]["paired"]
    tput_says = _against(tput, GOAL_THROUGHPUT_RATIO, at_least=True)
    ttft_says = _against(ttft, GOAL_TTFT_RATIO, at_least=False)
    verdict = (
        f"at concurrency {GOAL_CONCURRENCY} ({GOAL_ENDPOINT}) {side} reached {tput['median']:.2f}x "
        f"(rounds {tput['min']:.2f}-{tput['max']:.2f}) the bare engine's output tokens/s (goal >= "
        f"{GOAL_THROUGHPUT_RATIO}: {tput_says}) and {ttft['median']:.2f}x (rounds "
        f"{ttft['min']:.2f}-{ttft['max']:.2f}) its mean TTFT (goal <= {GOAL_TTFT_RATIO}: "
        f"{ttft_says})"
    )
    if not reliable:
        verdict = f"NOT JUDGED (the self-check failed or did not run): {verdict}"
    return {
        "evaluated": reliable,
        "cell": key,
        "on": "the spread over rounds of the per-round ratio (median beside it)",
        "throughput": {"goal": f">= {GOAL_THROUGHPUT_RATIO}", **tput, "says": tput_says},
        "mean_ttft": {"goal": f"<= {GOAL_TTFT_RATIO}", **ttft, "says": ttft_says},
        "all_hold": reliable and tput_says == ttft_says == HOLDS,
        "verdict": verdict,
    }


def _against(ratio: dict[str, Any], goal: float, at_least: bool) -> str:
    """Where the per-round ratio's whole spread lies against ``goal``."""
    low, high = ratio["min"], ratio["max"]
    if (low >= goal) if at_least else (high <= goal):
        return HOLDS
    if (high < goal) if at_least else (low > goal):
        return FAILS
    return UNDECIDED
