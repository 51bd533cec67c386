"""`park local`'s stage Job: a hub model's staging into the bucket, here from a local "hub".

On GKE the trainer reads a hub model's copy staged in the stack's bucket (resolve/disk.py), and
the stage Job that writes it starts with the RayJob, so the trainer may start first and waits
for the copy's marker (--model-wait-s, workloads/ready.py). Here the bucket is a folder of the
run (the mount path's stand-in), the hub is the tiny Llama built on this machine, and the
staging is workloads/train/stage.py's own code, run as the Job runs it, with ``--from-folder``
instead of the hub. It starts when the trainer says it is waiting (``PARK_WAITING``): the race
the stack must survive, lost on purpose, every run.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from infra.resolve import disk

STAGE_MODULE = "workloads.train.stage"
STAGE_TIMEOUT_S = 300.0


@dataclass
class LocalStaging:
    """One staged model of the run: where the stack reads it, where that is here, its hub."""

    repo: str  # the hub id the stack stages (Qwen/Qwen3-1.7B)
    mounted: str  # the trainer's --model as rendered, under the bucket mount
    local: Path  # the same folder under the run's bucket folder
    log_path: Path
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
            from workloads.train import tiny_llama

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
            command = [
                sys.executable,
                "-m",
                STAGE_MODULE,
                "--repo",
                self.repo,
                "--dest",
                str(self.local),
                "--from-folder",
                str(self.hub),
            ]
            with self.log_path.open("wb") as log:
                self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
                code = self._process.wait(timeout=STAGE_TIMEOUT_S)
            if code != 0:
                raise RuntimeError(f"{STAGE_MODULE} exited {code}; log: {self.log_path}")
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


def staged_model(
    entrypoint_model: str | None, mount_path: str, run_dir: Path
) -> LocalStaging | None:
    """The trainer's --model as rendered, when it is a staged copy in the bucket (under
    ``<mount>/models/``): where it lives in this run's bucket folder. None otherwise."""
    prefix = f"{mount_path.rstrip('/')}/{disk.MODELS_PREFIX}/"
    if not entrypoint_model or not entrypoint_model.startswith(prefix):
        return None
    repo = entrypoint_model.removeprefix(prefix)
    local = run_dir / "bucket" / entrypoint_model.removeprefix(mount_path.rstrip("/") + "/")
    return LocalStaging(repo, entrypoint_model, local, run_dir / "stage.log")
