"""Waiting for a model folder that another job is still writing, with a stated bound.

A workload and the job that writes the model it reads start at once, the way one `pulumi up`
starts them (the trainer and a hub model's staging; a serving replica and the training run
whose export it serves). The folder is complete when its writer's marker exists
(workloads/protocol.py: written last, after every other file). The reader polls for it, says
every minute what it is waiting for, and after `timeout_s` fails with a message that names the
folder, the marker, the bound and what writes the marker. For whoever runs it, it prints one
``PARK_WAITING {...}`` line when it starts to wait and one ``PARK_WAITED {...}`` line (who,
folder, marker, seconds; 0 when the marker was there at once) when it is there
(workloads/protocol.py).

Torch-free and Ray-free; a ``gs://`` folder is checked through pyarrow (workloads/train/
storage.py), anything else as a local path (the bucket's FUSE mount on GKE).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from workloads.protocol import COMPLETION_MARKERS, WAITED_PREFIX, WAITING_PREFIX, format_line

POLL_S = 2.0  # one stat per poll: cheap on a local disk and through GCS FUSE alike
SAY_EVERY_S = 60.0


class ModelNotReady(TimeoutError):
    """The folder's marker did not appear within the bound; the message says what to do."""


@dataclass(frozen=True)
class Waited:
    """What a wait found: the marker and how long it took (0 when it was there at once)."""

    folder: str
    marker: str
    seconds: float


def _exists(path: str) -> bool:
    if "://" in path:
        from workloads.train import storage

        return storage.exists(path)
    return os.path.exists(os.path.expanduser(path))


def found_marker(folder: str, markers: Sequence[str] = COMPLETION_MARKERS) -> str | None:
    """The first of `markers` that exists in `folder`, or None."""
    base = folder.rstrip("/")
    return next((m for m in markers if _exists(f"{base}/{m}")), None)


def wait_for_model(
    folder: str,
    *,
    timeout_s: float,
    who: str,
    writer: str,
    markers: Sequence[str] = COMPLETION_MARKERS,
    poll_s: float = POLL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = lambda line: print(line, flush=True),
) -> Waited:
    """Block until one of `markers` exists in `folder`, at most `timeout_s` seconds.

    `who` waits (``--model``, ``serving model qwen``), `writer` is what writes the marker (for
    the message). Raises ModelNotReady at the bound."""
    started = clock()
    said = started
    first = True
    while True:
        marker = found_marker(folder, markers)
        waited = clock() - started
        if marker is not None:
            payload = {"who": who, "folder": folder, "marker": marker, "seconds": waited}
            say(format_line(WAITED_PREFIX, payload))  # 0 s too: it did not have to wait
            return Waited(folder, marker, waited)
        if waited >= timeout_s:
            raise ModelNotReady(
                f"{who} {folder}: not complete after {waited:.0f}s, the stated bound "
                f"({timeout_s:.0f}s): no {' or '.join(markers)} in it. {writer} writes that "
                f"marker last; it has not finished (or it failed): see its logs, then start "
                "this again"
            )
        if first or clock() - said >= SAY_EVERY_S:
            say(
                f"{who} {folder}: waiting for {' or '.join(markers)} ({writer}); "
                f"{waited:.0f}s of at most {timeout_s:.0f}s"
            )
            said = clock()
        if first:
            payload = {"who": who, "folder": folder, "markers": list(markers)}
            say(format_line(WAITING_PREFIX, {**payload, "timeout_s": timeout_s}))
        first = False
        sleep(min(poll_s, max(timeout_s - waited, 0.0)))
