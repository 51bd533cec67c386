"""Test a Pulumi program that uses park-gke without a cloud: run it under Pulumi's mocks.

    from park_gke import testing

    result = testing.run(my_program, clusters=[testing.existing_cluster("team-gke")])
    assert result.of_type("kubernetes:ray.io/v1:RayService")

The program runs as `pulumi preview` would run it, offline: every resource it declares is
recorded with its inputs (secrets masked), and what the engine would refuse is refused here
too: a component's bad arguments, and two resources under one URN ("Duplicate resource URN").
An ExistingCluster's lookup is answered from `clusters` (`existing_cluster()` builds one GKE
would return for a cluster park-gke can use; change fields to see how a preview fails).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from infra.tools.render import ProgramError, Resource, manifests_of, run_under_mocks

__all__ = ["ProgramError", "Resource", "Result", "existing_cluster", "run"]

GET_CLUSTER = "gcp:container/getCluster:getCluster"
CLIENT_CONFIG = "gcp:organizations/getClientConfig:getClientConfig"


def existing_cluster(
    name: str,
    location: str = "us-east5-b",
    project: str = "project",
    *,
    node_service_account: str = "nodes@project.iam.gserviceaccount.com",
    **changes: Any,
) -> dict[str, Any]:
    """What GKE's getCluster answers (its wire names) for a Standard cluster with Workload
    Identity, GCS FUSE, the Ray add-on and a version TPU v6e runs on; `changes` override
    fields (e.g. ``enableAutopilot=True``)."""
    answer: dict[str, Any] = {
        "name": name,
        "location": location,
        "project": project,
        "masterVersion": "1.35.8-gke.1036000",
        "endpoint": "203.0.113.7",
        "enableAutopilot": False,
        "datapathProvider": "ADVANCED_DATAPATH",
        "workloadIdentityConfigs": [{"workloadPool": f"{project}.svc.id.goog"}],
        "addonsConfigs": [
            {
                "gcsFuseCsiDriverConfigs": [{"enabled": True}],
                "rayOperatorConfigs": [{"enabled": True}],
            }
        ],
        "masterAuths": [{"clusterCaCertificate": "Q0E="}],
        "controlPlaneEndpointsConfigs": [
            {
                "dnsEndpointConfigs": [
                    {"endpoint": f"gke-{name}.{location}.gke.goog", "allowExternalTraffic": True}
                ]
            }
        ],
        "nodeConfigs": [{"serviceAccount": node_service_account}],
    }
    answer.update(changes)
    return answer


@dataclass
class Result:
    """What a program declared: its resources (sorted by type and name) and stack outputs."""

    resources: list[Resource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    def of_type(self, type_token: str) -> list[Resource]:
        return [r for r in self.resources if r.type == type_token]

    def named(self, name: str) -> list[Resource]:
        return [r for r in self.resources if r.name == name]

    def manifests(self) -> list[dict[str, Any]]:
        """Every Kubernetes object, as the API server would receive it."""
        return manifests_of(self.resources)


def _answers(clusters: Iterable[dict[str, Any]]) -> Callable[[str, dict[str, Any]], dict]:
    known = {(c["name"], c["location"]): c for c in clusters}

    def call(token: str, args: dict[str, Any]) -> dict[str, Any]:
        if token == CLIENT_CONFIG:  # WorkloadImage's push token: a stand-in, never written
            return {"accessToken": "mock-access-token"}
        if token != GET_CLUSTER:
            raise ProgramError(
                f"no mock answers {token} (park_gke.testing mocks {GET_CLUSTER} and "
                f"{CLIENT_CONFIG})",
                [],
            )
        found = known.get((args.get("name"), args.get("location")))
        if found is None:
            given = ", ".join(f"{n} in {loc}" for n, loc in known) or "none"
            raise ProgramError(
                f"cluster {args.get('name')!r} in {args.get('location')!r} is not among the "
                f"mocked clusters ({given}): pass it in clusters=[existing_cluster(...)]",
                [],
            )
        return found

    return call


def run(
    program: Callable[[], Any],
    *,
    stack: str = "test",
    project: str = "project",
    config: dict[str, Any] | None = None,
    clusters: Iterable[dict[str, Any]] = (),
    pulumi_project: str = "test",
) -> Result:
    """Run `program` under Pulumi's mocks as stack `stack` of Pulumi project `pulumi_project`
    (what `pulumi.Config()` reads keys under; `config` holds full keys, e.g. ``gcp:project``).
    Raises ProgramError with the program's own error, or the engine's for duplicate URNs."""
    resources, outputs = run_under_mocks(
        program,
        stack=stack,
        project=project,
        config={"gcp:project": project, **(config or {})},
        calls=_answers(clusters),
        pulumi_project=pulumi_project,
    )
    return Result(resources, outputs)
