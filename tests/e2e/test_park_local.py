"""`park local dev` as a user runs it: the installed `park` command, in an empty directory.

One test, a few minutes (Ray start, 100 CPU training steps of a tiny Llama on the shipped facts,
vLLM's cold start of ~1.5 min and several GB): it starts the dev stack's RayJob and RayService
together, as one `pulumi up` does, with nothing ready: the trainer waits for its model's staged
copy (staged from a local hub once it waits), the serving replica for the run's export (its
model's source is the training run). The run exports, the endpoint answers a question of the
training data, and everything stops. The served reply must be what transformers generates
greedily from the exported folder, and the learned answer; transformers must answer every
shipped fact from that folder; the waits are in the summary.
Run it with `pytest -m e2e tests/e2e`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def _park_command() -> list[str]:
    park = shutil.which("park") or str(Path(sys.executable).with_name("park"))
    if not Path(park).exists():
        pytest.skip("the park command is not installed (pip install -e '.[local]')")
    return [park]


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5)
    except urllib.error.HTTPError:
        return True  # something answered
    except OSError:
        return False
    return True


def run_park_local(tmp_path: Path, stack: str) -> str:
    """`park local <stack>` in an empty directory with a cache of its own under ``tmp_path``,
    as a user runs it; it must succeed. Its output; how long it took is printed."""
    pytest.importorskip("ray")
    pytest.importorskip("vllm")
    workdir = tmp_path / "empty"
    workdir.mkdir()
    env = {**os.environ, "PARK_CACHE_DIR": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    done = subprocess.run(
        [*_park_command(), "local", stack],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=2600,
    )
    out = done.stdout
    assert done.returncode == 0, f"exit {done.returncode}\n{out[-6000:]}\n{done.stderr[-3000:]}"
    print(f"park local {stack} took {time.monotonic() - started:.0f}s")
    return out


def bucket_permissions(in_bucket: Path) -> dict[str, set[str]]:
    """Each workload's permissions, from the IAM gate's record of the run that wrote the file
    or folder `in_bucket` (under <run>/gcs/): asserts that no call was refused and that each
    workload's calls are in the ledger `park validate` prints."""
    from infra import storage_iam

    run_dir = Path(str(in_bucket).split("/gcs/", 1)[0])
    calls = [json.loads(line) for line in (run_dir / "bucket-calls.jsonl").read_text().splitlines()]
    assert calls and not [c for c in calls if c["denied"]], calls
    used: dict[str, set[str]] = {}
    for call in calls:
        used.setdefault(call["workload"], set()).update(call["permissions"])
    for workload, permissions in used.items():
        assert permissions <= storage_iam.ledger_of(workload).permissions, workload
    return used


@pytest.mark.timeout(2700)
def test_park_local_dev(tmp_path):
    out = run_park_local(tmp_path, "dev")

    # 1. training: the CPU changes are listed, progress streamed, the job succeeded
    assert "changed for CPU (infra/tools/local/profile.py TRAIN_CPU_PROFILE):" in out
    assert "--accelerator tpu -> cpu" in out
    # the stack's hub model is read from its copy staged in the bucket (infra/resolve/disk.py): here
    # the run's bucket folder, staged from a local hub once the trainer waits for it
    staged = re.search(
        r"--model /data/models/Qwen/Qwen3-1\.7B -> (\S+/gcs/[^/]+/models/Qwen/Qwen3-1\.7B) ", out
    )
    assert staged and str(tmp_path / "cache") in staged.group(1), out
    assert Path(staged.group(1), ".park-staged.json").is_file()
    # serving started with training (before its job was submitted), waiting for the export;
    # its section prints after training's, and the sections are numbered in print order
    assert out.index("serving started beside the job") < out.index("submitted job"), out
    assert out.index("1. training") < out.index("2. serving") < out.index("3. summary"), out
    assert out.index("--wait-for-model") > out.index("training succeeded"), out
    assert f"the trainer waits for {staged.group(1)}" in out
    waited = re.search(r"--model waited ([\d.]+)s for \.park-staged\.json", out)
    assert waited and float(waited.group(1)) > 0, out
    assert "n/a" not in out and "PARK_" not in out  # no empty column, no protocol line
    steps = [int(s) for s in re.findall(r"step (\d+)/100  loss \d", out)]
    assert steps == list(range(10, 101, 10)), out  # each report once (PARK_METRICS lines)
    assert re.search(
        r"step 10/100  loss [\d.]+  tokens/s [\d,.]+ \([\d,.]+/worker\) \(warm-up\)\n", out
    )
    assert out.count("(warm-up)") == 1, out
    losses = [float(x) for x in re.findall(r"step \d+/100  loss ([\d.]+)", out)]
    assert losses[-1] < losses[0] / 10, losses  # it learned
    match = re.search(r"training succeeded in \d+s: step 100, loss ([\d.]+), checkpoint (\S+)", out)
    assert match and float(match.group(1)) < 0.05, out  # the PARK_RESULT line's final loss
    checkpoint = Path(match.group(2))
    assert checkpoint.name == "checkpoint_00000100"
    assert checkpoint.is_dir() and any(checkpoint.iterdir())
    assert str(tmp_path / "cache") in str(checkpoint)

    # 2. the export, what transformers answers from it, and what the endpoint answers
    from workloads.train import generate
    from workloads.train.inputs import facts

    exported = re.search(r"export (\S+): transformers answers '([^']+)' with '([^']*)'", out)
    assert exported, out
    folder, question, said = exported.groups()
    assert Path(folder, "config.json").is_file() and "export/final" in folder
    learned = facts.questions()[question]
    # Checked here again, in this process, from the folder the run left behind: every shipped
    # fact, not only the one asked (transformers reads what the trainer exported).
    questions = facts.questions()
    replies = generate.greedy_replies(folder, list(questions))
    assert replies[question] == said == learned
    wrong = {q: (replies[q], a) for q, a in questions.items() if replies[q] != a}
    assert not wrong, f"{len(wrong)} of {len(questions)} wrong: {wrong}"
    assert "changed for CPU (workloads/serve/cpu_profile.py):" in out
    assert f"-> '{folder}' (a model on this machine)" in out  # the export, not a stand-in
    assert f"model checked ({folder}): LlamaForCausalLM" in out  # validate's checks, locally
    flat = " ".join(out[out.index("3. summary") :].split())  # the summary wraps at 80 columns
    endpoint = re.search(r"endpoint (http://127\.0\.0\.1:\d+/v1) \(OpenAI API\)", flat)
    assert endpoint, out
    served = re.search(r"served completion of '[^']+': '([^']*)'", out)
    assert served and served.group(1) == said, out
    assert "the endpoint serves the trained export: it gives the learned answer" in out

    # the replica waited inside its start for the export's marker, then served it
    replica = re.search(
        r"serving model qwen3-1\.7b-tuned waited ([\d.]+)s for park_export\.json in (\S+)", out
    )
    assert replica and replica.group(2) == folder, out
    assert "callback_config timeout_s" in out  # the rendered wait, bounded by this run

    # 3. the bucket: every gs:// call of the staging and the trainer went through the IAM gate
    # granting the stack's rendered roles; none was refused, each is in the ledger `park validate`
    # prints, and the trainer's include the bucket metadata read that objectUser alone refuses
    used = bucket_permissions(checkpoint)
    assert set(used) == {"staging", "training"}, used
    assert "storage.buckets.get" in used["training"]
    assert "training: storage.{buckets.get, " in flat  # in the summary

    # 4. everything stopped, then the summary, last: neither the endpoint nor the dashboard
    # answers; it names the stand-in model, each served model's answer, how to keep it up
    assert out.index("Ray stopped.") < out.index("3. summary"), out
    assert re.search(r"model tiny Llama \([\d.]+M params\) standing in for Qwen/Qwen3-1\.7B", flat)
    assert re.search(r"loss [\d.]+ [▁▂▃▄▅▆▇█]+ [\d.]+", flat), flat
    assert f"completion {said!r} (the trained export) = transformers' greedy reply" in flat
    assert "`park local dev --keep` keeps Ray and the endpoint up" in flat
    dashboard = re.search(r"dashboard (http://127\.0\.0\.1:\d+)", out)
    assert dashboard, out
    assert not _answers(f"{endpoint.group(1)}/models")
    assert not _answers(f"{dashboard.group(1)}/api/version")
