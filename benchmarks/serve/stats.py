"""Figures over interleaved trials: median and min-max, never a best-of.

Trials of all sides are interleaved (one pass of each side per round, the order alternating),
so trial ``i`` of two sides ran minutes apart under the same machine load: a ratio is taken per
round (``paired``) and reported as its median and min-max over the rounds, beside the ratio of
the sides' medians. The goal is judged on the median paired ratio, with its spread beside it.
"""

from __future__ import annotations

import statistics
from typing import Any

GOAL_CONCURRENCY = 8
GOAL_ENDPOINT = "completions"
GOAL_THROUGHPUT_RATIO = 0.90  # Ray Serve LLM output tokens/s >= 0.90x bare vLLM
GOAL_TTFT_RATIO = 1.5  # Ray Serve LLM mean TTFT <= 1.5x bare vLLM

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
}


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
        "other_jobs_cpu_s": [t["other_jobs_cpu_s"] for t in trials],
        "idle_servers_cpu_s": [t["idle_servers_cpu_s"] for t in trials],
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


def goals(cells: dict[str, dict[str, Any]], side: str) -> dict[str, Any]:
    """The issue's goals for one side, on the median paired ratio of the goal's cell."""
    key = f"{GOAL_ENDPOINT}/c{GOAL_CONCURRENCY}"
    ratio = cells.get(key, {}).get("ratio", {}).get(side)
    if not ratio or not ratio["output_tokens_per_s"]["paired"]:
        return {"evaluated": False, "why": f"no {key} cell for vllm and {side}"}
    tput, ttft = ratio["output_tokens_per_s"]["paired"], ratio["mean_ttft_ms"]["paired"]
    tput_ok = tput["median"] >= GOAL_THROUGHPUT_RATIO
    ttft_ok = ttft["median"] <= GOAL_TTFT_RATIO

    def says(ok: bool) -> str:
        return "holds" if ok else "does NOT hold"

    verdict = (
        f"at concurrency {GOAL_CONCURRENCY} ({GOAL_ENDPOINT}) {side} reached {tput['median']:.2f}x "
        f"(trials {tput['min']:.2f}-{tput['max']:.2f}) the bare engine's output tokens/s (goal >= "
        f"{GOAL_THROUGHPUT_RATIO}: {says(tput_ok)}) and {ttft['median']:.2f}x (trials "
        f"{ttft['min']:.2f}-{ttft['max']:.2f}) its mean TTFT (goal <= {GOAL_TTFT_RATIO}: "
        f"{says(ttft_ok)})"
    )
    return {
        "evaluated": True,
        "cell": key,
        "on": "the median over rounds of the per-round ratio (min-max beside it)",
        "throughput": {"goal": f">= {GOAL_THROUGHPUT_RATIO}", **tput, "holds": tput_ok},
        "mean_ttft": {"goal": f"<= {GOAL_TTFT_RATIO}", **ttft, "holds": ttft_ok},
        "all_hold": tput_ok and ttft_ok,
        "verdict": verdict,
    }
