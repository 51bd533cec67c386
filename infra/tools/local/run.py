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
summary says what waited on what, and for how long. Sections are numbered as they print:
serving starts first, but what it says is held until training's section is done (serving.py);
the summary comes last, once Ray and the bucket have stopped (with --keep, before serving
until Ctrl-C, with the `curl` that asks the endpoint), every served model's answer in it.

The bucket is the stack's, emulated (bucket.py): every ``gs://`` call of the staging, the
trainer, Ray Train's storage and the RL job goes through an IAM gate that grants what the
stack binds to its workload identity, and nothing else; the pods' FUSE mount is the emulated
bucket's folder. A call the grant lacks fails the run, naming the permission.

Training is an entrypoint string run by Ray, serving a module run as a subprocess; what passes
between them and us is workloads/protocol.py. The Ray head (ray_head.py) runs in a private
temp dir on free ports and is stopped by its process id at the end, unless --keep.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from infra.schema.models import RL_SOURCE, TRAINING_SOURCE
from infra.schema.safe import one_line
from infra.tools.local import answers
from infra.tools.local import console as console_out
from infra.tools.local.answers import check_export, reference, stand_in
from infra.tools.local.bucket import EmulatedBucket, EmulatorError, stack_bucket
from infra.tools.local.outcome import LocalRun, Outcome
from infra.tools.local.profile import (
    FACT_QUESTION_INDEX,
    cpu_entrypoint,
    staged_profile,
    total_steps,
)
from infra.tools.local.ray_head import LocalRay, LocalRunError, logical_cpus, pods_ray_env
from infra.tools.local.rl import run_rl, runs_rl
from infra.tools.local.serving import serve, start_serving
from infra.tools.local.staging import LocalStaging, staged_model
from infra.tools.local.submit import LocalJob, export_of, run_job
from infra.tools.outdir import make_folder
from workloads import protocol

TRAIN_JOB = LocalJob()  # its defaults: the CPU profile of profile.py, train.log, 30 minutes


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
    if rayservice is not None and not keep:
        outcome.keep_command = f"park local {stack}" + (f" --only {only}" if only else "")
        outcome.keep_command += " --keep"
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
    if not outcome.summarized and outcome.ray is not None:  # last, once everything stopped
        console_out.summary(console, outcome, outcome.ray, run_dir, keep=False, stopped=True)
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
    bucket = outcome.bucket
    assert bucket is not None
    rl = rayjob is not None and runs_rl(rayjob)
    if rayjob is not None and not rl:
        outcome.staging = _staging(rendered, rayjob, bucket, run_dir)
        if outcome.staging is not None:
            outcome.staging.build_hub()  # the hub has the model before anything starts
    trained = _trained_models(rendered) if rayjob is not None and not rl else []
    serving = rendered.plan.serving if rayservice is not None else None
    outcome.sources = (
        {m.spec.name: _source(m.spec.source) for m in serving.models} if serving else {}
    )
    if rl:
        outcome.keep_command = None  # the RL run serves its policy once, then stops
    # SIGTERM (kill, a supervisor) stops the run as Ctrl-C does: Ray goes down in order.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        served = len(outcome.sources) or 1
        with _local_ray(run_dir, console, pods_ray_env(rayservice), served) as ray:
            outcome.ray = ray
            run = LocalRun(ray, run_dir, console, outcome)
            try:
                if rayjob is not None and rl:  # GRPO, then serve its policy
                    run_rl(rayjob, run, start_serving=start_serving)
                    return
                if rayjob is not None and rayservice is not None and trained:
                    _train_and_serve(run, rayjob, rayservice, keep=keep, trained=trained)
                    return
                if rayjob is not None:
                    _train(run, rayjob)
                    reference(run)
                if rayservice is not None:
                    serve(run, rayservice, keep=keep, trained=[])
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
    run: LocalRun,
    rayjob: dict[str, Any],
    rayservice: dict[str, Any],
    *,
    keep: bool,
    trained: list[str],
) -> None:
    """The RayService and the RayJob started together, as on GKE: the serving replica waits
    for the run's export inside its start, the trainer for its staged model; the endpoint
    must then answer with the trained weights."""
    from workloads.train.inputs import facts

    outcome = run.outcome
    assert outcome.bucket is not None
    outcome.export = export_of(rayjob, outcome.bucket, "park-train")
    outcome.question, outcome.learned = list(facts.questions().items())[FACT_QUESTION_INDEX]
    # Started first, held: its section prints once the job's has (serving.py ServingRun).
    serving = start_serving(
        run,
        rayservice,
        keep=keep,
        trained=trained,
        wait_for_model=True,
        config_from=str(_hub_folder(outcome.staging)),
    )
    try:
        _train(run, rayjob)
        # The export's checks run beside the engine's start, which is what the answer waits
        # for: at the lowest priority, so they take the CPU it leaves (Ray starts the replica
        # and its engine at nice 15). What they say is printed with the answers.
        said = io.StringIO()
        quiet = Console(file=said, width=10_000, soft_wrap=True, highlight=False)
        checks = _in_background(lambda: check_export(replace(run, console=quiet)))

        def compare(outcome: Outcome, console: Console) -> None:
            checks.join()
            console.out(said.getvalue(), end="", highlight=False)
            if outcome.reference is None:
                raise LocalRunError(f"the export {outcome.export} could not be checked (above)")
            answers.compare(outcome, console)

        serving.finish(run, keep=keep, on_ready=compare, summary=False)
    finally:
        serving.stop()


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
    from workloads.train.models import tiny_llama

    return tiny_llama.build()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


@contextmanager
def _local_ray(
    run_dir: Path, console: Console, env: dict[str, str], served: int = 1
) -> Iterator[LocalRay]:
    """A private Ray head for the run, with logical CPUs for the training workers and each of
    the `served` models' LLM servers."""
    # Short path: Ray's unix sockets live under the temp dir (107-byte limit).
    temp_dir = Path(tempfile.mkdtemp(prefix="park-ray-", dir="/tmp"))
    ray = LocalRay(
        temp_dir=temp_dir,
        log_path=run_dir / "ray-start.log",
        env=env,
        num_cpus=logical_cpus(served),
    )
    with console.status("starting a local Ray head..."):
        started = time.monotonic()
        try:
            ray.start()
        except BaseException:
            ray.stop()
            raise
    console.print(
        f"Ray head up in {time.monotonic() - started:.0f}s: GCS {ray.gcs_address}, "
        f"dashboard {ray.dashboard_url} (no Kubernetes: one node, {ray.num_cpus} logical CPUs)",
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


def _train(run: LocalRun, rayjob: dict[str, Any]) -> None:
    """Submit the RayJob's entrypoint + runtime env through the Jobs API; stream progress. A
    staged model is staged when the trainer says it waits for it."""
    console, outcome = run.console, run.outcome
    total = total_steps()
    staging = outcome.staging
    job = TRAIN_JOB
    if staging is not None:
        table = staged_profile(str(staging.local), staging.repo)
        job = replace(TRAIN_JOB, profile=partial(cpu_entrypoint, profile=table))

    def on_record(kind: str, record: dict[str, Any]) -> None:
        if kind == protocol.METRICS:
            first = outcome.last_metrics is None  # its window holds the warm-up step
            last = (outcome.last_metrics or {}).get("step")
            outcome.last_metrics = record
            if record.get("step") != last:  # Ray may forward a line twice
                if isinstance(record.get("loss"), (int, float)):
                    outcome.losses.append(float(record["loss"]))
                line = console_out.metrics_line(record, total, warmup=first)
                console.print(f"  {line}", highlight=False)
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

    run_job(job, rayjob, run, on_record=on_record, succeeded=bool)
    if staging is not None:
        try:
            staging.wait()
        except RuntimeError as err:
            raise LocalRunError(str(err)) from None
    result = outcome.trained or {}
    if result.get("export_path"):
        outcome.stand_in = stand_in(str(result["export_path"]), _trained_model(rayjob, staging))
    console.print(
        f"training {result.get('status')} in {outcome.train_seconds:.0f}s: step "
        f"{result.get('final_step')}, loss {console_out.fmt(result.get('final_loss'), '.4f')}, "
        f"checkpoint {result.get('checkpoint_path')}",
        highlight=False,
        soft_wrap=True,
    )


def _trained_model(rayjob: dict[str, Any], staging: LocalStaging | None) -> str | None:
    """The model the stack trains (the hub id it stages, else the rendered --model)."""
    if staging is not None:
        return staging.repo
    _, fields = protocol.split_entrypoint(str(rayjob["spec"]["entrypoint"]))
    return fields.get("model")


def _source(source: str) -> str:
    """A served model's source as the summary names what a stand-in stands in for."""
    return {TRAINING_SOURCE: "the training run's export", RL_SOURCE: "the RL run's policy"}.get(
        source, source
    )


def _trained_models(rendered: Any) -> list[str]:
    """Served model ids whose source is the training run (source: training)."""
    serving = rendered.plan.serving
    return [m.spec.name for m in serving.models if m.from_training] if serving else []
