"""`park local`: the stack's own RayJob and RayService on a local Ray, on this machine's CPU.

What runs is what KubeRay would run, taken from the rendered manifests, with the changes CPU
needs made in two visible places and printed:

- training: `profile.TRAIN_CPU_PROFILE` rewrites fields of the RayJob's `entrypoint` (gloo
  instead of the TPU, 2 workers, the tiny model, a few dozen steps, a local folder for
  checkpoints); the `runtimeEnvYAML` goes through unchanged. Both are submitted through the Ray
  Jobs API, as KubeRay's submitter does (`ray job submit --runtime-env-json ... -- <entrypoint>`).
- serving: the RayService's `serveConfigV2` goes unchanged to `python -m workloads.serve.local`,
  whose `workloads/serve/cpu_profile.py` makes (and prints) the CPU changes: no accelerator, the
  tiny local model, vLLM's CPU knobs. It attaches to the same Ray and answers one chat completion.

Training is an entrypoint string run by Ray, serving a module run as a subprocess; what passes
between them and us is workloads/protocol.py. The Ray head (ray_head.py) runs in a private
temp dir on free ports and is stopped by its process id at the end, unless --keep.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape

from infra.spec.safe import one_line
from infra.tools.local import console as console_out
from infra.tools.local.profile import (
    FACT_QUESTION_INDEX,
    total_steps,
)
from infra.tools.local.ray_head import (
    RAY_NUM_CPUS,
    LocalRay,
    LocalRunError,
    pods_ray_env,
    ray_auth_env,
)
from infra.tools.local.rl import run_rl, runs_rl
from infra.tools.local.submit import LocalJob, run_job
from infra.tools.outdir import make_folder, open_new, write_new
from workloads import protocol

TRAIN_JOB = LocalJob()  # its defaults: the CPU profile of profile.py, train.log, 30 minutes
SERVE_TIMEOUT_S = 1800.0


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
    export: str | None = None  # the trained Hugging Face folder, when the run wrote one
    question: str | None = None  # asked of the served export, from the training data
    learned: str | None = None  # its answer in the training data
    reference: str | None = None  # transformers' greedy reply from the export
    reply: str | None = None  # the endpoint's reply
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
    make_folder(run_dir)  # never through a link (infra.tools.outdir)
    outcome = Outcome()
    console.print(
        f"[bold]park local {escape(stack)}[/]: the stack's "
        + " and ".join(
            n for n, m in (("RayJob", rayjob), ("RayService", rayservice)) if m is not None
        )
        + f" on a local Ray (CPU); run folder {escape(one_line(str(run_dir)))}",
        highlight=False,
    )
    # SIGTERM (kill, a supervisor) stops the run as Ctrl-C does: Ray goes down in order.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with _local_ray(run_dir, console, pods_ray_env(rayservice)) as ray:
            try:
                if rayjob is not None and runs_rl(rayjob):  # GRPO, then serve its policy
                    run_rl(rayjob, ray, run_dir, console, outcome, stack=stack, serve=_serve)
                    return outcome
                if rayjob is not None:
                    _train(rayjob, ray, run_dir, console, outcome)
                    _reference(outcome, run_dir, console)
                if rayservice is not None:
                    trained = _trained_models(rendered)
                    _serve(
                        rayservice,
                        ray,
                        run_dir,
                        console,
                        outcome,
                        keep=keep,
                        stack=stack,
                        trained=trained,
                    )
                    if trained and outcome.reference is not None:
                        _compare(outcome, console)
                else:
                    console_out.summary(console, outcome, ray, run_dir, keep=False)
            except KeyboardInterrupt:
                console.print("interrupted: stopping", highlight=False)
                raise LocalRunError("interrupted before the run finished") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    return outcome


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def _local_ray(run_dir: Path, console: Console, env: dict[str, str]) -> Iterator[LocalRay]:
    # Short path: Ray's unix sockets live under the temp dir (107-byte limit).
    temp_dir = Path(tempfile.mkdtemp(prefix="park-ray-", dir="/tmp"))
    ray = LocalRay(temp_dir=temp_dir, log_path=run_dir / "ray-start.log", env=env)
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


def _train(
    rayjob: dict[str, Any], ray: LocalRay, run_dir: Path, console: Console, outcome: Outcome
) -> None:
    """Submit the RayJob's entrypoint + runtime env through the Jobs API; stream progress."""
    total = total_steps()

    def on_record(kind: str, record: dict[str, Any]) -> None:
        if kind == protocol.METRICS:
            last = (outcome.last_metrics or {}).get("step")
            outcome.last_metrics = record
            if record.get("step") != last:  # Ray may forward a line twice
                console.print(f"  {console_out.metrics_line(record, total)}", highlight=False)
        else:
            outcome.trained = record

    run_job(TRAIN_JOB, rayjob, ray, run_dir, console, outcome, on_record=on_record, succeeded=bool)
    result = outcome.trained or {}
    console.print(
        f"training {result.get('status')} in {outcome.train_seconds:.0f}s: step "
        f"{result.get('final_step')}, loss {console_out.fmt(result.get('final_loss'), '.4f')}, "
        f"checkpoint {result.get('checkpoint_path')}",
        highlight=False,
        soft_wrap=True,
    )


def _trained_models(rendered: Any) -> list[str]:
    """Served model ids whose source is the training run (source: training)."""
    serving = rendered.plan.serving
    return [m.spec.name for m in serving.models if m.from_training] if serving else []


def _reference(outcome: Outcome, run_dir: Path, console: Console) -> None:
    """transformers' greedy reply from the export to a question of the training data, the
    answer the endpoint must give (workloads/train/generate.py, in a subprocess: torch)."""
    from workloads.train import facts

    export = (outcome.trained or {}).get("export_path")
    if not export or not Path(export, "config.json").is_file():
        return
    outcome.export = str(export)
    outcome.question, outcome.learned = list(facts.questions().items())[FACT_QUESTION_INDEX]
    done = subprocess.run(
        [sys.executable, "-m", "workloads.train.generate", outcome.export, outcome.question],
        capture_output=True,
        text=True,
        cwd=run_dir,
        timeout=600,
    )
    if done.returncode != 0:
        raise LocalRunError(
            f"transformers could not load the export {export}: {done.stderr[-800:]}"
        )
    outcome.reference = done.stdout.rstrip("\n").split("\t", 1)[-1]
    console.print(
        f"export {outcome.export}: transformers answers {outcome.question!r} with "
        f"{outcome.reference!r} (greedy; learned answer {outcome.learned!r})",
        highlight=False,
        soft_wrap=True,
    )


def _compare(outcome: Outcome, console: Console) -> None:
    """The endpoint serves the trained weights: its greedy reply is transformers' own."""
    reply = (outcome.reply or "").strip()
    console.print(
        f"served completion of {outcome.question!r}: {reply!r}; transformers from the export: "
        f"{outcome.reference!r}; learned answer: {outcome.learned!r}",
        highlight=False,
        soft_wrap=True,
    )
    if reply != outcome.reference:
        raise LocalRunError(
            f"the endpoint answered {reply!r}, transformers {outcome.reference!r} from the same "
            f"export {outcome.export}: the served weights are not the trained ones"
        )
    console.print(
        "the endpoint serves the trained export"
        + (": it gives the learned answer" if reply == outcome.learned else ""),
        highlight=False,
    )


def _check_local_model(folder: str, console: Console) -> None:
    """The served models' checks that hold on any hardware, run on the folder served here:
    its config.json read as `park validate` reads a model's, and the engine's architectures."""
    from infra import model_lookup
    from infra.rules.workloads import servable_problems

    found = model_lookup.lookup(folder)
    if found.facts is None:
        raise LocalRunError(f"the model to serve, {folder}: {found.error or found.reason}")
    problems = servable_problems(found.facts)
    if problems:
        raise LocalRunError(f"the model to serve, {folder}: {'; '.join(problems)}")
    facts = found.facts
    console.print(
        f"model checked ({folder}): {facts.architecture}, {facts.layers} layers, "
        f"{facts.attention_heads} heads / {facts.kv_heads} KV heads, {facts.max_positions} "
        "positions: one the pinned vLLM serves",
        highlight=False,
        soft_wrap=True,
    )


def _serve(
    rayservice: dict[str, Any],
    ray: LocalRay,
    run_dir: Path,
    console: Console,
    outcome: Outcome,
    *,
    keep: bool,
    stack: str,
    trained: list[str],
) -> None:
    """Deploy the RayService's serveConfigV2 with the serving workload's CPU profile; a model
    that serves the training run (source: training) serves this run's export."""
    text = (rayservice.get("spec") or {}).get("serveConfigV2")
    if not isinstance(text, str):
        raise LocalRunError("the RayService has no serveConfigV2")
    config_path = run_dir / "serveConfigV2.yaml"
    write_new(config_path, text)
    models = [
        llm.get("model_loading_config", {}).get("model_id")
        for app in (yaml.safe_load(text) or {}).get("applications") or []
        for llm in ((app.get("args") or {}).get("llm_configs") or [])
        if isinstance(llm, dict)
    ]
    command = [
        sys.executable,
        "-m",
        protocol.SERVE_LOCAL_MODULE,
        "--serve-config",
        str(config_path),
        "--address",
        ray.gcs_address,
        "--smoke",
        "--timeout",
        str(int(SERVE_TIMEOUT_S)),
    ]
    if trained and outcome.export:
        command += ["--model", trained[0], "--model-path", outcome.export]
        command += ["--prompt", outcome.question or ""]
        _check_local_model(outcome.export, console)
    elif len(models) > 1:  # each vLLM on CPU takes 2 CPUs and GBs: serve the first one
        command += ["--model", str(models[0])]
    if keep:
        command.append("--keep")
    console.rule("2. serving: the RayService's serveConfigV2 on Ray Serve LLM + vLLM (CPU)")
    console.print(f"serveConfigV2 (as rendered): {config_path}", highlight=False)
    console.print(f"running: {escape(shlex.join(command))}", highlight=False, soft_wrap=True)
    stderr_path = run_dir / "serve.log"
    started = time.monotonic()
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
        if line.startswith(protocol.CHANGES_HEADER):
            in_changes = True
            console.print(f"{line[:-1]} (workloads/serve/cpu_profile.py):", highlight=False)
            continue
        if in_changes and line.startswith(protocol.CHANGE_ITEM):
            outcome.changes.append(f"serving: {line[len(protocol.CHANGE_ITEM) :]}")
            console.print(escape(line), highlight=False, soft_wrap=True)
            continue
        in_changes = False
        if line.startswith(protocol.ENDPOINT_MARKER):
            outcome.endpoint = line.split(" ", 1)[1].strip()
        if line.startswith(protocol.REPLY_PREFIX):
            outcome.reply = json.loads(line[len(protocol.REPLY_PREFIX) :]).get("reply")
            continue
        if line.startswith(protocol.SMOKE_MARKER):
            outcome.smoke = line
            outcome.serve_seconds = time.monotonic() - started
        console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
        if line.startswith(protocol.SMOKE_MARKER):
            console_out.summary(console, outcome, ray, run_dir, keep=keep)
            if keep:
                console.print("serving until Ctrl-C...", highlight=False)
    process.wait()
