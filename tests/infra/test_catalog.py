"""The TPU catalog: every row consistent, and pinned to KubeRay's own v6e samples."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from infra import catalog

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "kuberay-samples"


@given(st.sampled_from(catalog.all_slices()))
def test_hosts_times_chips_per_host_is_chips(tpu):
    assert tpu.hosts * tpu.chips_per_host == tpu.chips
    assert tpu.chips == math.prod(catalog.topology_dims(tpu.topology))
    assert tpu.multi_host == (tpu.hosts > 1)


V6E = [s for s in catalog.all_slices() if s.generation.name == "v6e"]
TPU7X = [s for s in catalog.all_slices() if s.generation.name == "tpu7x"]


@given(st.sampled_from(V6E))
def test_names_derive_from_the_row(tpu):
    assert tpu.ray_pod_type == f"v6e-{tpu.chips}"
    assert tpu.ray_accelerator_type == "TPU-V6E"
    assert tpu.gke_accelerator == "tpu-v6e-slice"
    dims = tpu.torch_tpu_topology.split(",")
    assert len(dims) == 3 and math.prod(int(d) for d in dims) == tpu.chips
    assert tpu.devices == tpu.chips
    assert tpu.node_labels() == {
        catalog.ACCELERATOR_LABEL: "tpu-v6e-slice",
        catalog.TOPOLOGY_LABEL: tpu.topology,
    }


def test_tpu7x_topologies_are_generated_and_ray_takes_them():
    """2x2x1 is one host, 2x2x2 two ... 4x4x4 sixteen; every one is in Ray 2.60's own v7x
    table, and Ray's chips per host and pod type name agree with the catalog's."""
    from ray._private.accelerators import tpu as ray_tpu

    hosts = {s.topology: s.hosts for s in TPU7X}
    assert hosts == {"2x2x1": 1, "2x2x2": 2, "2x2x4": 4, "2x4x4": 8, "4x4x4": 16}
    assert catalog.cube_topologies(4) == tuple(hosts)
    for tpu in TPU7X:
        assert tpu.topology in ray_tpu.VALID_TPU_TOPOLOGY["v7x"]
        assert ray_tpu.get_chips_per_host(tpu.topology, "v7x") == tpu.chips_per_host
        assert ray_tpu.normalize_tpu_accelerator_type(tpu.ray_accelerator_type) == "v7x"
        # Ray's pod types count TensorCores (tpu7x-8 is one 4-chip host) = devices
        assert tpu.ray_pod_type == f"v7x-{tpu.devices}"
        assert tpu.devices == 2 * tpu.chips and tpu.devices_per_host == 8
        assert tpu.workload_policy == tpu.multi_host


def test_tpu7x_torch_tpu_topology_counts_devices():
    """torch_tpu 0.2.0 forms a v7x slice over chips x 2 devices: a 4-D topology."""
    assert catalog.lookup("tpu7x-standard-4t", "2x2x1").torch_tpu_topology == "2,2,1,2"
    assert catalog.lookup("tpu7x-standard-4t", "4x4x4").torch_tpu_topology == "4,4,4,2"
    per_device = catalog.lookup("tpu7x-standard-4t", "2x2x2")
    assert per_device.peak_bf16_tflops == 16 * 1153.5
    assert per_device.generation.hbm_gib_per_device == 96


@pytest.mark.parametrize(
    ("machine", "topology", "hosts", "chips_per_host"),
    [
        ("ct6e-standard-4t", "2x2", 1, 4),
        ("ct6e-standard-4t", "4x4", 4, 4),
        ("ct6e-standard-4t", "16x16", 64, 4),
        ("ct6e-standard-8t", "2x4", 1, 8),
        ("ct6e-standard-4t", "2x4", 2, 4),  # same topology, other machine: two hosts
        ("ct6e-standard-1t", "1x1", 1, 1),
    ],
)
def test_known_rows(machine, topology, hosts, chips_per_host):
    tpu = catalog.lookup(machine, topology)
    assert (tpu.hosts, tpu.chips_per_host) == (hosts, chips_per_host)


def test_4x4_names():
    tpu = catalog.lookup("ct6e-standard-4t", "4x4")
    assert (tpu.ray_pod_type, tpu.torch_tpu_topology, tpu.chips) == ("v6e-16", "4,4,1", 16)
    assert tpu.peak_bf16_tflops == 16 * 918


def _worker_groups(doc: dict) -> list[dict]:
    spec = doc["spec"]
    cluster = spec.get("rayClusterSpec") or spec.get("rayClusterConfig") or spec
    return cluster["workerGroupSpecs"]


@pytest.mark.parametrize(
    "sample",
    [
        "ray-cluster.tpu-v6e-singlehost.yaml",
        "ray-cluster.tpu-v6e-16-multihost.yaml",
        "ray-cluster.tpu-v6e-256-multihost.yaml",
        "ray-job.tpu-v6e-16-multihost.yaml",
        "ray-job.tpu-v6e-256-multihost.yaml",
        "ray-job.tpu-v6e-singlehost.yaml",
        "ray-service.vllm-tpu-v6e-singlehost.yaml",
    ],
)
def test_catalog_agrees_with_kuberay_samples(sample):
    """numOfHosts and google.com/tpu in KubeRay's v6e samples are what the catalog computes."""
    doc = yaml.safe_load((SAMPLES / sample).read_text())
    for group in _worker_groups(doc):
        pod = group["template"]["spec"]
        topology = pod["nodeSelector"][catalog.TOPOLOGY_LABEL]
        chips_per_pod = int(pod["containers"][0]["resources"]["limits"][catalog.TPU_RESOURCE])
        machine = next(
            m.name
            for m in catalog.MACHINE_TYPES.values()
            if m.chips_per_host == chips_per_pod and topology in m.topologies
        )
        tpu = catalog.lookup(machine, topology)
        assert group.get("numOfHosts", 1) == tpu.hosts
        assert chips_per_pod == tpu.chips_per_host


@pytest.mark.parametrize(
    ("machine", "topology", "message"),
    [
        ("ct6e-standard-2t", "2x2", "unknown TPU machine type"),
        ("ct6e-standard-8t", "4x4", "allowed: 2x4"),
        ("ct6e-standard-4t", "3x3", "not offered"),
        ("ct6e-standard-4t", "4by4", "not offered"),
    ],
)
def test_lookup_errors_say_what_is_allowed(machine, topology, message):
    with pytest.raises(catalog.CatalogError, match=message):
        catalog.lookup(machine, topology)


def test_topology_dims_rejects_garbage():
    with pytest.raises(catalog.CatalogError):
        catalog.topology_dims("4x")
