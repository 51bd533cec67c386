"""`park local`'s stage Job: a hub model's staging into the bucket, here from a local "hub".

On GKE the trainer reads a hub model's copy staged in the stack's bucket (resolve/disk.py), and
the stage Job that writes it starts with the RayJob, so the trainer may start first and waits
for the copy's marker (--model-wait-s, workloads/ready.py). Here the bucket is the emulated
one (bucket.py: every call judged against the stack's roles), the hub is the tiny Llama built
on this machine, and the staging is the rendered Job's own command, with ``--from-folder``
instead of the hub and the gate as its ``STORAGE_EMULATOR_HOST``. The trainer reads the copy
through the bucket's folder, the FUSE mount's stand-in. It starts when the trainer says it is
waiting (``PARK_WAITING``): the race the stack must survive, lost on purpose, every run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.plan.kubelet import as_run
from infra.resolve import disk
from infra.tools.local.bucket import EmulatedBucket

STAGE_TIMEOUT_S = 300.0


@dataclass
class LocalStaging:
    """One staged model of the run: where the stack reads it, where that is here, its hub."""

    repo: str  # the hub id the stack stages (Qwen/Qwen3-1.7B)
    mounted: str  # the trainer's --model as rendered, under the bucket mount
    local: Path  # the same folder under the emulated bucket's folder (the mount's stand-in)
    log_path: Path
    command: list[str]  # the rendered stage Job's container command, as the kubelet runs it
    env: dict[str, str]  # the emulated bucket's gate for the staging
    hub: Path | None = None  # the local hub folder: the tiny Llama, built here
    started: float | None = None
    seconds: float | None = None  # how long the staging took
    error: str | None = None
    _builder: threading.Thread | None = None
    _process: subprocess.Popen[bytes] | None = None
    _done: threading.Event = field(default_factory=threading.Event)

    def build_hub(self) -> None:
        """Build the local hub's model (the tiny Llama's config and tokenizer) in a thread:
        the model exists on the hub before anything starts."""

        def build() -> None:
            from workloads.train.models import tiny_llama

            self.hub = tiny_llama.build()

        self._builder = threading.Thread(target=build, name="park-local-hub", daemon=True)
        self._builder.start()

    def wait_hub(self) -> None:
        """Until the hub's model is built (see `hub`)."""
        if self._builder is not None:
            self._builder.join()

    def start(self) -> None:
        """Start the stage Job's command on the hub folder (once; later calls do nothing)."""
        if self.started is not None:
            return
        self.started = time.monotonic()
        threading.Thread(target=self._run, name="park-local-stage", daemon=True).start()

    def _run(self) -> None:
        assert self.started is not None
        try:
            self.wait_hub()
            if self.hub is None:
                raise RuntimeError("the local hub model could not be built")
            command = [*local_command(self.command), "--from-folder", str(self.hub)]
            env = {**os.environ, **self.env}
            with self.log_path.open("wb") as log:
                self._process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=env
                )
                code = self._process.wait(timeout=STAGE_TIMEOUT_S)
            if code != 0:
                tail = self.log_path.read_text(errors="replace").strip().splitlines()[-1:]
                raise RuntimeError(
                    f"the stage Job's command exited {code}: {' '.join(tail)} "
                    f"(log: {self.log_path})"
                )
            self.seconds = time.monotonic() - self.started
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as err:
            self.error = str(err)
        finally:
            self._done.set()

    def wait(self, timeout_s: float = STAGE_TIMEOUT_S) -> None:
        """Until the staging ended; raise RuntimeError if it failed."""
        if self.started is None:
            return
        self._done.wait(timeout_s)
        if self.error:
            raise RuntimeError(f"staging {self.repo} into {self.local}: {self.error}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()


def local_command(command: list[str]) -> list[str]:
    """A rendered container command as this machine runs it: the kubelet's reading of each
    word, and this interpreter for `python`."""
    words = [as_run(word) for word in command]
    return [sys.executable if i == 0 and w == "python" else w for i, w in enumerate(words)]


def stage_command(stage_jobs: list[dict[str, Any]], repo: str) -> list[str] | None:
    """The container command of the rendered stage Job for hub model `repo`, or None."""
    for job in stage_jobs:
        for container in job["spec"]["template"]["spec"]["containers"]:
            command = [str(w) for w in container.get("command") or []]
            if "--repo" in command and as_run(command[command.index("--repo") + 1]) == repo:
                return command
    return None


def staged_model(
    entrypoint_model: str | None,
    mount_path: str,
    stage_jobs: list[dict[str, Any]],
    bucket: EmulatedBucket,
    run_dir: Path,
) -> LocalStaging | None:
    """The trainer's --model as rendered, when it is a staged copy in the bucket (under
    ``<mount>/models/``): the stack's Job that stages it, and where the copy shows in the
    emulated bucket's folder. None otherwise."""
    prefix = f"{mount_path.rstrip('/')}/{disk.MODELS_PREFIX}/"
    if not entrypoint_model or not entrypoint_model.startswith(prefix):
        return None
    repo = entrypoint_model.removeprefix(prefix)
    command = stage_command(stage_jobs, repo)
    if command is None:
        raise RuntimeError(f"the stack reads {entrypoint_model} but renders no Job staging {repo}")
    dest = as_run(command[command.index("--dest") + 1])
    return LocalStaging(
        repo,
        entrypoint_model,
        bucket.mounted(dest),
        run_dir / "stage.log",
        command=command,
        env=bucket.env("staging"),
    )
