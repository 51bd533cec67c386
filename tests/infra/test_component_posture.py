"""A package user's components are judged on the exposure their own arguments carry, by the
stack's posture rules (infra/rules/security.py): the same verdict and message as a stack file,
in the component's argument names, with `acknowledge_public` as park:policy.acknowledgePublic."""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

import park_gke
from infra.schema.errors import ConfigError
from infra.stack import from_values
from park_gke import testing
from park_gke.testing import ProgramError

ZONE = "us-east5-b"
CLUSTER = {"project": "p", "location": ZONE, "network": "vpc", "subnetwork": "subnet"}
SERVE_POOL = {"name": "serve", "machine_type": "ct6e-standard-8t", "topology": "2x4"}
SERVICE = {"project": "p", "location": ZONE, "pool": SERVE_POOL}
QWEN = [{"name": "qwen", "source": "Qwen/Qwen3-1.7B"}]
GKE = "gcp:container/cluster:Cluster"


def _cluster(**more: Any) -> Any:
    return lambda: park_gke.Cluster("gke", {**CLUSTER, **more})  # type: ignore[typeddict-item]


def _service(**more: Any) -> Any:
    args = {**SERVICE, "models": QWEN, **more}
    return lambda: park_gke.LlmService("chat", args)  # type: ignore[arg-type]


def _stack_problems(stack: str, values: dict[str, Any]) -> dict[str, str]:
    """The stack path's refusals of the same settings: key → message."""
    base = {"gcp:project": "p", "gcp:region": "us-east5", "park:zone": ZONE}
    with pytest.raises(ConfigError) as err:
        from_values({**base, **values}, stack)
    return {p.key: p.message for p in err.value.problems}


def _as_component_says(message: str) -> str:
    """The stack keys a posture message names, as the Cluster and LlmService arguments."""
    for key, argument in (
        ("park:policy.acknowledgePublic", "acknowledge_public"),
        ("park:cluster.privateEndpoint", "private_endpoint"),
    ):
        message = message.replace(key, f"args.{argument}")
    return message


def test_a_public_control_plane_on_a_production_stack_is_refused_as_the_stack_would_be():
    with pytest.raises(ProgramError) as err:
        testing.run(_cluster(), project="p", stack="prod")
    message = str(err.value)
    assert "Cluster 'gke'" in message and "park:" not in message
    stack = _stack_problems("prod", {})
    said = _as_component_says(stack["park:cluster.masterAuthorizedNetworks"])
    assert f"args.master_authorized_networks = []: {said}" in message
    assert "args.acknowledge_public: [control-plane]" in message
    result = testing.run(_cluster(acknowledge_public=["control-plane"]), project="p", stack="prod")
    assert result.of_type(GKE)


def test_public_nodes_need_their_own_acknowledgement():
    closed = {"master_authorized_networks": [{"cidr": "203.0.113.0/24"}]}
    with pytest.raises(ProgramError) as err:
        testing.run(_cluster(private_nodes=False, **closed), project="p", stack="prod")
    assert "args.private_nodes = False" in str(err.value)
    assert "args.acknowledge_public: [nodes]" in str(err.value)
    acknowledged = _cluster(private_nodes=False, acknowledge_public=["nodes"], **closed)
    assert testing.run(acknowledged, project="p", stack="prod").of_type(GKE)


def test_deletion_protection_asked_for_marks_production_on_any_stack_name():
    with pytest.raises(ProgramError) as err:
        testing.run(_cluster(deletion_protection=True), project="p", stack="dev")
    assert "args.master_authorized_networks = []" in str(err.value)


def test_everyone_is_refused_on_every_stack():
    everyone = {"master_authorized_networks": [{"cidr": "0.0.0.0/0"}]}
    with pytest.raises(ProgramError) as err:
        testing.run(_cluster(**everyone), project="p", stack="dev")
    assert "args.master_authorized_networks[0].cidr = '0.0.0.0/0'" in str(err.value)
    stack = _stack_problems(
        "dev", {"park:cluster": {"masterAuthorizedNetworks": [{"cidr": "0.0.0.0/0"}]}}
    )
    assert _as_component_says(stack["park:cluster.masterAuthorizedNetworks[0].cidr"]) in str(
        err.value
    )


def test_elsewhere_an_exposure_is_a_warning_in_argument_names(monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: said.append(message))
    assert testing.run(_cluster(), project="p", stack="dev").of_type(GKE)
    assert any(
        m.startswith("Cluster 'gke': args.master_authorized_networks = []") and "park:" not in m
        for m in said
    ), said


def test_an_unknown_exposure_is_refused_naming_the_argument():
    with pytest.raises(ProgramError) as err:
        testing.run(_cluster(acknowledge_public=["everything"]), project="p", stack="dev")
    assert "args.acknowledge_public[0] = 'everything'" in str(err.value)


def test_a_public_endpoint_on_a_production_stack_and_only_that():
    with pytest.raises(ProgramError) as err:
        testing.run(_service(expose_publicly=True), project="p", stack="prod")
    message = str(err.value)
    stack = _stack_problems(
        "prod",
        {
            "park:cluster": {"privateEndpoint": True},
            "park:tpuPools": [
                {"name": "serve", "machineType": "ct6e-standard-8t", "topology": "2x4"}
            ],
            "park:serving": {
                "enabled": True,
                "pool": "serve",
                "exposePublicly": True,
                "models": QWEN,
            },
        },
    )
    said = _as_component_says(stack["park:serving.exposePublicly"])
    assert "LlmService 'chat'" in message and f"args.expose_publicly = True: {said}" in message
    # judged on its own arguments: not on the control plane of a cluster it does not create
    assert "master_authorized_networks" not in message and "park:" not in message
    assert testing.run(_service(), project="p", stack="prod").manifests()
    acknowledged = _service(expose_publicly=True, acknowledge_public=["serving"])
    assert testing.run(acknowledged, project="p", stack="prod").manifests()
