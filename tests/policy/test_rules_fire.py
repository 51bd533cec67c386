"""(b) Deliberately broken inputs: each rule fires, with a message that says what to fix.

Each case takes a shipped stack's recorded resources, breaks one thing, and expects its
rule to report it. `test_every_rule_has_a_case` keeps the catalogue complete.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from infra import catalog
from policy.rules import RULES
from tests.policy.helpers import first, one, resources, run

NP = "gcp:container/nodePool:NodePool"
CLUSTER = "gcp:container/cluster:Cluster"
BUCKET = "gcp:storage/bucket:Bucket"
RAYJOB = "kubernetes:ray.io/v1:RayJob"
RAYSERVICE = "kubernetes:ray.io/v1:RayService"
Records = list[dict[str, Any]]


@dataclass(frozen=True)
class Case:
    rule: str
    stack: str
    mutate: Callable[[Records], None]
    expect: str  # a fragment of the message


def _cluster_spec(inputs: dict[str, Any]) -> dict[str, Any]:
    spec = inputs["spec"]
    return spec.get("rayClusterSpec") or spec["rayClusterConfig"]


def _worker(records: Records, type_token: str = RAYSERVICE) -> dict[str, Any]:
    return _cluster_spec(first(records, type_token))["workerGroupSpecs"][0]


def _head(records: Records, type_token: str = RAYJOB) -> dict[str, Any]:
    return _cluster_spec(first(records, type_token))["headGroupSpec"]


def _container(group: dict[str, Any]) -> dict[str, Any]:
    return group["template"]["spec"]["containers"][0]


def _add(records: Records, type_token: str, name: str, inputs: dict[str, Any]) -> None:
    records.append({"type": type_token, "name": name, "parent": None, "inputs": inputs})


def _add_object(records: Records, type_token: str, name: str, **fields: Any) -> None:
    """_add a Kubernetes object; apiVersion and kind as its type token names them
    (``kubernetes:<group>/<version>:<Kind>``, the core group's as plain ``v1``)."""
    _, group_version, kind = type_token.split(":")
    head = {"apiVersion": group_version.removeprefix("core/"), "kind": kind}
    _add(records, type_token, name, head | {"metadata": {"name": name}} | fields)


def _set(path: str, value: Any, type_token: str = NP, name: str | None = None):
    """A mutation setting (or, with value None, deleting) a dotted path in one resource."""

    def mutate(records: Records) -> None:
        node = one(records, type_token, name)
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value

    return mutate


def _do(*mutations: Callable[[Records], None]) -> Callable[[Records], None]:
    def mutate(records: Records) -> None:
        for m in mutations:
            m(records)

    return mutate


WI_MEMBER = "serviceAccount:park-prod-workload@my-gcp-project.iam.gserviceaccount.com"

CASES = [
    # --- TPU ---------------------------------------------------------------------------------
    Case(
        "tpu-pool-shape",
        "prod",
        _set("autoscaling.maxNodeCount", 8, name="train-v6e-16-rsv-s0"),
        "maxNodeCount is 8",
    ),
    Case(
        "tpu-pool-shape",
        "prod",
        _do(
            _set("autoscaling", None, name="train-v6e-16-rsv-s0"),
            _set("nodeCount", 2, name="train-v6e-16-rsv-s0"),
        ),
        "nodeCount is 2; allowed: 0 or 4",
    ),
    Case(
        "tpu-pool-shape",
        "prod",
        _set("autoscaling", {"totalMaxNodeCount": 4}, name="train-v6e-16-rsv-s0"),
        "per-zone",
    ),
    Case(
        "tpu-pool-shape",
        "prod",
        _set("placementPolicy.tpuTopology", "3x3", name="train-v6e-16-rsv-s0"),
        "allowed: 2x2, 2x4",
    ),
    Case(
        "tpu-topology-multi-host-only",
        "dev",
        _set("placementPolicy", {"type": "COMPACT", "tpuTopology": "2x4"}, name="v6e-8-s0"),
        "single-host slice",
    ),
    Case(
        "tpu-topology-multi-host-only",
        "prod",
        _set("placementPolicy.type", None, name="serve-v6e-16-s1"),
        "COMPACT",
    ),
    # TPU7x: GKE refuses COMPACT beside its workload policy ("Use workload policy instead")
    Case(
        "tpu-topology-multi-host-only",
        "ironwood",
        _set("placementPolicy.type", "COMPACT", name="train-7x-s0"),
        "workload policy",
    ),
    # ... and a bare topology, no policy named
    Case(
        "tpu-topology-multi-host-only",
        "ironwood",
        _set("placementPolicy", {"type": "", "tpuTopology": "2x2x2"}, name="train-7x-s0"),
        "policyName",
    ),
    Case(
        "tpu-compact-single-zone",
        "prod",
        _set("nodeLocations", ["us-east5-a", "us-east5-b"], name="serve-v6e-16-s0"),
        "exactly one zone",
    ),
    Case(
        "pool-capacity",
        "dev",
        _set(
            "nodeConfig.reservationAffinity",
            {
                "consumeReservationType": "SPECIFIC_RESERVATION",
                "key": "compute.googleapis.com/reservation-name",
                "values": ["r"],
            },
            name="v6e-8-s0",
        ),
        "spot and a reservation",
    ),
    Case(
        "pool-capacity",
        "prod",
        _set("nodeConfig.reservationAffinity.values", ["a", "b"], name="train-v6e-16-rsv-s0"),
        "exactly one",
    ),
    Case(
        "pool-capacity",
        "dev",
        _set("nodeConfig.flexStart", True, name="v6e-8-s0"),
        "flex-start cannot use spot",
    ),
    Case(
        "pool-capacity",
        "prod",
        _do(
            _set("queuedProvisioning", {"enabled": True}, name="serve-v6e-16-s0"),
            _set("autoscaling.minNodeCount", 4, name="serve-v6e-16-s0"),
        ),
        "queued provisioning needs autoscaling.minNodeCount 0",
    ),
    Case(
        "pool-capacity",
        "prod",
        _set("queuedProvisioning", {"enabled": True}, name="serve-v6e-16-s1"),
        "management.autoRepair false",
    ),
    Case(
        "tpu-idle-scale-to-zero",
        "prod",
        _set("autoscaling.minNodeCount", 4, name="train-v6e-16-rsv-s0"),
        "while idle",
    ),
    Case(
        "tpu-idle-scale-to-zero",
        "dev",
        _do(_set("autoscaling", None, name="v6e-8-s0"), _set("nodeCount", 1, name="v6e-8-s0")),
        "stay up while idle",
    ),
    # --- KubeRay -----------------------------------------------------------------------------
    Case(
        "rayjob-shutdown-after-finish",
        "dev",
        lambda r: first(r, RAYJOB)["spec"].update(shutdownAfterJobFinishes=False),
        "shutdownAfterJobFinishes: true",
    ),
    Case(
        "tpu-requires-toleration",
        "prod",
        lambda r: _worker(r)["template"]["spec"].pop("tolerations"),
        "tolerate the taint",
    ),
    Case(
        "tpu-requires-toleration",
        "dev",
        lambda r: _head(r)["template"]["spec"]["containers"][0]["resources"]["limits"].update(
            {catalog.TPU_RESOURCE: "4"}
        ),
        "headGroupSpec.template requests google.com/tpu",
    ),
    Case(
        "ray-tpu-worker-shape",
        "prod",
        lambda r: _worker(r, RAYJOB).update(numOfHosts=2),
        "numOfHosts is 2; topology 4x4 with 4 chips per host is 4 host(s)",
    ),
    Case(
        "ray-tpu-worker-shape",
        "prod",
        lambda r: [
            _container(_worker(r))["resources"][side].update({catalog.TPU_RESOURCE: "8"})
            for side in ("requests", "limits")
        ],
        "8 per pod does not fit topology 4x4",
    ),
    Case(
        "ray-tpu-worker-shape",
        "dev",
        lambda r: _worker(r)["template"]["spec"]["nodeSelector"].pop(catalog.TOPOLOGY_LABEL),
        "nodeSelector lacks",
    ),
    Case(
        "ray-tpu-worker-shape",
        "dev",
        lambda r: _container(_worker(r))["resources"]["requests"].update(
            {catalog.TPU_RESOURCE: "4"}
        ),
        "requests (4) must equal limits (8)",
    ),
    Case(
        "ray-workers-target-tpu-pools",
        "prod",
        lambda r: (
            _worker(r, RAYJOB)["template"]["spec"]["nodeSelector"].update(
                {catalog.TOPOLOGY_LABEL: "8x8"}
            ),
            _worker(r, RAYJOB).update(numOfHosts=16),
        ),
        "no TPU node pool in this stack carries the labels",
    ),
    Case(
        "ray-workers-target-tpu-pools",
        "dev",
        _set("autoscaling.maxNodeCount", 0, name="serve-v6e-8-s0"),
        "up to 1 slice(s) wanted but the matching pools (serve-v6e-8-s0) hold 0",
    ),
    Case(
        "ray-workers-target-tpu-pools",
        "prod",
        lambda r: _worker(r)["template"]["spec"]["nodeSelector"].pop("park-gke/pool"),
        "matches nodes of several pools (serve-v6e-16, train-v6e-16)",
    ),
    Case(
        "ray-workers-target-tpu-pools",
        "prod",
        lambda r: _worker(r).update(maxReplicas=3),
        "up to 3 slice(s) wanted but the matching pools",
    ),
    # --- Security ----------------------------------------------------------------------------
    Case(
        "gke-workload-identity",
        "dev",
        _set("workloadIdentityConfig", None, CLUSTER),
        "workloadIdentityConfig.workloadPool",
    ),
    Case(
        "gke-workload-identity",
        "prod",
        _set("nodeConfig.workloadMetadataConfig.mode", "GCE_METADATA", name="cpu"),
        "GKE_METADATA",
    ),
    Case(
        "no-service-account-keys",
        "dev",
        lambda r: _add(r, "gcp:serviceaccount/key:Key", "ci-key", {"serviceAccountId": "x"}),
        "service-account keys are not allowed",
    ),
    Case(
        "no-service-account-keys",
        "dev",
        lambda r: _add(r, "pulumi:providers:gcp", "gcp", {"credentials": '{"type": "x"}'}),
        "static credential",
    ),
    Case(
        "node-sa-not-default",
        "prod",
        _set("nodeConfig.serviceAccount", "default", name="serve-v6e-16-s0"),
        "not the default",
    ),
    Case(
        "node-sa-not-default",
        "dev",
        _set(
            "nodeConfig.serviceAccount", "123456789-compute@developer.gserviceaccount.com", CLUSTER
        ),
        "not the default",
    ),
    Case(
        "gke-private-nodes",
        "prod",
        _set("privateClusterConfig.enablePrivateNodes", False, CLUSTER),
        "enablePrivateNodes true",
    ),
    Case(
        "gke-private-nodes",
        "dev",
        _set("masterAuthorizedNetworksConfig.cidrBlocks", [{"cidrBlock": "0.0.0.0/0"}], CLUSTER),
        "open the control plane",
    ),
    Case(
        "bucket-uniform-access",
        "dev",
        _set("uniformBucketLevelAccess", False, BUCKET),
        "uniformBucketLevelAccess true",
    ),
    Case(
        "bucket-uniform-access",
        "prod",
        _set("publicAccessPrevention", "inherited", BUCKET),
        "publicAccessPrevention 'enforced'",
    ),
    Case(
        "no-public-iam-members",
        "dev",
        lambda r: _add(
            r,
            "gcp:storage/bucketIAMMember:BucketIAMMember",
            "public-read",
            {"bucket": "b", "role": "roles/storage.objectViewer", "member": "allUsers"},
        ),
        "to allUsers",
    ),
    Case(
        "no-public-iam-members",
        "dev",
        lambda r: _add(
            r,
            "gcp:projects/iAMBinding:IAMBinding",
            "viewers",
            {"project": "p", "role": "roles/viewer", "members": ["allAuthenticatedUsers"]},
        ),
        "allAuthenticatedUsers",
    ),
    Case(
        "workload-roles-bucket-scoped",
        "prod",
        lambda r: _add(
            r,
            "gcp:projects/iAMMember:IAMMember",
            "workload-admin",
            {"project": "my-gcp-project", "role": "roles/storage.admin", "member": WI_MEMBER},
        ),
        "may only hold object roles",
    ),
    Case(
        "workload-roles-bucket-scoped",
        "dev",
        _set(
            "role",
            "roles/storage.admin",
            "gcp:storage/bucketIAMMember:BucketIAMMember",
            "storage-workload-objectUser",
        ),
        "allowed: roles/storage.objectViewer",
    ),
    Case(
        "workload-roles-bucket-scoped",
        "dev",
        _set(
            "bucket",
            "someone-elses-bucket",
            "gcp:storage/bucketIAMMember:BucketIAMMember",
            "storage-workload-objectUser",
        ),
        "which this stack does not create",
    ),
    Case(
        "ray-not-public",
        "prod",
        lambda r: first(r, RAYSERVICE)["spec"]["serveService"]["spec"].update(type="LoadBalancer"),
        "park-gke/expose-serve",
    ),
    Case(
        "ray-not-public",
        "dev",
        lambda r: _head(r).update(serviceType="NodePort"),
        "Ray head Service",
    ),
    Case(
        "ray-not-public",
        "dev",
        lambda r: _add_object(
            r, "kubernetes:core/v1:Service", "dash", spec={"type": "LoadBalancer"}
        ),
        "Service of type LoadBalancer",
    ),
    Case(
        "ray-not-public",
        "dev",
        lambda r: _add_object(r, "kubernetes:networking.k8s.io/v1:Ingress", "dash", spec={}),
        "an Ingress exposes",
    ),
    Case(
        "deletion-protection-prod",
        "prod",
        _set("deletionProtection", False, CLUSTER),
        "deletionProtection must be true",
    ),
    Case("deletion-protection-prod", "prod", _set("forceDestroy", True, BUCKET), "forceDestroy"),
    Case(
        "no-plaintext-secrets",
        "prod",
        lambda r: _container(_head(r, RAYSERVICE))["env"].append(
            {"name": "HF_TOKEN", "value": "not-a-pattern-but-a-secret-name"}
        ),
        "sets HF_TOKEN as a literal",
    ),
    Case(
        "no-plaintext-secrets",
        "dev",
        lambda r: first(r, RAYJOB)["spec"].update(
            runtimeEnvYAML="env_vars:\n  WANDB_API_KEY: abc123\n"
        ),
        "WANDB_API_KEY in plain text",
    ),
    Case(
        "no-plaintext-secrets",
        "dev",
        lambda r: first(r, RAYJOB)["spec"].update(
            entrypoint="python -m workloads.train --token hf_" + "a" * 34
        ),
        "a Hugging Face token in plain text",
    ),
    Case(
        "no-plaintext-secrets",
        "dev",
        lambda r: _add_object(
            r,
            "kubernetes:core/v1:ConfigMap",
            "creds",
            data={"key.json": '{"type": "service_account", "private_key_id": "x"}'},
        ),
        "a service-account key file",
    ),
    Case(
        "pod-hardening",
        "dev",
        lambda r: _container(_worker(r, RAYJOB)).pop("resources"),
        "set resources requests.cpu, requests.memory, limits.cpu, limits.memory",
    ),
    Case(
        "pod-hardening",
        "prod",
        lambda r: _container(_head(r))["securityContext"].update(privileged=True),
        "privileged containers are not allowed",
    ),
    Case(
        "pod-hardening",
        "prod",
        lambda r: (
            first(r, RAYJOB)["spec"]["submitterPodTemplate"]["spec"].pop("securityContext"),
            _container({"template": first(r, RAYJOB)["spec"]["submitterPodTemplate"]})[
                "securityContext"
            ].pop("runAsNonRoot"),
        ),
        "set runAsNonRoot true",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.rule}-{i}" for i, c in enumerate(CASES)])
def test_rule_fires_on_broken_input(case: Case):
    records = resources(case.stack)
    case.mutate(records)
    fired = [v for v in run(records, case.stack) if v.rule == case.rule]
    assert fired, f"{case.rule} did not fire"
    assert any(case.expect in v.message for v in fired), [v.message for v in fired]


def test_every_rule_has_a_case():
    covered = {c.rule for c in CASES}
    assert [r.name for r in RULES if r.name not in covered] == []
