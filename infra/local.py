"""`park local`: the stack's own RayJob and RayService on a local Ray, on this machine's CPU.

What runs is what KubeRay would run, taken from the rendered manifests, with the changes CPU
needs made in two visible places and printed:

- training: `TRAIN_CPU_PROFILE` below rewrites flags of the RayJob's `entrypoint` (gloo instead
  of the TPU, 2 workers, the tiny model, a few dozen steps, a local folder for checkpoints); the
  `runtimeEnvYAML` goes through unchanged. Both are submitted through the Ray Jobs API, as
  KubeRay's submitter does (`ray job submit --runtime-env-json ... -- <entrypoint>`).
- serving: the RayService's `serveConfigV2` goes unchanged to `python -m workloads.serve.local`,
  whose `workloads/serve/cpu_profile.py` makes (and prints) the CPU changes: no accelerator, the
  tiny local model, vLLM's CPU knobs. It attaches to the same Ray and answers one chat completion.

infra never imports workloads: training is an entrypoint string run by Ray, serving a module run
as a subprocess. The Ray head runs in a private temp dir on free ports (others may run Ray on
this machine) and is stopped by its process id at the end, unless --keep.
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.plan.ray import TRAIN_MODULE

# ---------------------------------------------------------------------------------------------
# The CPU profile of the training job: every change to the RayJob's entrypoint, in one place.
# flag -> (new value, or None to drop the flag; why). "{storage}" is this run's local folder.

TRAIN_CPU_PROFILE: dict[str, tuple[str | None, str]] = {
    "--accelerator": ("cpu", "no TPU here: torch on CPU, gloo process group"),
    "--num-workers": ("2", "two Ray Train workers on this machine"),
    "--tpu-topology": (None, "no TPU slice"),
    "--tpu-accelerator-type": (None, "no TPU slice"),
    "--torch-tpu-topology": (None, "no TPU slice"),
    "--chips-per-host": (None, "no TPU slice"),
    "--num-slices": (None, "no TPU slice"),
    "--peak-tflops-per-device": (None, "a TPU peak; MFU on CPU is not meaningful"),
    "--model-size": ("tiny", "a model a CPU trains in seconds"),
    "--steps": ("30", "a few dozen steps"),
    "--global-batch-size": ("4", "2 sequences per worker"),
    "--seq-len": ("64", "short sequences"),
    "--checkpoint-every": ("10", "checkpoints within 30 steps"),
    "--report-every": ("5", "progress every 5 steps"),
    "--max-failures": ("0", "fail fast instead of retrying"),
    "--storage-path": ("{storage}", "a local folder instead of the bucket"),
}
# The local Ray: what the RayJob's cluster would have had as TPU hosts, CPU here.
RAY_NUM_CPUS = max(4, os.cpu_count() or 1)  # logical CPUs: 2 train workers, or LLM server (2)
RAY_OBJECT_STORE_BYTES = 400 * 1024**2
TRAIN_TIMEOUT_S = 1800.0
SERVE_TIMEOUT_S = 1800.0
SERVE_MODULE = "workloads.serve.local"
_LINE = re.compile(r"(PARK_METRICS|PARK_RESULT) (\{.*\})\s*$")


class LocalRunError(RuntimeError):
    """The local run failed; the message says at which step and where the logs are."""


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, and never one this process handed out before.

    Never assume Ray's defaults are free here. The kernel may give the same port to two
    bind-and-close calls in a row; Ray then starts two servers on it (seen: the runtime-env
    agent's requests answered by the metrics exporter with HTTP 405)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


# ---------------------------------------------------------------------------------------------
# Training: the RayJob's entrypoint, on CPU


def cpu_entrypoint(entrypoint: str, storage: str) -> tuple[str, list[str]]:
    """Apply TRAIN_CPU_PROFILE to a rendered RayJob entrypoint; return it and what changed."""
    words = shlex.split(entrypoint)
    if TRAIN_MODULE not in words:
        raise LocalRunError(f"the RayJob entrypoint does not run {TRAIN_MODULE}: {entrypoint!r}")
    start = words.index(TRAIN_MODULE) + 1
    head, rest = words[:start], words[start:]
    pairs: list[tuple[str, str | None]] = []
    while rest:
        flag = rest.pop(0)
        value = rest.pop(0) if rest and not rest[0].startswith("--") else None
        pairs.append((flag, value))
    changes: list[str] = []
    out: list[tuple[str, str | None]] = []
    seen = set()
    for flag, value in pairs:
        seen.add(flag)
        if flag not in TRAIN_CPU_PROFILE:
            out.append((flag, value))
            continue
        new, why = TRAIN_CPU_PROFILE[flag]
        new = None if new is None else new.format(storage=storage)
        if new is None:
            changes.append(f"{flag} {value}: dropped ({why})")
            continue
        if new != value:
            changes.append(f"{flag} {value} -> {new} ({why})")
        out.append((flag, new))
    for flag, (new, why) in TRAIN_CPU_PROFILE.items():
        if flag not in seen and new is not None:
            new = new.format(storage=storage)
            changes.append(f"{flag} {new}: added ({why})")
            out.append((flag, new))
    parts = list(head)
    for flag, value in out:
        parts += [flag] if value is None else [flag, value]
    return shlex.join(parts), changes


def runtime_env_of(rayjob: dict[str, Any]) -> dict[str, Any]:
    """The RayJob's runtimeEnvYAML as the runtime_env the Jobs API takes (unchanged)."""
    text = (rayjob.get("spec") or {}).get("runtimeEnvYAML") or "{}"
    env = yaml.safe_load(text) or {}
    if not isinstance(env, dict):
        raise LocalRunError("the RayJob's runtimeEnvYAML is not a mapping")
    return env


def parse_progress(line: str) -> tuple[str, dict[str, Any]] | None:
    """("PARK_METRICS" | "PARK_RESULT", data) for a training progress line, else None."""
    match = _LINE.search(line)
    if not match:
        return None
    try:
        return match.group(1), json.loads(match.group(2))
    except json.JSONDecodeError:
        return None


def _fmt(value: Any, spec: str = ",.1f") -> str:
    return "n/a" if value is None else format(value, spec)


def metrics_line(data: dict[str, Any], total_steps: int) -> str:
    mfu = data.get("mfu")
    return (
        f"step {data.get('step')}/{total_steps}  loss {_fmt(data.get('loss'), '.4f')}  "
        f"tokens/s {_fmt(data.get('tokens_per_s'))} "
        f"({_fmt(data.get('tokens_per_s_per_worker'))}/worker)  "
        f"mfu {'n/a' if mfu is None else f'{mfu:.1%}'}"
    )


# ---------------------------------------------------------------------------------------------
# The local Ray head


@dataclass
class LocalRay:
    """A private Ray head: `ray start --head --block` on free ports, stopped by its pid."""

    temp_dir: Path
    log_path: Path
    gcs_port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def command(self) -> list[str]:
        base = random.randrange(20000, 31000, 500)  # workers: a window others are unlikely to use
        ports = {
            "--port": self.gcs_port,
            "--dashboard-port": self.dashboard_port,
            "--ray-client-server-port": free_port(),
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--runtime-env-agent-port": free_port(),
            "--metrics-export-port": free_port(),
            "--min-worker-port": base,
            "--max-worker-port": base + 499,
        }
        ray = Path(sys.executable).with_name("ray")
        return [
            str(ray) if ray.exists() else "ray",
            "start",
            "--head",
            "--block",
            "--node-ip-address=127.0.0.1",
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            f"--num-cpus={RAY_NUM_CPUS}",
            f"--object-store-memory={RAY_OBJECT_STORE_BYTES}",
            f"--temp-dir={self.temp_dir}",
            "--disable-usage-stats",
            *[f"{flag}={port}" for flag, port in ports.items()],
        ]

    def start(self, timeout_s: float = 300) -> None:
        env = {**os.environ, **ray_auth_env()}
        # The entrypoint says `python`: make it this interpreter (the one with workloads).
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        # On a busy 2-core machine the dashboard agent can take over a minute to come up; the
        # raylet would give up on it and crash the node.
        env.setdefault("RAY_agent_register_timeout_ms", "600000")
        env.setdefault("RAY_DASHBOARD_STARTUP_TIMEOUT_S", "600")
        env["PYTHONUNBUFFERED"] = "1"
        with self.log_path.open("wb") as log:
            # Own session: a Ctrl-C in the terminal reaches park, which stops Ray in order.
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.temp_dir,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise LocalRunError(
                    f"ray start exited with {self.process.returncode}; see {self.log_path}"
                )
            try:
                with urllib.request.urlopen(f"{self.dashboard_url}/api/version", timeout=5):
                    return
            except urllib.error.HTTPError:
                return  # it answers (e.g. 401 before a token is shown): it is up
            except (OSError, ValueError):
                pass
            time.sleep(1)
        raise LocalRunError(
            f"Ray's dashboard did not answer in {timeout_s:.0f}s; see {self.log_path}"
        )

    def stop(self) -> None:
        """SIGTERM our `ray start --block`, which stops the processes it started; then any of
        ours left (found by our temp dir in their command line), by pid."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        for pid in _pids_mentioning(str(self.temp_dir)):
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)


def ray_auth_env() -> dict[str, str]:
    """Token authentication with a token private to this run, for the head and every client.

    Ray 2.60 turns token auth on by itself when ~/.ray/auth_token exists, and then clients that
    do not find the token are refused. A token of our own, in the environment of the head, of
    this process (the Jobs API client) and of the serving subprocess, works either way.
    """
    global _TOKEN
    if _TOKEN is None:
        _TOKEN = secrets.token_hex(32)
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": _TOKEN}


_TOKEN: str | None = None


def _pids_mentioning(text: str) -> list[int]:
    """Processes whose command line contains `text` (our private temp dir), except us."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        with suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="ignore")
            if text in cmdline and int(entry.name) != os.getpid():
                pids.append(int(entry.name))
    return pids


# ---------------------------------------------------------------------------------------------
# The run


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
    changes: list[str] = field(default_factory=list)


def run_dir_for(stack: str) -> Path:
    """Where a run keeps its checkpoints and logs: `$PARK_CACHE_DIR` or ~/.cache/park-gke."""
    root = Path(os.environ.get("PARK_CACHE_DIR") or Path.home() / ".cache" / "park-gke")
    return root / "local-runs" / f"{stack}-{time.strftime('%Y%m%d-%H%M%S')}"


def _manifest(rendered: Any, kind: str) -> dict[str, Any] | None:
    found = [m for m in rendered.manifests() if m.get("kind") == kind]
    return found[0] if found else None


def run_local(rendered: Any, *, only: str | None, keep: bool, console: Console) -> Outcome:
    """Train and/or serve the rendered stack on a local Ray; raise LocalRunError on failure."""
    stack = rendered.config.stack
    rayjob = _manifest(rendered, "RayJob") if only != "serve" else None
    rayservice = _manifest(rendered, "RayService") if only != "train" else None
    if rayjob is None and rayservice is None:
        raise LocalRunError(
            f"stack {stack} has nothing to run"
            + (f" for --only {only}" if only else "")
            + ": enable park:training and/or park:serving"
        )
    run_dir = run_dir_for(stack)
    run_dir.mkdir(parents=True, exist_ok=True)
    outcome = Outcome()
    console.print(
        f"[bold]park local {escape(stack)}[/]: the stack's "
        + " and ".join(
            n for n, m in (("RayJob", rayjob), ("RayService", rayservice)) if m is not None
        )
        + f" on a local Ray (CPU); run folder {run_dir}",
        highlight=False,
    )
    # SIGTERM (kill, a supervisor) stops the run as Ctrl-C does: Ray goes down in order.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with _local_ray(run_dir, console) as ray:
            try:
                if rayjob is not None:
                    _train(rayjob, ray, run_dir, console, outcome)
                if rayservice is not None:
                    _serve(rayservice, ray, run_dir, console, outcome, keep=keep, stack=stack)
                else:
                    _summary(console, outcome, ray, run_dir, keep=False)
            except KeyboardInterrupt:
                console.print("interrupted: stopping", highlight=False)
                raise LocalRunError("interrupted before the run finished") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    return outcome


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def _local_ray(run_dir: Path, console: Console) -> Iterator[LocalRay]:
    # Short path: Ray's unix sockets live under the temp dir (107-byte limit).
    temp_dir = Path(tempfile.mkdtemp(prefix="park-ray-", dir="/tmp"))
    ray = LocalRay(temp_dir=temp_dir, log_path=run_dir / "ray-start.log")
    with console.status("starting a local Ray head..."):
        started = time.monotonic()
        try:
            ray.start()
        except BaseException:
            ray.stop()
            raise
    console.print(
        f"Ray head up in {time.monotonic() - started:.0f}s: GCS {ray.gcs_address}, "
        f"dashboard {ray.dashboard_url} (no Kubernetes: one node, {RAY_NUM_CPUS} logical CPUs)",
        highlight=False,
    )
    ok = False
    try:
        yield ray
        ok = True
    finally:
        with console.status("stopping Ray..."):
            ray.stop()
        if ok:
            shutil.rmtree(temp_dir, ignore_errors=True)
            console.print("Ray stopped.", highlight=False)
        else:
            console.print(f"Ray stopped; its logs are kept in {temp_dir}", highlight=False)


def _print_changes(console: Console, title: str, changes: list[str]) -> None:
    console.print(title, highlight=False)
    for change in changes:
        console.print(f"  - {escape(change)}", highlight=False, soft_wrap=True)


def _train(
    rayjob: dict[str, Any], ray: LocalRay, run_dir: Path, console: Console, outcome: Outcome
) -> None:
    """Submit the RayJob's entrypoint + runtime env through the Jobs API; stream progress."""
    os.environ.update(ray_auth_env())  # before Ray reads it: the client sends our token
    from ray.job_submission import JobStatus, JobSubmissionClient

    storage = str(run_dir / "checkpoints")
    entrypoint, changes = cpu_entrypoint(rayjob["spec"]["entrypoint"], storage)
    runtime_env = runtime_env_of(rayjob)
    outcome.changes += [f"training: {c}" for c in changes]
    console.rule("1. training: the RayJob's entrypoint through the Ray Jobs API")
    _print_changes(console, "changed for CPU (infra/local.py TRAIN_CPU_PROFILE):", changes)
    console.print(f"runtime_env (runtimeEnvYAML, unchanged): {json.dumps(runtime_env)}")
    console.print(f"entrypoint: {escape(entrypoint)}", highlight=False, soft_wrap=True)
    total = int(TRAIN_CPU_PROFILE["--steps"][0] or 0)
    client = JobSubmissionClient(ray.dashboard_url)
    started = time.monotonic()
    job_id = _submit(client, entrypoint, runtime_env)
    outcome.train_job = job_id
    console.print(f"submitted job {job_id}; waiting for its progress...", highlight=False)
    seen = 0
    log_path = run_dir / "train.log"
    status = None
    try:
        while True:
            status = client.get_job_status(job_id)
            logs = client.get_job_logs(job_id)
            lines = logs.splitlines()
            for line in lines[seen:]:
                parsed = parse_progress(line)
                if parsed and parsed[0] == "PARK_METRICS":
                    last = (outcome.last_metrics or {}).get("step")
                    outcome.last_metrics = parsed[1]
                    if parsed[1].get("step") != last:  # Ray may forward a line twice
                        console.print(f"  {metrics_line(parsed[1], total)}", highlight=False)
                elif parsed:
                    outcome.trained = parsed[1]
            seen = len(lines)
            if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                break
            if time.monotonic() - started > TRAIN_TIMEOUT_S:
                client.stop_job(job_id)
                raise LocalRunError(f"training did not finish in {TRAIN_TIMEOUT_S:.0f}s")
            time.sleep(1)
    except KeyboardInterrupt:
        with suppress(Exception):
            client.stop_job(job_id)
        raise
    finally:
        with suppress(Exception):
            log_path.write_text(client.get_job_logs(job_id))
    outcome.train_seconds = time.monotonic() - started
    if status != JobStatus.SUCCEEDED or not outcome.trained:
        tail = "\n".join(log_path.read_text().splitlines()[-30:]) if log_path.exists() else ""
        console.print(escape(tail), highlight=False)
        raise LocalRunError(f"training job {job_id} ended {status}; full log: {log_path}")
    result = outcome.trained
    console.print(
        f"training {result.get('status')} in {outcome.train_seconds:.0f}s: step "
        f"{result.get('final_step')}, loss {_fmt(result.get('final_loss'), '.4f')}, "
        f"checkpoint {result.get('checkpoint_path')}",
        highlight=False,
        soft_wrap=True,
    )


def _submit(client: Any, entrypoint: str, runtime_env: dict[str, Any]) -> str:
    """Submit, retrying while the head's job agent comes up (it may lag the dashboard)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return str(client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env))
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(3)


def _serve(
    rayservice: dict[str, Any],
    ray: LocalRay,
    run_dir: Path,
    console: Console,
    outcome: Outcome,
    *,
    keep: bool,
    stack: str,
) -> None:
    """Deploy the RayService's serveConfigV2 with the serving workload's CPU profile."""
    text = (rayservice.get("spec") or {}).get("serveConfigV2")
    if not isinstance(text, str):
        raise LocalRunError("the RayService has no serveConfigV2")
    config_path = run_dir / "serveConfigV2.yaml"
    config_path.write_text(text)
    models = [
        llm.get("model_loading_config", {}).get("model_id")
        for app in (yaml.safe_load(text) or {}).get("applications") or []
        for llm in ((app.get("args") or {}).get("llm_configs") or [])
        if isinstance(llm, dict)
    ]
    command = [
        sys.executable,
        "-m",
        SERVE_MODULE,
        "--serve-config",
        str(config_path),
        "--address",
        ray.gcs_address,
        "--smoke",
        "--timeout",
        str(int(SERVE_TIMEOUT_S)),
    ]
    if len(models) > 1:  # each vLLM on CPU takes 2 CPUs and GBs: serve the first one
        command += ["--model", str(models[0])]
    if keep:
        command.append("--keep")
    console.rule("2. serving: the RayService's serveConfigV2 on Ray Serve LLM + vLLM (CPU)")
    console.print(f"serveConfigV2 (as rendered): {config_path}", highlight=False)
    console.print(f"running: {escape(shlex.join(command))}", highlight=False, soft_wrap=True)
    stderr_path = run_dir / "serve.log"
    started = time.monotonic()
    env = {**os.environ, **ray_auth_env(), "PYTHONUNBUFFERED": "1"}
    with stderr_path.open("w") as stderr:
        process = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            cwd=run_dir,
            start_new_session=True,  # park forwards Ctrl-C as SIGTERM, once
        )
        try:
            _follow_serve(process, console, outcome, ray, run_dir, keep=keep, started=started)
        except KeyboardInterrupt:
            console.print("interrupted: stopping the deployment", highlight=False)
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    if process.returncode not in (0, -signal.SIGTERM) or outcome.smoke is None:
        tail = "\n".join(stderr_path.read_text().splitlines()[-30:])
        console.print(escape(tail), highlight=False)
        raise LocalRunError(
            f"serving {stack} failed (exit {process.returncode}); log: {stderr_path}"
        )


def _follow_serve(
    process: subprocess.Popen[str],
    console: Console,
    outcome: Outcome,
    ray: LocalRay,
    run_dir: Path,
    *,
    keep: bool,
    started: float,
) -> None:
    """Echo the serving process' output; note its endpoint and smoke reply; print the summary."""
    assert process.stdout is not None
    in_changes = False
    for raw in process.stdout:
        line = raw.rstrip("\n")
        if line.startswith("changed for CPU"):
            in_changes = True
            console.print(f"{line[:-1]} (workloads/serve/cpu_profile.py):", highlight=False)
            continue
        if in_changes and line.startswith("  - "):
            outcome.changes.append(f"serving: {line[4:]}")
            console.print(escape(line), highlight=False, soft_wrap=True)
            continue
        in_changes = False
        if line.startswith("PARK_ENDPOINT "):
            outcome.endpoint = line.split(" ", 1)[1].strip()
        if line.startswith("smoke:"):
            outcome.smoke = line
            outcome.serve_seconds = time.monotonic() - started
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
        if line.startswith("smoke:"):
            _summary(console, outcome, ray, run_dir, keep=keep)
            if keep:
                console.print("serving until Ctrl-C...", highlight=False)
    process.wait()


def _summary(
    console: Console, outcome: Outcome, ray: LocalRay, run_dir: Path, *, keep: bool
) -> None:
    console.rule("3. summary")
    table = Table(show_header=False, box=None)
    table.add_column("what", style="bold")
    table.add_column("")
    table.add_row("Ray", f"local head {ray.gcs_address}, dashboard {ray.dashboard_url}")
    if outcome.trained is not None:
        result = outcome.trained
        metrics = outcome.last_metrics or {}
        table.add_row(
            "training",
            f"job {outcome.train_job} {result.get('status')} in {outcome.train_seconds:.0f}s: "
            f"{result.get('num_workers')} {result.get('accelerator')} workers, "
            f"{result.get('strategy')}, step {result.get('final_step')}, "
            f"loss {_fmt(result.get('final_loss'), '.4f')}, "
            f"{_fmt(metrics.get('tokens_per_s'))} tokens/s",
        )
        table.add_row("checkpoint", str(result.get("checkpoint_path")))
    if outcome.endpoint is not None:
        table.add_row("endpoint", f"{outcome.endpoint} (OpenAI API)")
        reply = (outcome.smoke or "").removeprefix("smoke: chat completion ")
        table.add_row("chat completion", f"{reply} (tiny model, random weights)")
        if outcome.serve_seconds is not None:
            table.add_row("serving ready", f"in {outcome.serve_seconds:.0f}s")
    table.add_row("changed for CPU", f"{len(outcome.changes)} change(s), listed above")
    table.add_row("logs", str(run_dir))
    table.add_row("next", "Ctrl-C stops serving and Ray" if keep else "stopping everything")
    console.print(table)
