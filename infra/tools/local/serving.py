"""`park local`'s serving half: the RayService's serveConfigV2 run by `python -m
workloads.serve.local` (its CPU profile: workloads/serve/cpu_profile.py) against the run's Ray,
its output followed in a thread while training runs beside it, and the waits its replicas
printed."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape

from infra.tools.local import console as console_out
from infra.tools.local.answers import check_local_model
from infra.tools.local.outcome import LocalRun, Outcome
from infra.tools.local.ray_head import LocalRay, LocalRunError, ray_auth_env
from infra.tools.outdir import open_new, write_new
from workloads import protocol

SERVE_TIMEOUT_S = 1800.0


TITLE = "serving: the RayService's serveConfigV2 on Ray Serve LLM + vLLM (CPU)"
# The serving driver's priority: below the training workers' (Ray starts those at 0,
# workloads/train/launcher.py), so its checks (which import vLLM) take the CPU they leave.
SERVE_NICENESS = 10


def serve(run: LocalRun, rayservice: dict[str, Any], *, keep: bool, trained: list[str]) -> None:
    """Deploy the RayService's serveConfigV2 with the serving workload's CPU profile and ask
    each model one question; a model that serves a run (`trained`) serves this run's export,
    which exists (`park local rl`)."""
    serving = start_serving(run, rayservice, keep=keep, trained=trained)
    try:
        serving.finish(run, keep=keep, summary=False)
    finally:
        serving.stop()


def served_ids(serve_config_text: str) -> list[str]:
    """The model ids of every LLM app of a serveConfigV2, in order."""
    return [
        str(llm.get("model_loading_config", {}).get("model_id"))
        for app in (yaml.safe_load(serve_config_text) or {}).get("applications") or []
        for llm in ((app.get("args") or {}).get("llm_configs") or [])
        if isinstance(llm, dict)
    ]


def serve_command(
    config_path: Path,
    address: str,
    outcome: Outcome,
    *,
    keep: bool,
    wait_for_model: bool,
    config_from: str | None,
    prompt_file: Path | None = None,
) -> list[str]:
    """`python -m workloads.serve.local` on the rendered serveConfigV2: every model served,
    each asked one question; those that serve the run (`outcome.trained_models`) from its
    export (still being written with `wait_for_model`), the others from the tiny model."""
    command = [
        sys.executable,
        "-m",
        protocol.SERVE_LOCAL_MODULE,
        "--serve-config",
        str(config_path),
        "--address",
        address,
        "--smoke",
        "--timeout",
        str(int(SERVE_TIMEOUT_S)),
    ]
    if outcome.trained_models and outcome.export:
        for model in outcome.trained_models:
            command += ["--serve-from", f"{model}={outcome.export}"]
        if prompt_file is not None:  # the question is picked while serving starts
            command += ["--prompt-file", str(prompt_file)]
        else:
            command += ["--prompt", outcome.question or ""]
        if wait_for_model:
            command += ["--wait-for-model", "--config-from", str(config_from)]
    if keep:
        command.append("--keep")
    return command


def start_serving(
    run: LocalRun,
    rayservice: dict[str, Any],
    *,
    keep: bool,
    trained: list[str],
    wait_for_model: bool = False,
    config_from: str | None = None,
    prompt_file: Path | None = None,
) -> ServingRun:
    """Start `python -m workloads.serve.local` on the RayService's serveConfigV2 and follow its
    output in a thread. A model that serves a run (`trained`) serves `outcome.export`; with
    `wait_for_model` that export is still being written, its replica waits for it, and the
    serving section is held until `finish` (or `show`): the job's section prints first."""
    ray, run_dir, console, outcome = run.ray, run.run_dir, run.console, run.outcome
    text = (rayservice.get("spec") or {}).get("serveConfigV2")
    if not isinstance(text, str):
        raise LocalRunError("the RayService has no serveConfigV2")
    config_path = run_dir / "serveConfigV2.yaml"
    write_new(config_path, text)
    models = served_ids(text)
    outcome.trained_models = [m for m in trained if m in models] if outcome.export else []
    if outcome.trained_models and not wait_for_model:
        check_local_model(str(outcome.export), console)
    command = serve_command(
        config_path,
        ray.gcs_address,
        outcome,
        keep=keep,
        wait_for_model=wait_for_model,
        config_from=config_from,
        prompt_file=prompt_file,
    )
    stderr_path = run_dir / "serve.log"
    # The pods' Ray env here too: cpu_profile reads direct streaming from it.
    env = {**os.environ, **ray.env, **ray_auth_env(), "PYTHONUNBUFFERED": "1"}
    with open_new(stderr_path) as stderr:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            cwd=run_dir,
            start_new_session=True,  # park forwards Ctrl-C as SIGTERM, once
        )
    with suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, process.pid, SERVE_NICENESS)
    serving = ServingRun(process, stderr_path, time.monotonic(), models, console)
    if wait_for_model:
        serving.hold()
        console.print(
            f"serving started beside the job ({', '.join(models)}; its replica waits for the "
            f"run's export, {protocol.EXPORT_MARKER}, inside its start): its section follows",
            highlight=False,
            soft_wrap=True,
        )
    serving.say(lambda: console_out.section(console, outcome, TITLE))
    serving.say(lambda: _intro(console, config_path, command, outcome, wait_for_model))
    serving.follow(run)
    return serving


def _intro(
    console: Console, config_path: Path, command: list[str], outcome: Outcome, waits: bool
) -> None:
    console.print(f"serveConfigV2 (as rendered): {config_path}", highlight=False)
    console.print(f"running: {escape(shlex.join(command))}", highlight=False, soft_wrap=True)
    if waits:
        console.print(
            "started with the job: its replica waits for the run's export "
            f"({protocol.EXPORT_MARKER} in {outcome.export}) inside its start",
            highlight=False,
            soft_wrap=True,
        )


@dataclass
class ServingRun:
    """The serving subprocess, its output followed in a thread (it runs beside training):
    printed as it comes, or held while the job's section prints (`hold`, `show`)."""

    process: subprocess.Popen[str]
    stderr_path: Path
    started: float
    models: list[str]  # every model it serves: each answers once
    console: Console
    ready: threading.Event = field(default_factory=threading.Event)
    _held: list[Callable[[], None]] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def hold(self) -> None:
        """Keep what it prints until `show`."""
        with self._lock:
            if self._held is None:
                self._held = []

    def say(self, show: Callable[[], None]) -> None:
        """Print now, or after what is held."""
        with self._lock:
            if self._held is not None:
                self._held.append(show)
                return
            show()

    def show(self) -> None:
        """Print what was held (its section, opened now), then what comes as it comes."""
        with self._lock:
            held, self._held = self._held or [], None
            for show in held:
                show()

    def follow(self, run: LocalRun) -> None:
        """Echo its output; note its CPU changes, endpoint and each model's reply. Its
        machine-readable lines are read, not echoed; after the last answer nothing is."""
        console, outcome = run.console, run.outcome

        def echo(text: str) -> None:
            self.say(lambda: console.print(text, highlight=False, soft_wrap=True))

        def read() -> None:
            assert self.process.stdout is not None
            in_changes = False
            try:
                for raw in self.process.stdout:
                    line = raw.rstrip("\n")
                    if self.ready.is_set():
                        continue  # it answered: what follows is its own "serving..." note
                    if line.startswith(protocol.CHANGES_HEADER):
                        in_changes = True
                        echo(f"{line[:-1]} (workloads/serve/cpu_profile.py):")
                        continue
                    if in_changes and line.startswith(protocol.CHANGE_ITEM):
                        outcome.changes.append(f"serving: {line[len(protocol.CHANGE_ITEM) :]}")
                        echo(escape(line))
                        continue
                    in_changes = False
                    if line.startswith(protocol.ENDPOINT_MARKER):
                        outcome.endpoint = line.split(" ", 1)[1].strip()
                        continue
                    if line.startswith(protocol.RAY_ADDRESS_MARKER):
                        continue  # the Ray it attached to: ours
                    if line.startswith(protocol.REPLY_PREFIX):
                        self._answered(outcome, json.loads(line[len(protocol.REPLY_PREFIX) :]))
                        continue
                    echo(f"  {escape(line)}")
                    if line.startswith(protocol.SMOKE_MARKER):
                        outcome.smoke = line
                        if all(m in outcome.replies for m in self.models):
                            outcome.serve_seconds = time.monotonic() - self.started
                            self.ready.set()
            finally:
                self.ready.set()  # it ended without answering: finish() says so

        threading.Thread(target=read, name="park-local-serve", daemon=True).start()

    @staticmethod
    def _answered(outcome: Outcome, answer: dict[str, Any]) -> None:
        model, reply = str(answer.get("model")), str(answer.get("reply"))
        outcome.replies[model] = reply
        outcome.prompt = answer.get("prompt")
        first = (outcome.trained_models or [model])[0]
        if model == first or outcome.reply is None:
            outcome.reply = reply

    def finish(
        self,
        run: LocalRun,
        *,
        keep: bool,
        on_ready: Callable[[Outcome, Console], None] | None = None,
        summary: bool = True,
    ) -> None:
        """Show its section, wait for every model's answer, then `on_ready`, the replicas'
        waits and (with `summary`, or `keep`) the summary; with `keep`, serve until Ctrl-C.
        Raises LocalRunError when it ended without answering."""
        console, outcome, ray = run.console, run.outcome, run.ray
        self.show()
        try:
            self.ready.wait(SERVE_TIMEOUT_S + 120)
            if outcome.smoke is not None:
                for record in replica_waits(ray):
                    if record not in outcome.waits:
                        outcome.waits.append(record)
                        line = console_out.waited_line(record)
                        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
                if on_ready is not None:
                    on_ready(outcome, console)
                if summary or keep:
                    console_out.summary(console, outcome, ray, run.run_dir, keep=keep)
                if keep:
                    console_out.try_it(console, outcome)
                # without --keep it shuts its deployment down and exits by itself
                self.process.wait(timeout=None if keep else 180)
        except subprocess.TimeoutExpired:
            console.print("serving did not stop by itself: stopping it", highlight=False)
        except KeyboardInterrupt:
            console.print("interrupted: stopping the deployment", highlight=False)
        finally:
            self.stop()
        if self.process.returncode not in (0, -signal.SIGTERM) or outcome.smoke is None:
            tail = "\n".join(self.stderr_path.read_text().splitlines()[-30:])
            console.print(escape(tail), highlight=False)
            raise LocalRunError(
                f"serving failed (exit {self.process.returncode}); log: {self.stderr_path}"
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


# What a replica's log may hold at most for us to read it (the waits it printed).
_REPLICA_LOG_BYTES = 20 * 1024**2
_REPLICA_LOGS = 400


def replica_waits(ray: LocalRay) -> list[dict[str, Any]]:
    """The PARK_WAITED lines the serving replicas printed (workloads/ready.py): in the replica's
    Serve log when Serve redirects its prints, else in its worker's stdout, both kept in the
    session's logs (bounded: the first files, the small ones)."""
    logs = ray.temp_dir / "session_latest" / "logs"
    found: list[dict[str, Any]] = []
    paths = sorted(logs.glob("serve/replica_*.log")) + sorted(logs.glob("worker-*.out"))
    for path in paths[:_REPLICA_LOGS]:
        with suppress(OSError):
            if path.stat().st_size > _REPLICA_LOG_BYTES:
                continue
            for line in path.read_text(errors="replace").splitlines():
                parsed = protocol.parse_line(line)
                if parsed and parsed[0] == protocol.WAITED and parsed[1] not in found:
                    found.append(parsed[1])
    return found
