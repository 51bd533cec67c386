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

When the stack serves its training run (`source: training`), both start at once, as one
`pulumi up` starts them on GKE, and nothing is ready: the trainer's model is staged from a
local hub folder into the bucket only once the trainer waits for it (staging.py), and the
serving replica waits for the run's export inside its start (workloads/serve/wait.py). The
summary says what waited on what, and for how long.

The bucket is the stack's, emulated (bucket.py): every ``gs://`` call of the staging, the
trainer, Ray Train's storage and the RL job goes through an IAM gate that grants what the
stack binds to its workload identity, and nothing else; the pods' FUSE mount is the emulated
bucket's folder. A call the grant lacks fails the run, naming the permission.

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
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.markup import escape

from infra.schema.safe import one_line
from infra.tools.local import console as console_out
from infra.tools.local.bucket import EmulatedBucket, EmulatorError, stack_bucket
from infra.tools.local.outcome import Outcome
from infra.tools.local.profile import (
    FACT_QUESTION_INDEX,
    cpu_entrypoint,
    staged_profile,
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
from infra.tools.local.staging import LocalStaging, staged_model
from infra.tools.local.submit import LocalJob, export_of, run_job
from infra.tools.outdir import make_folder, open_new, write_new
from workloads import protocol

TRAIN_JOB = LocalJob()  # its defaults: the CPU profile of profile.py, train.log, 30 minutes
SERVE_TIMEOUT_S = 1800.0


# ---------------------------------------------------------------------------------------------
# The run


def run_dir_for(stack: str) -> Path:
    """Where a run keeps its checkpoints and logs: `$PARK_CACHE_DIR` or ~/.cache/park-gke."""
    root = Path(os.environ.get("PARK_CACHE_DIR") or Path.home() / ".cache" / "park-gke")
    return root / "local-runs" / f"{stack}-{time.strftime('%Y%m%d-%H%M%S')}"


def _manifest(rendered: Any, kind: str) -> dict[str, Any] | None:
    found = [m for m in rendered.manifests() if m.get("kind") == kind]
    return found[0] if found else None


def run_local(
    rendered: Any,
    *,
    only: str | None,
    keep: bool,
    console: Console,
    bucket_roles: tuple[str, ...] | None = None,
) -> Outcome:
    """Train and/or serve the rendered stack on a local Ray against its emulated bucket (which
    grants the stack's roles, or `bucket_roles` to try another grant); raise LocalRunError on
    failure, naming any permission the grant lacks."""
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
    bucket = stack_bucket(rendered, run_dir, bucket_roles)
    try:
        bucket.start()
    except EmulatorError as err:
        raise LocalRunError(str(err)) from None
    outcome.bucket = bucket
    console.print(
        f"bucket gs://{bucket.bucket}: emulated (fake-gcs-server) behind an IAM gate granting "
        f"{', '.join(bucket.roles) or 'no role'}; its folder {bucket.folder} stands in for "
        "the pods' FUSE mount",
        highlight=False,
        soft_wrap=True,
    )
    try:
        _run_on_ray(rendered, rayjob, rayservice, run_dir, console, outcome, keep=keep)
        bucket.check()
    except (LocalRunError, EmulatorError) as err:
        try:
            bucket.check()
        except EmulatorError as refused:
            raise LocalRunError(f"{err}; {refused}") from None
        if isinstance(err, EmulatorError):
            raise LocalRunError(str(err)) from None
        raise
    finally:
        bucket.stop()
    console_out.bucket_calls(console, bucket)
    return outcome


def _run_on_ray(
    rendered: Any,
    rayjob: dict[str, Any] | None,
    rayservice: dict[str, Any] | None,
    run_dir: Path,
    console: Console,
    outcome: Outcome,
    *,
    keep: bool,
) -> None:
    stack = rendered.config.stack
    bucket = outcome.bucket
    assert bucket is not None
    rl = rayjob is not None and runs_rl(rayjob)
    if rayjob is not None and not rl:
        outcome.staging = _staging(rendered, rayjob, bucket, run_dir)
        if outcome.staging is not None:
            outcome.staging.build_hub()  # the hub has the model before anything starts
    trained = _trained_models(rendered) if rayjob is not None and not rl else []
    # SIGTERM (kill, a supervisor) stops the run as Ctrl-C does: Ray goes down in order.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        with _local_ray(run_dir, console, pods_ray_env(rayservice)) as ray:
            try:
                if rayjob is not None and rl:  # GRPO, then serve its policy
                    run_rl(rayjob, ray, run_dir, console, outcome, start_serving=_start_serving)
                    return
                if rayjob is not None and rayservice is not None and trained:
                    _train_and_serve(
                        rayjob,
                        rayservice,
                        ray,
                        run_dir,
                        console,
                        outcome,
                        keep=keep,
                        trained=trained,
                    )
                    return
                if rayjob is not None:
                    _train(rayjob, ray, run_dir, console, outcome)
                    _reference(outcome, run_dir, console)
                if rayservice is not None:
                    _serve(
                        rayservice,
                        ray,
                        run_dir,
                        console,
                        outcome,
                        keep=keep,
                        stack=stack,
                        trained=[],
                    )
                else:
                    console_out.summary(console, outcome, ray, run_dir, keep=False)
            except KeyboardInterrupt:
                console.print("interrupted: stopping", highlight=False)
                raise LocalRunError("interrupted before the run finished") from None
            finally:
                if outcome.staging is not None:
                    outcome.staging.stop()
    finally:
        signal.signal(signal.SIGTERM, previous)


def _staging(
    rendered: Any, rayjob: dict[str, Any], bucket: EmulatedBucket, run_dir: Path
) -> LocalStaging | None:
    """The trainer's model when the stack reads a staged copy of it from the bucket."""
    _, fields = protocol.split_entrypoint(str(rayjob["spec"]["entrypoint"]))
    jobs = [m for m in rendered.manifests() if m.get("kind") == "Job"]
    try:
        return staged_model(
            fields.get("model"), rendered.config.storage.mount_path, jobs, bucket, run_dir
        )
    except (RuntimeError, EmulatorError) as err:
        raise LocalRunError(str(err)) from None


def _train_and_serve(
    rayjob: dict[str, Any],
    rayservice: dict[str, Any],
    ray: LocalRay,
    run_dir: Path,
    console: Console,
    outcome: Outcome,
    *,
    keep: bool,
    trained: list[str],
) -> None:
    """The RayService and the RayJob started together, as on GKE: the serving replica waits
    for the run's export inside its start, the trainer for its staged model; the endpoint
    must then answer with the trained weights."""
    from workloads.train import facts

    assert outcome.bucket is not None
    outcome.export = export_of(rayjob, outcome.bucket, "park-train")
    outcome.question, outcome.learned = list(facts.questions().items())[FACT_QUESTION_INDEX]
    serving = _start_serving(
        rayservice,
        ray,
        run_dir,
        console,
        outcome,
        keep=keep,
        trained=trained,
        wait_for_model=True,
        config_from=str(_hub_folder(outcome.staging)),
    )
    try:
        _train(rayjob, ray, run_dir, console, outcome)
        # The export's checks run beside the engine's start, which is what the answer waits
        # for: at the lowest priority, so they take the CPU it leaves (Ray starts the replica
        # and its engine at nice 15).
        checks = _in_background(lambda: _check_export(outcome, run_dir, console))

        def compare(outcome: Outcome, console: Console) -> None:
            checks.join()
            if outcome.reference is None:
                raise LocalRunError(f"the export {outcome.export} could not be checked (above)")
            _compare(outcome, console)

        serving.finish(console, outcome, ray, run_dir, keep=keep, on_ready=compare)
    finally:
        serving.stop()


def _check_export(outcome: Outcome, run_dir: Path, console: Console) -> None:
    """transformers' reply from the export, then validate's model checks on it."""
    try:
        _reference(outcome, run_dir, console)
        if outcome.export:
            _check_local_model(outcome.export, console)
    except LocalRunError as err:
        console.print(f"[red]{escape(str(err))}[/]", highlight=False)
        outcome.reference = None


def _in_background(work: Callable[[], None]) -> threading.Thread:
    """`work` in a thread at nice 19 (Linux sets a thread's priority, and what it starts
    inherits it); where that cannot be set, at the process' own."""

    def run() -> None:
        with suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        work()

    thread = threading.Thread(target=run, name="park-local-checks", daemon=True)
    thread.start()
    return thread


def _hub_folder(staging: LocalStaging | None) -> Path:
    """The model the local run trains, as a folder: the local hub's, or park:tiny-llama's (the
    same tiny Llama): the config the run's export will have."""
    if staging is not None:
        staging.wait_hub()
        if staging.hub is not None:
            return staging.hub
    from workloads.train import tiny_llama

    return tiny_llama.build()


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
    """Submit the RayJob's entrypoint + runtime env through the Jobs API; stream progress. A
    staged model is staged when the trainer says it waits for it."""
    total = total_steps()
    staging = outcome.staging
    job = TRAIN_JOB
    if staging is not None:
        table = staged_profile(str(staging.local), staging.repo)
        job = replace(TRAIN_JOB, profile=partial(cpu_entrypoint, profile=table))

    def on_record(kind: str, record: dict[str, Any]) -> None:
        if kind == protocol.METRICS:
            last = (outcome.last_metrics or {}).get("step")
            outcome.last_metrics = record
            if record.get("step") != last:  # Ray may forward a line twice
                console.print(f"  {console_out.metrics_line(record, total)}", highlight=False)
        elif kind == protocol.WAITING:
            console.print(
                f"  the trainer waits for {record.get('folder')}", highlight=False, soft_wrap=True
            )
            if staging is not None and staging.started is None:
                console.print(
                    f"  staging {staging.repo} from the local hub {staging.hub} "
                    f"(workloads/train/stage.py --from-folder; log {staging.log_path})",
                    highlight=False,
                    soft_wrap=True,
                )
                staging.start()
        elif kind == protocol.WAITED:
            if record not in outcome.waits:  # Ray may forward a line twice
                outcome.waits.append(record)
                line = console_out.waited_line(record)
                console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
        elif kind == protocol.RESULT:
            outcome.trained = record

    run_job(job, rayjob, ray, run_dir, console, outcome, on_record=on_record, succeeded=bool)
    if staging is not None:
        try:
            staging.wait()
        except RuntimeError as err:
            raise LocalRunError(str(err)) from None
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
    """Deploy the RayService's serveConfigV2 with the serving workload's CPU profile and ask it
    one question; a model that serves a run (`trained`) serves this run's export, which exists
    (`park local rl`)."""
    serving = _start_serving(rayservice, ray, run_dir, console, outcome, keep=keep, trained=trained)
    try:
        serving.finish(console, outcome, ray, run_dir, keep=keep)
    finally:
        serving.stop()


def _start_serving(
    rayservice: dict[str, Any],
    ray: LocalRay,
    run_dir: Path,
    console: Console,
    outcome: Outcome,
    *,
    keep: bool,
    trained: list[str],
    wait_for_model: bool = False,
    config_from: str | None = None,
) -> ServingRun:
    """Start `python -m workloads.serve.local` on the RayService's serveConfigV2 and follow its
    output in a thread. A model that serves a run (`trained`) serves `outcome.export`; with
    `wait_for_model` that export is still being written and its replica waits for it."""
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
        if wait_for_model:
            command += ["--wait-for-model", "--config-from", str(config_from)]
        else:
            _check_local_model(outcome.export, console)
    elif len(models) > 1:  # each vLLM on CPU takes 2 CPUs and GBs: serve the first one
        command += ["--model", str(models[0])]
    if keep:
        command.append("--keep")
    console.rule("2. serving: the RayService's serveConfigV2 on Ray Serve LLM + vLLM (CPU)")
    console.print(f"serveConfigV2 (as rendered): {config_path}", highlight=False)
    console.print(f"running: {escape(shlex.join(command))}", highlight=False, soft_wrap=True)
    if wait_for_model:
        console.print(
            "started with the job: its replica waits for the run's export "
            f"({protocol.EXPORT_MARKER} in {outcome.export}) inside its start",
            highlight=False,
            soft_wrap=True,
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
    serving = ServingRun(process, stderr_path, time.monotonic())
    serving.follow(console, outcome)
    return serving


@dataclass
class ServingRun:
    """The serving subprocess, its output followed in a thread (it runs beside training)."""

    process: subprocess.Popen[str]
    stderr_path: Path
    started: float
    ready: threading.Event = field(default_factory=threading.Event)

    def follow(self, console: Console, outcome: Outcome) -> None:
        """Echo its output as it comes; note its CPU changes, endpoint and smoke reply."""

        def read() -> None:
            assert self.process.stdout is not None
            in_changes = False
            try:
                for raw in self.process.stdout:
                    line = raw.rstrip("\n")
                    if line.startswith(protocol.CHANGES_HEADER):
                        in_changes = True
                        console.print(
                            f"{line[:-1]} (workloads/serve/cpu_profile.py):", highlight=False
                        )
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
                    console.print(f"  {escape(line)}", highlight=False, soft_wrap=True)
                    if line.startswith(protocol.SMOKE_MARKER):
                        outcome.smoke = line
                        outcome.serve_seconds = time.monotonic() - self.started
                        self.ready.set()
            finally:
                self.ready.set()  # it ended without answering: finish() says so

        threading.Thread(target=read, name="park-local-serve", daemon=True).start()

    def finish(
        self,
        console: Console,
        outcome: Outcome,
        ray: LocalRay,
        run_dir: Path,
        *,
        keep: bool,
        on_ready: Callable[[Outcome, Console], None] | None = None,
    ) -> None:
        """Wait for its answer, then `on_ready`, the replica's waits and the summary; with
        `keep`, serve until Ctrl-C. Raises LocalRunError when it ended without answering."""
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
                console_out.summary(console, outcome, ray, run_dir, keep=keep)
                if keep:
                    console.print("serving until Ctrl-C...", highlight=False)
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
