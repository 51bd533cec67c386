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


@given(st.sampled_from(catalog.all_slices()))
def test_names_derive_from_the_row(tpu):
    assert tpu.ray_pod_type == f"v6e-{tpu.chips}"
    assert tpu.ray_accelerator_type == "TPU-V6E"
    assert tpu.gke_accelerator == "tpu-v6e-slice"
    dims = tpu.torch_tpu_topology.split(",")
    assert len(dims) == 3 and math.prod(int(d) for d in dims) == tpu.chips
    assert tpu.node_labels() == {
        catalog.ACCELERATOR_LABEL: "tpu-v6e-slice",
        catalog.TOPOLOGY_LABEL: tpu.topology,
    }


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
