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
    reply: str | None = None  # the endpoint's reply
    changes: list[str] = field(default_factory=list)
    waits: list[dict[str, Any]] = field(default_factory=list)  # PARK_WAITED records
    staging: LocalStaging | None = None  # the trainer's model, staged here
    bucket: EmulatedBucket | None = None  # the stack's bucket, emulated behind its IAM gate
    started: float = field(default_factory=time.monotonic)


@dataclass
class LocalRun:
    """One `park local` run's handles, handed to each of its steps: the local Ray head, the
    run's folder, the console, and what the run did so far."""

    ray: LocalRay
    run_dir: Path
    console: Console
    outcome: Outcome
