"""The contract between the workloads and whoever runs them (the infra's RayJob, `park local`).

Torch-free and Ray-free, so `infra` may import it without pulling either in. It owns:

- the training entrypoint: `python -m workloads.train --flag value ...`, rendered from field
  names of `workloads.train.config.TrainConfig` (``num_workers`` → ``--num-workers``) and read
  back the same way;
- the progress lines the training loop prints (`PARK_METRICS {json}` per report, `PARK_RESULT
  {json}` at the end) and their parser;
- the markers `python -m workloads.serve.local` prints for its caller;
- the completion markers of the model folders one job writes and another reads (a staged hub
  model, a run's export), and the line a workload prints after waiting for one;
- `free_port`, and the port torch_tpu's slice builder listens on by default.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
from collections.abc import Mapping
from typing import Any

# ---- training entrypoint --------------------------------------------------------------------

TRAIN_MODULE = "workloads.train"
TRAIN_COMMAND = ("python", "-m", TRAIN_MODULE)
# torch_tpu's TORCH_TPU_BASE_PORT default: worker i of a host listens on base + local rank.
TORCH_TPU_BASE_PORT = 8070


def flag(field: str) -> str:
    """``num_workers`` → ``--num-workers``."""
    return "--" + field.replace("_", "-")


def field_of(flag_name: str) -> str:
    """``--num-workers`` → ``num_workers``."""
    return flag_name.removeprefix("--").replace("-", "_")


def word(value: Any) -> str:
    """A value as a command-line word: floats as short as they stay exact (3e-4, 918)."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


def render_entrypoint(fields: Mapping[str, Any], command: tuple[str, ...] = TRAIN_COMMAND) -> str:
    """The command line for these TrainConfig fields (or another entrypoint's, after
    `command`), in the order given (booleans as ``--flag`` / ``--no-flag``; None values are
    left out)."""
    words = list(command)
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, bool):
            words.append(flag(name) if value else "--no-" + name.replace("_", "-"))
        else:
            words += [flag(name), word(value)]
    return shlex.join(words)


# Where a run's Hugging Face exports go, unless --export-path says otherwise: beside Ray's run
# folder, ``<storage_path>/<run_name>/export/final`` at the end of the run and
# ``.../export/step_NNNNNNNN`` for --export-every. Serving points at the final one; on GKE the
# bucket is mounted at the pods' /data, so ``gs://BUCKET/p`` is ``/data/p`` there.
EXPORT_DIR = "export"
FINAL_EXPORT = "final"


def training_export_path(
    storage_path: str, run_name: str, export_path: str | None = None, step: int | None = None
) -> str:
    """The export folder of a run: the final one, or the one of checkpoint ``step``.

    ``training_export_path("gs://b/checkpoints", "dev-park-train")`` is
    ``gs://b/checkpoints/dev-park-train/export/final``. A local storage path is expanded
    (``~``) the way the trainer expands it."""
    import os.path

    root = export_path or f"{storage_path.rstrip('/')}/{run_name}/{EXPORT_DIR}"
    if "://" not in root:
        root = os.path.abspath(os.path.expanduser(root))
    leaf = FINAL_EXPORT if step is None else f"step_{step:08d}"
    return f"{root.rstrip('/')}/{leaf}"


# ---- when a model folder is complete ----------------------------------------------------------
# A folder one job writes and another reads may be half written: a hub model being staged into
# the bucket, a run's export. Each writer writes its marker last, after every other file of the
# folder, so a reader that finds the marker finds the whole folder; a reader that starts first
# waits for it (workloads/ready.py) instead of failing.
STAGED_MARKER = ".park-staged.json"  # workloads/train/stage.py: the hub revision and its files
EXPORT_MARKER = "park_export.json"  # workloads/train/outputs/export.py: run, step, loss, source
COMPLETION_MARKERS = (STAGED_MARKER, EXPORT_MARKER)
# The Serve LLM callback a serving replica waits with (an LLMConfig's callback_config names it;
# its kwargs: timeout_s, marker, writer).
SERVE_WAIT_CALLBACK = "workloads.serve.wait:WaitForModel"


def training_export_root(storage_path: str, run_name: str, export_path: str | None = None) -> str:
    """The folder holding all of a run's exports (``final/``, ``step_N/``)."""
    return training_export_path(storage_path, run_name, export_path).rsplit("/", 1)[0]


def split_entrypoint(entrypoint: str) -> tuple[list[str], dict[str, str | None]]:
    """(the words before the first flag, ``{field: value}``); a bare flag maps to None.

    Raises ValueError when the line is not a shell command line."""
    words = shlex.split(entrypoint)
    head: list[str] = []
    while words and not words[0].startswith("--"):
        head.append(words.pop(0))
    fields: dict[str, str | None] = {}
    while words:
        name = words.pop(0)
        value = words.pop(0) if words and not words[0].startswith("--") else None
        fields[field_of(name)] = value
    return head, fields


def runs_training(head: list[str]) -> bool:
    """Whether the words before the flags run our training module."""
    return head[-2:] == ["-m", TRAIN_MODULE]


# ---- progress lines -------------------------------------------------------------------------

METRICS_PREFIX = "PARK_METRICS "
RESULT_PREFIX = "PARK_RESULT "
# A workload waiting for a model folder (workloads/ready.py): when it starts to wait,
# {"who", "folder", "markers", "timeout_s"}, and when the marker is there,
# {"who", "folder", "marker", "seconds"}.
WAITING_PREFIX = "PARK_WAITING "
WAITED_PREFIX = "PARK_WAITED "
METRICS = METRICS_PREFIX.strip()
RESULT = RESULT_PREFIX.strip()
WAITING = WAITING_PREFIX.strip()
WAITED = WAITED_PREFIX.strip()
_LINE = re.compile(rf"({METRICS}|{RESULT}|{WAITING}|{WAITED}) (\{{.*\}})\s*$")


def format_line(prefix: str, payload: Mapping[str, Any]) -> str:
    return prefix + json.dumps(dict(payload), sort_keys=True)


def parse_line(line: str) -> tuple[str, dict[str, Any]] | None:
    """``("PARK_METRICS", {...})`` for a progress line, also behind Ray's ``(pid=...)`` prefix.

    Ray forwards a worker's stdout as ``(RayTrainWorker pid=12, ip=10.0.0.1) PARK_METRICS {...}``,
    so the marker is looked for anywhere in the line, not only at its start.
    """
    match = _LINE.search(line)
    if match is None:
        return None
    try:
        return match.group(1), json.loads(match.group(2))
    except json.JSONDecodeError:
        return None


# ---- what `python -m workloads.serve.local` prints ------------------------------------------

SERVE_LOCAL_MODULE = "workloads.serve.local"
ENDPOINT_MARKER = "PARK_ENDPOINT "  # then the OpenAI base URL
RAY_ADDRESS_MARKER = "PARK_RAY_ADDRESS "  # then the GCS address it attached to
CHANGES_HEADER = "changed for CPU:"  # then one "  - <change>" line per change
CHANGE_ITEM = "  - "
SMOKE_MARKER = "smoke: "  # then the smoke request's reply
REPLY_PREFIX = "PARK_REPLY "  # then {"model", "prompt", "reply"} of the smoke request, as JSON


# ---- ports ----------------------------------------------------------------------------------

_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, and never one this process handed out before.

    Never assume a default port is free (others share the machine). The kernel may give the
    same port to two bind-and-close calls in a row; two servers given it answer each other's
    requests (seen: Ray's runtime-env agent answered by its metrics exporter with HTTP 405)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
