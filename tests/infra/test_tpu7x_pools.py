"""TPU7x pools stay put: what GKE reads back for a workload-policy pool gives no diff against
what park-gke sends, compared the way the provider compares.

The provider (pulumi-gcp 10.2.0, bridged terraform-provider-google) reads a pool's placement
policy back with `flattenNodePoolPlacementPolicy`: `{type: pp.Type, policy_name: pp.PolicyName,
tpu_topology: pp.TpuTopology}`, Go strings, so a field GKE leaves out reads back as "". It then
diffs each string attribute as terraform-plugin-sdk's `diffString` does: old and new weakly
decoded to strings (nil → ""), no diff when equal. GKE stores no `type` for a workload-policy
pool (vllm-project/ci-infra PR 547; magic-modules PR 17643: "returns it as empty on GET").
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from infra import catalog
from infra.plan import node_pools
from infra.stack import from_values, read_offline

ROOT = Path(__file__).resolve().parents[2]
CONTAINER = ROOT / "infra" / "schemas" / "gke-container-v1" / "container.v1.json"
# The provider's attribute ↔ the API's field (resource_container_node_pool.go's flatten/expand).
PROVIDER_FIELDS = {"type": "type", "policy_name": "policyName", "tpu_topology": "tpuTopology"}


def _ironwood_pools() -> list[node_pools.NodePoolPlan]:
    offline = read_offline(ROOT / "stacks" / "Pulumi.ironwood.yaml")
    plan = from_values(dict(offline.values), offline.stack)
    return [p for p in node_pools.all_node_pools(plan) if p.kind == "tpu"]


def _gke_reads_back(sent: dict[str, Any]) -> dict[str, Any]:
    """PlacementPolicy as GKE returns it for a workload-policy pool: the policy and the
    topology it derived, no type; only fields the API's own schema has."""
    api_fields = json.loads(CONTAINER.read_text())["schemas"]["PlacementPolicy"]["properties"]
    body = {"policyName": sent["policy_name"], "tpuTopology": sent["tpu_topology"]}
    assert set(body) <= set(api_fields)
    return body


def _flatten(api: dict[str, Any]) -> dict[str, str]:
    """flattenNodePoolPlacementPolicy: every attribute, "" where the API sent nothing."""
    return {attr: str(api.get(field) or "") for attr, field in PROVIDER_FIELDS.items()}


def _diff(state: dict[str, str], config: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """diffString per attribute: weak-decoded old vs new, a diff only where they differ."""
    changed = {}
    for attr in PROVIDER_FIELDS:
        old, new = state.get(attr) or "", config.get(attr)
        new = "" if new is None else str(new)
        if old != new:
            changed[attr] = (old, new)
    return changed


def test_type_is_required_by_the_provider_and_unspecified_in_the_api():
    """Why "" is sent at all: pulumi-gcp's NodePoolPlacementPolicyArgs requires `type`, and the
    API's enum has no value for "a workload policy" (TYPE_UNSPECIFIED or COMPACT)."""
    from pulumi_gcp.container import NodePoolPlacementPolicyArgs

    required = inspect.signature(NodePoolPlacementPolicyArgs.__init__).parameters["type"]
    assert required.default is inspect.Parameter.empty
    enum = json.loads(CONTAINER.read_text())["schemas"]["PlacementPolicy"]["properties"]["type"]
    assert enum["enum"] == ["TYPE_UNSPECIFIED", "COMPACT"]


def test_what_gke_reads_back_gives_no_diff():
    multi = [p for p in _ironwood_pools() if p.hosts > 1]
    assert multi, "the ironwood stack has a multi-host TPU7x pool"
    for pool in multi:
        sent = {
            **pool.args["placement_policy"],
            "policy_name": node_pools.workload_policy_name("park-ironwood", pool.pool, "2x2x2"),
        }
        state = _flatten(_gke_reads_back(sent))
        assert _diff(state, sent) == {}
        # what cluster-toolkit#5691 hit: COMPACT beside the policy diffs on every refresh
        assert _diff(state, {**sent, "type": "COMPACT"}) == {"type": ("", "COMPACT")}


def test_single_host_tpu7x_pools_take_no_policy():
    """GKE refuses a topology (and so a workload policy, which carries one) on a single-host
    pool (xpk PR 825)."""
    single = [p for p in _ironwood_pools() if p.hosts == 1]
    assert single
    for pool in single:
        assert "placement_policy" not in pool.args and pool.workload_policy is None


def test_each_multi_host_pool_plans_its_workload_policy():
    for pool in _ironwood_pools():
        tpu_slice = next(
            s
            for s in catalog.all_slices()
            if s.machine_type == pool.args["node_config"]["machine_type"] and s.hosts == pool.hosts
        )
        assert pool.args["node_config"]["disk_type"] == tpu_slice.generation.boot_disk_type
        if pool.hosts > 1:
            assert pool.workload_policy == {
                "region": "us-central1",
                "workload_policy": {
                    "type": "HIGH_THROUGHPUT",
                    "accelerator_topology": pool.args["placement_policy"]["tpu_topology"],
                },
            }


@pytest.mark.parametrize(
    ("cluster", "pool", "topology"),
    [
        ("park-ironwood", "train-7x", "2x2x2"),
        ("projects/p/locations/us-central1-c/clusters/" + "c" * 40, "p" * 37, "4x4x4"),
    ],
)
def test_workload_policy_names_are_rfc1035(cluster, pool, topology):
    import re

    name = node_pools.workload_policy_name(cluster, pool, topology)
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name), name
    assert name == node_pools.workload_policy_name(cluster, pool, topology)  # deterministic
