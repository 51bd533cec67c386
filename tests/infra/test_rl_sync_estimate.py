"""The weight sync's seconds at preview (infra/resolve/rl.py): every phase counted (publish,
pull, write, reload), each rate within what its source measured, and the plan's figure equal to
the arithmetic done here again from the version's bytes and the sources' figures.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from infra.resolve import rl as resolve_rl
from infra.resolve import training_fit
from infra.schema.read import read_stack_file
from infra.stack import from_values
from tests.conftest import ROOT, STACKS_DIR

# The sources' figures (the rates' docstrings name them), written out here apart from the code.
RAY_42632_PER_NODE = (200e6, 300e6)  # ray-project/ray #42632: one get at a time, per node
RAY_42632_ONE_SENDER = (2e9, 3e9)  # the same: one node sending to ten
VLLM_49459 = {"Qwen3-8B": (8.19e9 * 2, 3.721), "Qwen3-4B": (4.02e9 * 2, 1.904)}  # bytes, s
BENCH_2026_12_02 = (316_713_192, 0.785, 0.194)  # git history of rl_sync_results_cpu.json
BUCKET = 256 * 1024**2  # workloads/rl/sync.py SYNC_BUCKET_BYTES
CASES = {"rl": ("rl", None), "rl-7b": ("rl", "Qwen/Qwen2.5-7B-Instruct"), "rl-8b": ("rl-8b", None)}


def _plan(stack: str, model: str | None) -> Any:
    values, _ = read_stack_file(STACKS_DIR / f"Pulumi.{stack}.yaml")
    values = copy.deepcopy(values)
    if model:
        values["park:rl"]["model"] = model
    return from_values(values, stack).rl


def test_each_rate_is_within_what_its_source_measured() -> None:
    low, high = RAY_42632_PER_NODE
    assert low <= resolve_rl.PULL_BYTES_PER_S <= high
    assert RAY_42632_ONE_SENDER[1] >= resolve_rl.SEND_BYTES_PER_S
    measured = [nbytes / seconds for nbytes, seconds in VLLM_49459.values()]
    assert min(measured) >= resolve_rl.RELOAD_BYTES_PER_S  # not faster than vLLM measured it
    # publish and write: benchmarks/rl_sync.py's 2026-12-02 run (158M params), not more
    published, publish_s, stage_s = BENCH_2026_12_02
    assert published / publish_s >= resolve_rl.PUBLISH_BYTES_PER_S
    assert published / stage_s >= resolve_rl.WRITE_BYTES_PER_S
    assert resolve_rl.WRITE_BYTES_PER_S > resolve_rl.PULL_BYTES_PER_S  # the writes keep up


@pytest.mark.parametrize(("stack", "model"), CASES.values(), ids=CASES)
def test_the_estimate_is_the_phases_from_the_bytes_and_the_rates(
    stack: str, model: str | None
) -> None:
    plan = _plan(stack, model)
    sync = plan.sync
    params = training_fit.shapes(plan.facts.facts).params
    version = 2 * params  # bf16
    publish = version / resolve_rl.PUBLISH_BYTES_PER_S
    pull = max(
        version / resolve_rl.PULL_BYTES_PER_S,  # each rollout host, at the same time
        version * sync.rollout_hosts / sync.learner_hosts / resolve_rl.SEND_BYTES_PER_S,
    )
    write = version / resolve_rl.WRITE_BYTES_PER_S
    stage = max(pull, write) + min(BUCKET, version) / resolve_rl.WRITE_BYTES_PER_S
    reload = version / resolve_rl.RELOAD_BYTES_PER_S
    assert sync.seconds == pytest.approx(publish + stage + reload, rel=1e-9)
    phases = resolve_rl.sync_phases(params, sync.learner_hosts, sync.rollout_hosts)
    assert phases.version_bytes == version == sync.version_bytes
    assert (phases.publish_s, phases.pull_s, phases.write_s, phases.reload_s) == pytest.approx(
        (publish, pull, write, reload), rel=1e-9
    )
    # Every phase is in it: more than the pull alone at the sources' fastest per-node rate,
    # plus vLLM's reload at its fastest measured rate.
    floor = version / RAY_42632_PER_NODE[1] + version / max(b / s for b, s in VLLM_49459.values())
    assert sync.seconds > floor


def test_the_8b_stacks_sync_is_a_minute_or_more_not_seconds() -> None:
    """16.4 GB through one node's pull at 200-300 MB/s is 55-82 s alone."""
    sync = _plan("rl-8b", None).sync
    assert sync.version_bytes > 16e9 and sync.seconds > 60


def test_the_rates_line_names_every_source() -> None:
    for source in ("#42632", "#49459", "benchmarks/rl_sync.py"):
        assert source in resolve_rl.SYNC_RATES
    assert Path(ROOT / "benchmarks" / "rl_sync.py").is_file()
