"""An RL rollout engine's TP stays on one host (issue 40): each engine loads every weight version
from a folder in its own host's memory (workloads/rl/sync.py), so an engine wider than a host is
refused at preview, naming the key, the value and the host limit."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from infra.engines import VLLM_TPU
from infra.resolve import rl as resolve_rl
from infra.schema.errors import ConfigError
from infra.schema.read import read_stack_file
from infra.stack import from_values
from tests.conftest import STACKS_DIR

LEARNER = {"name": "learner-v6e-32", "machineType": "ct6e-standard-4t", "topology": "4x8"}
FOUR_HOSTS = {"name": "rollout-v6e-16", "machineType": "ct6e-standard-4t", "topology": "4x4"}


def _on_four_hosts(**rl: Any) -> dict[str, Any]:
    """The 8B stack (Qwen3-8B: 32 heads, 8 KV heads, so TP 16 suits the model) with its engines
    on a 4x4 v6e slice: 4 hosts of 4 chips."""
    values, _ = read_stack_file(STACKS_DIR / "Pulumi.rl-8b.yaml")
    values = copy.deepcopy(values)
    values["park:tpuPools"] = [dict(LEARNER), dict(FOUR_HOSTS)]
    values["park:rl"].update(learnerPool="learner-v6e-32", rolloutPool="rollout-v6e-16", **rl)
    return values


def _problems(values: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(ConfigError) as err:
        from_values(values, "rl-8b")
    return {p.key: str(p) for p in err.value.problems}


def test_tp_16_on_a_4x4_slice_is_refused_naming_key_value_and_host_limit():
    problems = _problems(_on_four_hosts(tensorParallelSize=16))
    assert list(problems) == ["park:rl.tensorParallelSize"]  # the one mistake
    text = problems["park:rl.tensorParallelSize"]
    assert "16" in text and "spans 4 hosts" in text
    assert "host limit is 4 chips per host" in text and "allowed:" in text


def test_an_unset_tp_that_resolves_across_hosts_names_the_pool():
    problems = _problems(_on_four_hosts())
    text = problems["park:rl.rolloutPool"]
    assert "rollout-v6e-16" in text and "TP 16" in text and "4 chips per host" in text


def test_the_shipped_single_host_rollout_pools_still_resolve():
    for name in ("Pulumi.rl.yaml", "Pulumi.rl-8b.yaml"):
        values, _ = read_stack_file(STACKS_DIR / name)
        plan = from_values(values, name.removeprefix("Pulumi.").removesuffix(".yaml"))
        assert plan.rl is not None and plan.rl.rollout.tpu is not None
        assert plan.rl.rollout.tensor_parallel <= plan.rl.rollout.tpu.slice.devices_per_host


def test_an_engine_of_whole_hosts_offers_one_hosts_tp_first(monkeypatch):
    """With an engine whose TP may be whole hosts (vllm-tpu), the unset TP is one host's, and
    a TP of two hosts set by hand is refused, the one-host TPs offered instead."""
    monkeypatch.setattr(resolve_rl, "ROLLOUT_ENGINE", VLLM_TPU.name)
    plan = from_values(_on_four_hosts(), "rl-8b")
    assert plan.rl is not None and plan.rl.rollout.tensor_parallel <= 4
    assert 8 in plan.rl.rollout.options
    text = _problems(_on_four_hosts(tensorParallelSize=8))["park:rl.tensorParallelSize"]
    assert "spans 2 hosts" in text and "allowed: a TP of 1, 2, 4" in text
