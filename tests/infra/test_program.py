"""The whole Pulumi program under mocks, for every shipped stack: the resource graph is right."""

from __future__ import annotations

import copy

import pytest

from infra import catalog
from infra.plan.storage import BUCKET_ROLES
from infra.resolve.types import rungs_of
from infra.schema.errors import ConfigError
from infra.schema.read import read_stack_file
from infra.tools.render import ProgramError, run_program
from tests.conftest import STACKS_DIR

NODE_POOL = "gcp:container/nodePool:NodePool"
CLUSTER = "gcp:container/cluster:Cluster"
RESOURCE_POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"


def test_one_node_pool_per_slice(rendered):
    for pool in rendered.config.tpu_pools:
        tpu = catalog.lookup(pool.machine_type, pool.topology)
        pools = [r for r in rendered.of_type(NODE_POOL) if r.parent == pool.name]
        rungs = [f"-{r.tag}" for r in rungs_of(pool)] if pool.ladder else [""]
        expected = [f"{pool.name}{rung}-s{i}" for rung in rungs for i in range(pool.slices)]
        assert sorted(p.name for p in pools) == sorted(expected)
        for node_pool in pools:
            inputs = node_pool.inputs
            if tpu.workload_policy:
                # a workload policy (TPU7x): GKE refuses COMPACT there and stores no type
                (policy,) = [r for r in rendered.of_type(RESOURCE_POLICY) if r.parent == pool.name]
                assert policy.inputs["workloadPolicy"] == {
                    "type": "HIGH_THROUGHPUT",
                    "acceleratorTopology": tpu.topology,
                }
                assert inputs["placementPolicy"] == {
                    "type": "",
                    "policyName": policy.inputs["name"],
                    "tpuTopology": tpu.topology,
                }
            elif tpu.multi_host:
                assert inputs["placementPolicy"] == {"type": "COMPACT", "tpuTopology": tpu.topology}
            else:
                assert "placementPolicy" not in inputs
            if pool.autoscaling:
                assert inputs["autoscaling"]["minNodeCount"] == 0
                assert inputs["autoscaling"]["maxNodeCount"] == tpu.hosts
                assert inputs["initialNodeCount"] == 0
            else:
                assert inputs["nodeCount"] == tpu.hosts
            node_config = inputs["nodeConfig"]
            assert node_config["machineType"] == pool.machine_type
            assert node_config.get("diskType") == tpu.generation.boot_disk_type
            assert {"key": "google.com/tpu", "value": "present", "effect": "NO_SCHEDULE"} in (
                node_config["taints"]
            )
            assert node_config["labels"]["park-gke/pool"] == pool.name
            assert node_config["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
            assert node_config.get("spot", False) == (pool.capacity == "spot")
            if pool.capacity == "reservation":
                assert node_config["reservationAffinity"]["values"] == [pool.reservation]


def test_cluster_is_hardened(rendered):
    (cluster,) = rendered.of_type(CLUSTER)
    inputs = cluster.inputs
    config = rendered.config
    assert inputs["workloadIdentityConfig"] == {"workloadPool": f"{config.project}.svc.id.goog"}
    assert inputs["privateClusterConfig"]["enablePrivateNodes"] is True
    assert inputs["removeDefaultNodePool"] is True
    assert inputs["addonsConfig"]["gcsFuseCsiDriverConfig"] == {"enabled": True}
    assert inputs["monitoringConfig"]["managedPrometheus"]["enabled"] is True
    ray_addon = inputs["addonsConfig"]["rayOperatorConfigs"][0]
    assert ray_addon["enabled"] == (config.kuberay.install == "addon")
    # no exact pin: the cluster follows its release channel (infra/rules/pools.py:check_version)
    assert "minMasterVersion" not in inputs
    assert not inputs["nodeConfig"]["serviceAccount"].endswith(
        "-compute@developer.gserviceaccount.com"
    )


def test_workload_identity_and_bucket_scoped_iam(rendered):
    config = rendered.config
    assert not rendered.of_type("gcp:serviceaccount/key:Key"), "no service-account keys, ever"
    (binding,) = rendered.of_type("gcp:serviceaccount/iAMMember:IAMMember")
    assert binding.inputs["role"] == "roles/iam.workloadIdentityUser"
    assert binding.inputs["member"] == (
        f"serviceAccount:{config.project}.svc.id.goog[{config.namespace}/park-{config.stack}-workload]"
    )
    workload = next(
        r
        for r in rendered.of_type("gcp:serviceaccount/account:Account")
        if r.name.endswith("workload")
    )
    email = f"{workload.inputs['accountId']}@{config.project}.iam.gserviceaccount.com"
    # the workload GSA holds roles on the bucket only
    for member in rendered.of_type("gcp:projects/iAMMember:IAMMember"):
        assert member.inputs["member"] != f"serviceAccount:{email}"
    bucket_roles = rendered.of_type("gcp:storage/bucketIAMMember:BucketIAMMember")
    assert sorted(r.inputs["role"] for r in bucket_roles) == sorted(BUCKET_ROLES)
    for bucket_role in bucket_roles:
        assert bucket_role.inputs["bucket"] == rendered.plan.names.bucket
        assert bucket_role.inputs["member"] == f"serviceAccount:{email}"
    (ksa,) = [
        m
        for m in rendered.manifests()
        if m["kind"] == "ServiceAccount"
        and m["metadata"]["name"] == rendered.plan.names.workload_ksa
    ]
    assert ksa["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] == email
    (bucket,) = rendered.of_type("gcp:storage/bucket:Bucket")
    assert bucket.inputs["uniformBucketLevelAccess"] is True
    assert bucket.inputs["publicAccessPrevention"] == "enforced"


def test_every_resource_is_parented_to_its_component(rendered):
    for resource in rendered.resources:
        if resource.custom and resource.type != "pulumi:providers:kubernetes":
            assert resource.parent, f"{resource.type} {resource.name} has no parent component"


def test_workloads_wait_for_the_operator_and_their_pools(rendered):
    for workload in rendered.resources:
        if workload.type.startswith("kubernetes:ray.io"):
            pool = (
                workload.inputs["spec"].get("rayClusterSpec")
                or workload.inputs["spec"]["rayClusterConfig"]
            )
            group = pool["workerGroupSpecs"][0]["groupName"]
            assert "gke" in workload.dependencies  # the cluster (add-on CRDs) exists first
            assert any(d.startswith(group) and d.endswith("-s0") for d in workload.dependencies)
            (ksa,) = [
                r.name  # the Workspace's child for the KSA (logical names follow the component)
                for r in rendered.of_type("kubernetes:core/v1:ServiceAccount")
                if r.inputs["metadata"]["name"] == rendered.plan.names.workload_ksa
            ]
            assert ksa in workload.dependencies


def test_outputs(rendered):
    outputs = rendered.outputs
    assert outputs["kubeconfig"] == "[secret]"
    assert outputs["bucket"] == rendered.plan.names.bucket
    for pool in rendered.config.tpu_pools:
        tpu = catalog.lookup(pool.machine_type, pool.topology)
        assert outputs["tpu_pools"][pool.name] == {
            "chips": tpu.chips * pool.slices,
            "hosts": tpu.hosts * pool.slices,
        }


def test_no_plaintext_secret_in_any_input(rendered):
    import json

    text = json.dumps([r.as_json() for r in rendered.resources])
    assert "placeholder-set-with-pulumi-config-set-secret" not in text
    for secret in [m for m in rendered.manifests() if m["kind"] == "Secret"]:
        assert set(secret["stringData"].values()) == {"[secret]"}


def _prod_values():
    values, secrets = read_stack_file(STACKS_DIR / "Pulumi.prod.yaml")
    return copy.deepcopy(values), secrets


def test_helm_mode_installs_operator_webhook_and_cert_manager_in_order():
    values, secrets = _prod_values()
    values["park:kuberay"] = {"install": "helm"}
    rendered = run_program(values, "prod", secrets)
    releases = {r.inputs["name"]: r for r in rendered.of_type("kubernetes:helm.sh/v3:Release")}
    # and Kueue's, for prod's capacity ladder
    assert set(releases) == {"kuberay-operator", "cert-manager", "kuberay-tpu-webhook", "kueue"}
    assert releases["kuberay-operator"].inputs["version"] == "1.7.0"
    waits = {releases[n].name for n in ("cert-manager", "kuberay-operator")}
    assert waits <= set(releases["kuberay-tpu-webhook"].dependencies)
    (cluster,) = rendered.of_type(CLUSTER)
    assert cluster.inputs["addonsConfig"]["rayOperatorConfigs"][0]["enabled"] is False
    for workload in rendered.resources:
        if workload.type.startswith("kubernetes:ray.io"):
            assert {r.name for r in releases.values()} <= set(workload.dependencies)


def test_helm_mode_single_host_needs_no_webhook():
    values, secrets = _prod_values()
    values["park:kuberay"] = {"install": "helm"}
    values["park:tpuPools"] = [
        {"name": "train-v6e-16", "machineType": "ct6e-standard-8t", "topology": "2x4"},
        {"name": "serve-v6e-16", "machineType": "ct6e-standard-8t", "topology": "2x4"},
    ]
    values["park:training"] = {**values["park:training"], "globalBatchSize": 64}
    values["park:serving"]["models"][0]["tensorParallelSize"] = 8
    values["park:serving"]["upgradeStrategy"] = "None"  # blue/green needs a second slice
    rendered = run_program(values, "prod", secrets)
    assert [r.inputs["name"] for r in rendered.of_type("kubernetes:helm.sh/v3:Release")] == [
        "kuberay-operator"
    ]


def test_bad_config_registers_nothing():
    values, secrets = _prod_values()
    values["park:tpuPools"][0]["topology"] = "5x5"
    with pytest.raises(ProgramError) as info:
        run_program(values, "prod", secrets, prevalidate=False)
    assert "park:tpuPools[0].topology" in str(info.value)
    assert info.value.resources == []
    with pytest.raises(ConfigError):
        run_program(values, "prod", secrets)


def test_existing_network_creates_no_vpc():
    values, secrets = _prod_values()
    values["park:network"] = {"existingNetwork": "shared-vpc", "existingSubnetwork": "gke-nodes"}
    rendered = run_program(values, "prod", secrets)
    assert not rendered.of_type("gcp:compute/network:Network")
    (cluster,) = rendered.of_type(CLUSTER)
    assert (cluster.inputs["network"], cluster.inputs["subnetwork"]) == ("shared-vpc", "gke-nodes")


def test_gpu_pools_beside_tpu():
    values, secrets = _prod_values()
    values["park:gpuPools"] = [
        {"name": "h200", "machineType": "a3-ultragpu-8g", "acceleratorType": "nvidia-h200-141gb"}
    ]
    rendered = run_program(values, "prod", secrets)
    gpu = rendered.one(NODE_POOL, "h200")
    assert gpu.parent == "h200"
    accelerator = gpu.inputs["nodeConfig"]["guestAccelerators"][0]
    assert (accelerator["type"], accelerator["count"]) == ("nvidia-h200-141gb", 8)
    assert gpu.inputs["autoscaling"] == {"minNodeCount": 0, "maxNodeCount": 1}
