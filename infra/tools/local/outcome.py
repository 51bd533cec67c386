"""What a `park local` run did, recorded as it goes: run.py fills it in, console.py prints it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from infra.tools.local.bucket import EmulatedBucket
from infra.tools.local.ray_head import LocalRay
from infra.tools.local.staging import LocalStaging


@dataclass
class Outcome:
    """What ran, for the summary."""

    trained: dict[str, Any] | None = None  # the PARK_RESULT
    train_job: str | None = None
    train_seconds: float | None = None
    last_metrics: dict[str, Any] | None = None
    endpoint: str | None = None
    smoke: str | None = None
    serve_seconds: float | None = None
    export: str | None = None  # the trained Hugging Face folder, when the run wrote one
    question: str | None = None  # asked of the served export, from the training data
    learned: str | None = None  # its answer in the training data
    reference: str | None = None  # transformers' greedy reply from the export
    reply: str | None = None  # the endpoint's reply (the trained model's, else the first's)
    replies: dict[str, str] = field(default_factory=dict)  # each served model's reply
    prompt: str | None = None  # what the served models were asked
    trained_models: list[str] = field(default_factory=list)  # served ids that serve the export
    sources: dict[str, str] = field(default_factory=dict)  # served id -> the stack's source
    stand_in: str | None = None  # what the run trained instead of the stack's model
    losses: list[float] = field(default_factory=list)  # each progress report's loss
    rewards: list[float] = field(default_factory=list)  # each RL step's mean reward
    changes: list[str] = field(default_factory=list)
    waits: list[dict[str, Any]] = field(default_factory=list)  # PARK_WAITED records
    staging: LocalStaging | None = None  # the trainer's model, staged here
    bucket: EmulatedBucket | None = None  # the stack's bucket, emulated behind its IAM gate
    ray: LocalRay | None = None  # the run's Ray head (its addresses stay after it stopped)
    started: float = field(default_factory=time.monotonic)
    sections: int = 0  # sections printed so far: they are numbered in print order
    summarized: bool = False  # the summary is printed (once)
    keep_command: str | None = None  # the command that keeps this run's endpoint up


@dataclass
class LocalRun:
    """One `park local` run's handles, handed to each of its steps: the local Ray head, the
    run's folder, the console, and what the run did so far."""

    ray: LocalRay
    run_dir: Path
    console: Console
    outcome: Outcome
