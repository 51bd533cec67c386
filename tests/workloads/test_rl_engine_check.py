"""The rollout engine check (workloads/rl/engine_check.py) on vLLM for CPU, one engine: a tiny
Llama with tied embeddings (the head is the embedding, as in Qwen2.5-1.5B) publishes a version,
the running engine loads it, and its greedy tokens and log-probabilities are the learner's own
forward's. Before the tied head was processed again after the reload, the engine computed logits
from the old head (|Δlogp| ≈ 2). The engine reports no fp32 patches (vllm-torchtpu is not here).

The untied load against the learner is tests/workloads/test_rl_rollout.py's; the comparison with
a fresh engine (a second start, ~40 s idle, minutes busy) is the CLI's default on a device.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads.rl.engine_check import run_check, tied_copy

pytestmark = [pytest.mark.serve, pytest.mark.timeout(600)]


def test_a_tied_model_loaded_into_a_running_engine_answers_as_the_learner(
    tmp_path: Path,
) -> None:
    from workloads.serve.tiny_model import build_tiny_model

    start = tied_copy(build_tiny_model(), tmp_path / "tied")
    result = run_check(start, tmp_path, max_tokens=6, fresh=False)
    assert [r["engine"] for r in result.numerics] == ["vllm"]
    assert all(r["patches"] == [] and r["flipped_layers"] == 0 for r in result.numerics)
    assert result.tokens_changed  # the load did change what the engine answers
    assert result.max_dlogp_fresh is None  # one engine only
    assert result.passed, result
