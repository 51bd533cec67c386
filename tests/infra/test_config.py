"""Stack config validation: every problem names the key, the value and what is allowed."""

from __future__ import annotations

import copy

import pytest

from infra import catalog
from infra.engine import tensor_parallel_options
from infra.schema.errors import ConfigError
from infra.stack import from_values
from tests.infra.stack_problems import problems_of

BASE = {
    "gcp:project": "p",
    "gcp:region": "us-east5",
    "park:zone": "us-east5-b",
    "park:tpuPools": [
        {"name": "train", "machineType": "ct6e-standard-4t", "topology": "4x4"},
        {"name": "serve", "machineType": "ct6e-standard-8t", "topology": "2x4"},
    ],
    "park:training": {"enabled": True, "pool": "train", "globalBatchSize": 32},
    "park:serving": {
        "enabled": True,
        "pool": "serve",
        "models": [{"name": "m", "source": "org/model"}],
    },
}


def config_with(**changes):
    values = copy.deepcopy(BASE)
    for key, value in changes.items():
        values[key.replace("__", ":")] = value
    return values


def pool(**fields):
    return {"name": "x", "machineType": "ct6e-standard-4t", "topology": "2x2", **fields}


def test_base_is_valid_and_typed():
    plan = from_values(BASE, "dev")
    assert plan.pool("train").slice.hosts == 4
    assert plan.names.bucket == "p-dev-park"
    assert plan.spec.kuberay.install == "addon"


@pytest.mark.parametrize(
    ("pool_fields", "field", "fragment"),
    [
        ({"machineType": "ct5e-standard-4t"}, "machineType", "allowed: ct6e"),
        ({"topology": "3x3"}, "topology", "allowed: 2x2, 2x4"),
        ({"machineType": "ct6e-standard-8t", "topology": "4x4"}, "topology", "allowed: 2x4"),
        ({"capacity": "reservation"}, "reservation", "needs a reservation"),
        ({"reservation": "r1"}, "reservation", "only used with capacity"),
        ({"capacity": "spot", "reservation": "r1"}, "reservation", "not 'spot'"),
        ({"capacity": "flex-start", "reservation": "r"}, "reservation", "not 'flex-start'"),
        ({"capacity": "queued", "autoscaling": False}, "autoscaling", "0 nodes"),
        ({"capacity": "preemptible"}, "capacity", "'on-demand'"),
        ({"slices": 0}, "slices", "positive"),
        ({"slices": -2}, "slices", "positive"),
        ({"name": "Bad_Name"}, "name", "lowercase"),
        ({"name": "train"}, "name", "duplicate"),
        ({"maxRunDuration": "3600s"}, "maxRunDuration", "flex-start"),
        ({"topologyy": "2x2"}, "topologyy", "did you mean 'topology'?"),
    ],
)
def test_tpu_pool_problems(pool_fields, field, fragment):
    values = config_with(park__tpuPools=[*BASE["park:tpuPools"], pool(**pool_fields)])
    problems = problems_of(values)
    key = f"park:tpuPools[{len(BASE['park:tpuPools'])}].{field}"  # the pool added last
    assert key in problems, problems
    assert fragment in problems[key]


def test_gke_version_below_v6e_floor():
    # EXTENDED still offers 1.31 (infra/data/gke.yaml), so only the v6e floor refuses this pin
    cluster = {"releaseChannel": "EXTENDED", "version": "1.31.1-gke.100"}
    problems = problems_of(config_with(park__cluster=cluster))
    assert "TPU v6e (pool serve) needs GKE ≥ 1.31.2-gke.1115000" in problems["park:cluster.version"]


def test_gke_version_older_than_the_channel_offers():
    problems = problems_of(config_with(park__cluster={"version": "1.31.2-gke.1115000"}))
    assert "older than release channel REGULAR offers" in problems["park:cluster.version"]


def test_gke_version_must_parse():
    assert (
        "not a GKE version"
        in problems_of(config_with(park__cluster={"version": "latest"}))["park:cluster.version"]
    )


def test_zone_without_v6e_and_extra_zones_escape_hatch():
    values = config_with(gcp__region="us-west1", park__zone="us-west1-a")
    assert "no TPU v6e known" in problems_of(values)["park:zone"]
    values["park:extraTpuZones"] = ["us-west1-a"]
    from_values(values, "dev")


def test_zone_outside_region():
    assert "gcp:region" in problems_of(config_with(park__zone="us-central1-b"))["park:zone"]


def test_all_problems_are_reported_together():
    values = config_with(
        park__tpuPools=[
            pool(name="a", topology="9x9"),
            pool(name="b", capacity="reservation"),
            pool(name="c", slices=0),
        ],
        park__training={"enabled": False},
        park__serving={"enabled": False},
    )
    keys = set(problems_of(values))
    assert {
        "park:tpuPools[0].topology",
        "park:tpuPools[1].reservation",
        "park:tpuPools[2].slices",
    } <= keys


def test_unknown_and_missing_keys():
    values = config_with(park__clustr={"name": "x"})
    del values["park:zone"]
    problems = problems_of(values)
    assert "unknown key" in problems["park:clustr"]
    assert "required" in problems["park:zone"]


def test_training_rules():
    problems = problems_of(config_with(park__training={"enabled": True, "pool": "nope"}))
    assert "allowed: train, serve" in problems["park:training.pool"]
    problems = problems_of(
        config_with(park__training={"enabled": True, "pool": "train", "numSlices": 2})
    )
    assert "1..1" in problems["park:training.numSlices"]
    problems = problems_of(
        config_with(park__training={"enabled": True, "pool": "train", "globalBatchSize": 20})
    )
    assert "multiple of --num-workers (16)" in problems["park:training.globalBatchSize"]
    problems = problems_of(
        config_with(park__training={"enabled": True, "pool": "serve", "globalBatchSize": 16})
    )
    assert "different pools" in problems["park:training.pool"]


def test_multislice_refused_on_older_ray(monkeypatch):
    from infra.rules import workloads as workload_rules

    values = config_with(
        park__tpuPools=[
            {"name": "train", "machineType": "ct6e-standard-4t", "topology": "4x4", "slices": 2},
            BASE["park:tpuPools"][1],
        ],
        park__training={"enabled": True, "pool": "train", "numSlices": 2, "globalBatchSize": 64},
    )
    from_values(values, "dev")  # Ray 2.60.0 trains PyTorch across slices
    monkeypatch.setattr(workload_rules, "RAY_VERSION", "2.59.0")
    assert "cannot train PyTorch across slices" in problems_of(values)["park:training.numSlices"]


@pytest.mark.parametrize(
    ("tp", "ok"), [(8, True), (4, True), (2, False), (1, True), (16, False), (3, False), (6, False)]
)
def test_tensor_parallel_fits_single_host_slice(tp, ok):
    values = config_with(
        park__serving={
            "enabled": True,
            "pool": "serve",
            "models": [{"name": "m", "source": "o/m", "tensorParallelSize": tp}],
        }
    )
    if ok:
        from_values(values, "dev")
    else:
        message = problems_of(values)["park:serving.models[0].tensorParallelSize"]
        assert "allowed: 1, 4, 8" in message  # torch_tpu's single-host world sizes on v6e


def test_tensor_parallel_on_multi_host_takes_the_whole_slice():
    """vllm-torchtpu's Ray executor spans every chip of the slice; vllm-tpu (JAX) keeps the
    per-host rule."""
    tpu = catalog.lookup("ct6e-standard-4t", "4x4")
    assert tensor_parallel_options("vllm-torchtpu", tpu) == [16]
    assert tensor_parallel_options("vllm-tpu", tpu) == [1, 2, 4, 8, 16]
    tpu = catalog.lookup("ct6e-standard-4t", "4x8")
    assert tensor_parallel_options("vllm-torchtpu", tpu) == [32]
    assert 12 not in tensor_parallel_options("vllm-tpu", tpu)


def test_serving_rules():
    problems = problems_of(config_with(park__serving={"enabled": True, "pool": "serve"}))
    assert "serves no model" in problems["park:serving.models"]
    problems = problems_of(
        config_with(
            park__serving={
                "enabled": True,
                "pool": "serve",
                "models": [
                    {"name": "m", "source": "o/m", "minReplicas": 2, "maxReplicas": 1},
                    {"name": "m", "source": "o/m", "engineKwargs": {"max_model_len": 5}},
                ],
            }
        )
    )
    assert "maxReplicas" in problems["park:serving.models[0].minReplicas"]
    assert "duplicate" in problems["park:serving.models[1].name"]
    assert "maxModelLen" in problems["park:serving.models[1].engineKwargs.max_model_len"]


def test_problem_string_names_key_value_and_allowed():
    values = config_with(park__tpuPools=[pool(topology="3x3")], park__training={}, park__serving={})
    with pytest.raises(ConfigError) as info:
        from_values(values, "dev")
    text = str(info.value)
    assert "park:tpuPools[0].topology = '3x3'" in text and "allowed:" in text


def test_default_images_follow_the_engine():
    from infra import images
    from tests.conftest import ROOT

    tag = images.context_tag(ROOT)  # this checkout's build (infra/images.py)
    plan = from_values(BASE, "dev")
    registry = "us-east5-docker.pkg.dev/p/park-dev"
    assert plan.training and plan.training.image == f"{registry}/park-workloads:{tag}"
    assert plan.serving and plan.serving.image == f"{registry}/park-workloads:{tag}"
    assert [(b.name, b.target, b.used_by) for b in plan.images] == [
        ("park-workloads", "workloads", ("park:training", "park:serving"))
    ]
    jax = config_with(park__serving={**BASE["park:serving"], "engine": "vllm-tpu"})
    plan = from_values(jax, "dev")
    assert plan.serving and plan.serving.image == f"{registry}/park-serve-vllm-tpu:{tag}"
    assert [(b.name, b.target) for b in plan.images] == [
        ("park-workloads", "workloads"),
        ("park-serve-vllm-tpu", "serve-vllm-tpu"),
    ]
    custom = config_with(park__training={**BASE["park:training"], "image": "ghcr.io/me/t:1"})
    plan = from_values(custom, "dev")
    assert plan.training and plan.training.image == "ghcr.io/me/t:1"


def test_serving_refuses_a_slice_the_pinned_ray_misshapes():
    values = config_with(
        park__tpuPools=[
            BASE["park:tpuPools"][0],
            {"name": "serve", "machineType": "ct6e-standard-4t", "topology": "2x4"},
        ]
    )
    message = problems_of(values)["park:serving.pool"]
    assert "1 host(s)" in message and "ct6e-standard-4t it is 2" in message
