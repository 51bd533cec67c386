"""A name the caller never wrote, taken from the component's name, is refused naming the argument
that would change it and the length allowed (issue 41, item 7)."""

from __future__ import annotations

import pytest

import park_gke
from park_gke.testing import run_under_mocks

POOL = {
    "cluster": "projects/p/locations/us-east5-b/clusters/c",
    "location": "us-east5-b",
    "node_service_account": "sa@p.iam.gserviceaccount.com",
    "machine_type": "ct6e-standard-8t",
    "topology": "2x4",
}


def _refusal(component: str, **args: str) -> str:
    def program() -> None:
        park_gke.TpuSlicePool(component, {**POOL, **args})  # type: ignore[typeddict-item]

    with pytest.raises(Exception) as refused:
        run_under_mocks(program, stack="dev")
    return str(refused.value)


@pytest.mark.parametrize(
    "name, allowed",
    [("Serve_Pool", "1-40"), ("pool-" + "x" * 31, "≤ 30 chars")],  # GKE's, then park's pools
)
def test_a_name_from_the_component_says_which_argument_changes_it(name, allowed):
    message = _refusal(name)
    assert f"args.name = '{name}'" in message
    assert allowed in message
    assert "defaults to the component's name" in message and "set args.name" in message


def test_a_name_the_caller_gave_is_refused_without_the_hint():
    message = _refusal("fine", name="Bad_Name")
    assert "args.name = 'Bad_Name'" in message
    assert "defaults to the component's name" not in message
