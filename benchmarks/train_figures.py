"""The training overhead benchmark's figures: step and CPU time of a side's reports, the
machine's load around a run, one case's comparison of the two sides, the goals and what the
load means for them (benchmarks/train_overhead.py runs the sides)."""

from __future__ import annotations

import itertools
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workloads.train.config import TrainConfig

GOAL_RATIO = 1.05
DEFAULT_CASE = "gpt-tiny"


def steady_step_time(reports: list[dict[str, Any]]) -> float:
    """Median step time over the report windows after the first (which holds warm-up)."""
    windows = [r["step_time_s"] for r in reports[1:] if r.get("step_time_s")]
    if not windows:
        raise ValueError("need at least two report windows: raise --steps")
    return statistics.median(windows)


def transient_s(reports: list[dict[str, Any]]) -> float:
    """Seconds the windows after the first spent above the steady step time: a one-off cost
    beside the first steps (Ray Train's helper actors starting, benchmarks/train_overhead.py
    DEFAULT_STEPS) that the median leaves out, reported rather than hidden."""
    steady = steady_step_time(reports)
    timed = [r for r in reports if r.get("step_time_s")]
    return sum(
        max(b["step_time_s"] - steady, 0.0) * (b["step"] - a["step"])
        for a, b in itertools.pairwise(timed)
    )


def steady_cpu_per_step(reports: list[dict[str, Any]]) -> float:
    """Median CPU seconds per step of rank 0 over the windows after the first."""
    timed = [r for r in reports if "cpu_s" in r and r.get("step_time_s")]
    per_step = [
        (b["cpu_s"] - a["cpu_s"]) / (b["step"] - a["step"]) for a, b in itertools.pairwise(timed)
    ]
    return statistics.median(per_step)


# ---- the machine -----------------------------------------------------------------------------


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


@dataclass
class Load:
    """How busy the machine was over one run."""

    load_1m_before: float
    load_1m_after: float = 0.0
    cpu_busy_share: float = 0.0  # of all CPUs, by every process on the machine
    _start: tuple[int, int] = field(default_factory=_cpu_jiffies, repr=False)

    def stop(self) -> Load:
        busy, total = _cpu_jiffies()
        self.load_1m_after = os.getloadavg()[0]
        span = max(total - self._start[1], 1)
        self.cpu_busy_share = round((busy - self._start[0]) / span, 3)
        return self

    def as_dict(self) -> dict[str, float]:
        return {
            "load_1m_before": round(self.load_1m_before, 2),
            "load_1m_after": round(self.load_1m_after, 2),
            "cpu_busy_share": self.cpu_busy_share,
        }


def side_figures(reports: list[dict[str, Any]], start: float, end: float) -> dict[str, Any]:
    """One run's figures; time to first step is split at the loop's start: before it, process
    start-up and (Ray) the controller and worker group; after it, model, data and step 1."""
    first = next((r for r in reports if r.get("first_step_at")), {})
    return {
        "step_time_s": steady_step_time(reports),
        "best_window_step_time_s": min(
            r["step_time_s"] for r in reports[1:] if r.get("step_time_s")
        ),
        "cpu_s_per_step": steady_cpu_per_step(reports),
        "transient_s": transient_s(reports),
        "window_step_times_s": [
            round(r["step_time_s"], 4) for r in reports if r.get("step_time_s")
        ],
        "time_to_first_step_s": first["first_step_at"] - start if first else None,
        "until_loop_starts_s": first["started_at"] - start if first else None,
        "wall_s": end - start,
    }


def compare(
    cfg: TrainConfig, threads: int, runs: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """One case: each side's best of its runs (``side_figures`` each), side by side."""
    best = {side: min(r["step_time_s"] for r in samples) for side, samples in runs.items()}
    window = {
        side: min(r["best_window_step_time_s"] for r in samples) for side, samples in runs.items()
    }
    cpu = {side: min(r["cpu_s_per_step"] for r in samples) for side, samples in runs.items()}

    def least(key: str) -> dict[str, float | None]:
        return {
            side: min((r[key] for r in samples if r[key] is not None), default=None)
            for side, samples in runs.items()
        }

    ttfs, until_loop = least("time_to_first_step_s"), least("until_loop_starts_s")
    transient = least("transient_s")
    tokens = cfg.batch * int(cfg.seq_len or 0)
    return {
        "model": cfg.model or f"gpt:{cfg.model_size}",
        "objective": cfg.objective if cfg.model else "synthetic tokens",
        "strategy": cfg.strategy,
        "workers": cfg.workers,
        "threads_per_worker": threads,
        "steps": cfg.steps,
        "global_batch_size": cfg.batch,
        "seq_len": cfg.seq_len,
        "plain_step_time_s": best["plain"],
        "ray_train_step_time_s": best["ray_train"],
        "ray_over_plain": best["ray_train"] / best["plain"],
        # The fastest report window of each side: least touched by other processes' bursts.
        "plain_best_window_step_time_s": window["plain"],
        "ray_train_best_window_step_time_s": window["ray_train"],
        "ray_over_plain_best_window": window["ray_train"] / window["plain"],
        "plain_tokens_per_s": tokens / best["plain"],
        "ray_train_tokens_per_s": tokens / best["ray_train"],
        "plain_cpu_s_per_step": cpu["plain"],
        "ray_train_cpu_s_per_step": cpu["ray_train"],
        "ray_over_plain_cpu": cpu["ray_train"] / cpu["plain"],
        # Seconds above the steady rate after the first window (a one-off start-up tail).
        "plain_transient_s": transient["plain"],
        "ray_train_transient_s": transient["ray_train"],
        "plain_time_to_first_step_s": ttfs["plain"],
        "ray_train_time_to_first_step_s": ttfs["ray_train"],
        "plain_until_loop_starts_s": until_loop["plain"],
        "ray_train_until_loop_starts_s": until_loop["ray_train"],
        "runs": runs,
    }


def goals(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal with this run's value and whether it holds.

    The goal is the step-time ratio of the default run; the CPU-time ratio beside it says
    whether Ray adds work to a training worker, which the machine's load moves far less. The
    other cases show both ratios where a step costs more."""
    out = []
    for name, case in results.items():
        role = "the default run" if name == DEFAULT_CASE else "where a step costs more"
        for key, what in (("ray_over_plain", "step time"), ("ray_over_plain_cpu", "CPU per step")):
            value = case[key]
            out.append(
                {
                    "goal": f"{name} ({role}): {what}, {key} <= {GOAL_RATIO}",
                    "value": round(value, 4),
                    "holds": value <= GOAL_RATIO,
                }
            )
    return out


def noise(results: dict[str, Any]) -> dict[str, Any]:
    """How loaded the machine was during the runs, and what that means for the ratios."""
    loads = [
        run["load"]["load_1m_before"]
        for case in results.values()
        for runs in case["runs"].values()
        for run in runs
    ]
    cpus = os.cpu_count() or 1
    busy = bool(loads) and max(loads) > cpus
    return {
        "load_1m_min": min(loads, default=None),
        "load_1m_max": max(loads, default=None),
        "busy": busy,
        "reading": (
            "other processes kept the CPUs busy during some runs: a step-time ratio below 1 "
            "means the plain side drew the busier moments; the CPU-per-step ratios are the "
            "steady figure"
            if busy
            else "the machine was quiet enough for the step-time ratios to stand on their own"
        ),
    }
