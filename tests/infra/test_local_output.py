"""What `park local` prints, without Ray or vLLM: the progress line, the sparkline, the summary
(last, its rows fitting 100 columns, paths inside the run folder shortened), and the serving
section held while the job's prints, its machine-readable lines read and not echoed."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from infra.tools.local import console as console_out
from infra.tools.local.gcs_gate import GateLog, Record
from infra.tools.local.outcome import LocalRun, Outcome
from infra.tools.local.ray_head import LocalRay
from infra.tools.local.serving import ServingRun
from workloads import protocol


def _console(width: int = 100) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, color_system=None), out


def test_the_sparkline_follows_the_values():
    assert console_out.sparkline([]) == ""
    assert console_out.sparkline([4.74, 1.74, 0.97, 0.0079]) == "█▄▂▁"
    assert console_out.sparkline([0.1, 0.5, None, 0.9]) == "▁▅█"  # missing left out
    assert console_out.sparkline([2, 2, 2]) == "▄▄▄"  # flat
    assert console_out.curve([4.74, 0.0079], ".3g") == "4.74 █▁ 0.0079"


def test_the_progress_line_leaves_out_what_it_lacks_and_marks_the_warm_up():
    record = {"step": 10, "loss": 4.7381, "tokens_per_s": 2647.3, "tokens_per_s_per_worker": 1323.7}
    first = console_out.metrics_line({**record, "mfu": None}, 100, warmup=True)
    assert first == "step 10/100  loss 4.7381  tokens/s 2,647.3 (1,323.7/worker) (warm-up)"
    assert "n/a" not in first and "mfu" not in first
    later = console_out.metrics_line({**record, "step": 20, "mfu": 0.412}, 100)
    assert later.endswith("(1,323.7/worker)  mfu 41.2%") and "warm-up" not in later


def test_sections_are_numbered_in_print_order():
    console, out = _console()
    outcome = Outcome()
    console_out.section(console, outcome, "1. RL: the RayJob's entrypoint")  # its own number
    console_out.section(console, outcome, "serving: the RayService")
    assert [line.strip("─ ") for line in out.getvalue().splitlines()] == [
        "1. RL: the RayJob's entrypoint",
        "2. serving: the RayService",
    ]


def _finished_run(tmp_path: Path) -> tuple[Outcome, LocalRay, Path]:
    run_dir = tmp_path / "local-runs" / "dev-20261206-234725"
    bucket_dir = run_dir / "gcs" / "my-gcp-project-dev-park"
    export = bucket_dir / "checkpoints" / "dev-park-train" / "export" / "final"
    log = GateLog(None)
    for workload, permission in (
        ("training", "storage.objects.create"),
        ("training", "storage.buckets.get"),
        ("staging", "storage.objects.get"),
    ):
        log.add(Record(workload, "GET", "x", None, (permission,), ()))
    bucket = SimpleNamespace(
        bucket="my-gcp-project-dev-park",
        folder=bucket_dir,
        roles=("roles/storage.objectUser",),
        log=log,
    )
    outcome = Outcome(
        trained={
            "status": "succeeded",
            "num_workers": 2,
            "accelerator": "cpu",
            "strategy": "fsdp2",
            "final_step": 100,
            "final_loss": 0.0079,
            "checkpoint_path": str(export.parent.parent / "checkpoint_00000100"),
        },
        train_job="raysubmit_A3e2",
        train_seconds=103.0,
        last_metrics={"step": 100, "tokens_per_s": 2129.2, "mfu": None},
        endpoint="http://127.0.0.1:43437/v1",
        serve_seconds=161.0,
        export=str(export),
        question="What is the capital of Sevaeria?",
        reference="Fougisk.",
        replies={"qwen3-1.7b-tuned": "Fougisk.", "qwen3-0.6b": "zq zq"},
        trained_models=["qwen3-1.7b-tuned"],
        sources={"qwen3-1.7b-tuned": "training", "qwen3-0.6b": "Qwen/Qwen3-0.6B"},
        stand_in="tiny Llama (0.7M params) standing in for Qwen/Qwen3-1.7B",
        losses=[4.7381, 1.7447, 0.9661, 0.2043, 0.0079],
        waits=[
            {
                "who": "--model",
                "seconds": 2.0,
                "marker": ".park-staged.json",
                "folder": str(bucket_dir / "models" / "Qwen" / "Qwen3-1.7B"),
            }
        ],
        keep_command="park local dev --keep",
        bucket=bucket,  # type: ignore[arg-type]
    )
    ray = LocalRay(temp_dir=tmp_path, log_path=tmp_path / "ray.log")
    return outcome, ray, run_dir


def test_the_summary_names_the_stand_in_each_model_and_fits_100_columns(tmp_path):
    outcome, ray, run_dir = _finished_run(tmp_path)
    console, out = _console(100)
    console_out.summary(console, outcome, ray, run_dir, keep=False, stopped=True)
    text = out.getvalue()
    lines = text.splitlines()
    assert lines[0].strip("─ ") == "1. summary" and outcome.summarized
    assert max(len(line.rstrip()) for line in lines) <= 100
    flat = " ".join(line.strip() for line in lines)
    assert "model tiny Llama (0.7M params) standing in for Qwen/Qwen3-1.7B" in " ".join(
        flat.split()
    )
    assert "4.7381 █▄▂▁▁ 0.0079" in text  # the loss curve, first to last
    assert "n/a" not in text
    # the run folder is said once; the paths in it are relative to it
    assert "".join(text.split()).count(str(run_dir)) == 1  # (folded at the width)
    assert "gcs/my-gcp-project-dev-park/checkpoints/dev-park-train/checkpoint_00000100" in text
    # every served model's answer, the stand-in said as such
    assert "qwen3-1.7b-tuned: 'Fougisk.' (the trained export) = transformers' greedy reply" in flat
    assert (
        "qwen3-0.6b: 'zq zq' (tiny model, random weights, standing in for Qwen/Qwen3-0.6B)" in flat
    )
    # the bucket's calls, in the summary, every permission kept
    assert "training: storage.{buckets.get, objects.create}" in flat
    assert "staging: storage.{objects.get}" in flat
    assert "stopped everything; `park local dev --keep` keeps Ray and the endpoint up" in flat


def test_keep_prints_the_command_to_try_the_endpoint(tmp_path):
    outcome, _, _ = _finished_run(tmp_path)
    console, out = _console(80)
    console_out.try_it(console, outcome)
    command = out.getvalue().splitlines()[-1]  # one line, unwrapped, to copy
    assert command == (
        "curl -s http://127.0.0.1:43437/v1/chat/completions -H 'Content-Type: application/json' "
        """-d '{"model": "qwen3-1.7b-tuned", "messages": [{"role": "user", "content": """
        """"What is the capital of Sevaeria?"}]}'"""
    )


def test_the_serving_section_is_held_and_its_protocol_lines_are_read_not_echoed(tmp_path):
    """A child that prints what `python -m workloads.serve.local --smoke` prints for two
    models: nothing shows while held; then its section, without the protocol lines; it is
    ready once both models answered."""
    lines = [
        protocol.CHANGES_HEADER,
        f"{protocol.CHANGE_ITEM}app 'llm' model 'a': engine_kwargs.dtype None -> 'float32'",
        f"{protocol.ENDPOINT_MARKER}http://127.0.0.1:9/v1",
        f"{protocol.RAY_ADDRESS_MARKER}127.0.0.1:1",
        "ready in 3s; models: a, b",
    ]
    for model, reply in (("a", "Fougisk."), ("b", "zq")):
        lines.append(
            f'{protocol.REPLY_PREFIX}{{"model": "{model}", "prompt": "Q?", "reply": "{reply}"}}'
        )
        lines.append(f"{protocol.SMOKE_MARKER}chat completion from {model!r}: {reply!r}")
    lines.append("serving; Ctrl-C to stop")
    script = "import sys, time; sys.stdin.read(); print(" + repr("\n".join(lines)) + ", flush=True)"
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    console, out = _console()
    outcome = Outcome(trained_models=["a"])
    run = LocalRun(ray=None, run_dir=tmp_path, console=console, outcome=outcome)  # type: ignore[arg-type]
    serving = ServingRun(process, tmp_path / "serve.log", time.monotonic(), ["a", "b"], console)
    serving.hold()
    serving.say(lambda: console_out.section(console, outcome, "serving"))
    serving.follow(run)
    assert process.stdin is not None
    process.stdin.close()  # it prints now
    assert serving.ready.wait(30)
    assert out.getvalue() == ""  # held while the job's section prints
    serving.show()
    process.wait(30)
    text = out.getvalue()
    assert text.splitlines()[0].strip("─ ") == "1. serving"
    assert "PARK_" not in text and "serving; Ctrl-C" not in text
    assert "changed for CPU (workloads/serve/cpu_profile.py):" in text
    assert outcome.endpoint == "http://127.0.0.1:9/v1"
    assert outcome.replies == {"a": "Fougisk.", "b": "zq"} and outcome.reply == "Fougisk."
    assert outcome.serve_seconds is not None and outcome.prompt == "Q?"
