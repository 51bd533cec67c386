"""The serving engine and the TPU generation are records: adding either is a row of data.

`test_adding_an_engine_and_a_generation_is_data` runs a stack on a second engine and a second
generation that exist only as rows this test adds to infra/engines.py's and infra/catalog.py's
tables, and checks that the stack validates, resolves and renders with no other code change.
It runs in a subprocess that adds the rows before anything reads the tables, as an edit of the
table would: the spec derives its allowed engines from the table at import.

The v5e row and the engine row below are TEST DATA, not catalog facts this project vouches
for: v5e's machine types, chips, topologies, HBM and Ray's names are as GKE's and Ray's docs
give them; its peak, runtime HBM, zones and GKE floor are placeholders.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import get_args

import pytest

from infra import catalog, engine, engines
from infra.spec.models import ServingConfig

ROOT = Path(__file__).resolve().parents[2]


def test_the_spec_and_the_docs_take_the_engines_from_the_table():
    field = ServingConfig.model_fields["engine"]
    assert get_args(field.annotation) == tuple(engines.ENGINES)
    assert field.default == engines.DEFAULT_ENGINE
    assert field.description == engines.describe()
    for name in engines.ENGINES:
        assert f"`{name}`" in engines.describe()


def _slice_id(tpu: catalog.TpuSlice) -> str:
    return f"{tpu.machine_type}-{tpu.topology}"


@pytest.mark.parametrize("tpu", catalog.all_slices(), ids=_slice_id)
def test_ray_places_each_slice_as_the_generation_record_says(tpu):
    """The hosts the record says Ray assumes are Ray's own answer (get_chips_per_host, the
    function Serve LLM's placement group is sized by)."""
    from ray._private.accelerators.tpu import get_chips_per_host

    per_host = get_chips_per_host(tpu.topology, tpu.generation.ray_name)
    assert tpu.ray_hosts == math.ceil(tpu.chips / per_host)
    assert tpu.ray_pod_type.startswith(f"{tpu.generation.ray_name}-")


def test_a_machine_type_belongs_to_the_generation_of_its_prefix():
    for machine in catalog.MACHINE_TYPES.values():
        generation = catalog.GENERATIONS[machine.generation]
        assert machine.name.startswith(f"{generation.machine_type_prefix}-")
    stray = catalog.TpuMachineType("ct9x-standard-4t", 4, ("2x2",), vcpus=1, memory_gib=1)
    with pytest.raises(catalog.CatalogError, match="ct9x"):
        _ = stray.generation


def test_tensor_parallel_is_formed_as_each_record_says():
    """Each engine's TP options on a single host and across hosts follow its record's two
    fields, whatever its name."""
    host = catalog.lookup("ct6e-standard-8t", "2x4")
    multi = catalog.lookup("ct6e-standard-4t", "4x4")
    worlds = [n for n, _ in host.generation.torch_tpu_world_topologies]
    for record in engines.ENGINES.values():
        single = engine.tensor_parallel_options(record.name, host)
        across = engine.tensor_parallel_options(record.name, multi)
        if record.tp_on_one_host == "runtime_worlds":
            assert single == worlds
        else:
            assert single == [tp for tp in range(1, 9) if 8 % tp == 0]
        if record.tp_across_hosts == "whole_slice":
            assert across == [16]
        else:
            assert across == [1, 2, 4, 8, 16]


# Run in a fresh interpreter: the rows first, then the pipeline, as if the tables were edited.
ADD_ROWS_AND_RENDER = textwrap.dedent(
    """
    import dataclasses, json, sys
    from infra import catalog, engines

    # ---- TEST DATA: a second generation (v5e) and a second engine ------------------------
    v5e = catalog.TpuGeneration(
        name="v5e",
        machine_type_prefix="ct5lp",
        gke_accelerator="tpu-v5-lite-podslice",
        ray_name="v5litepod",
        ray_accelerator_type="TPU-V5LITEPOD",
        peak_bf16_tflops_per_chip=197.0,
        hbm_gib_per_chip=16,
        runtime_hbm_bytes_per_chip=16 * 1024**3,  # placeholder: not what a runtime reports
        min_gke_version="1.31.2-gke.1115000",  # placeholder
        zones=("us-east5-b",),  # placeholder: the dev stack's zone
        torch_tpu_world_topologies=((1, "1,1,1"), (4, "2,2,1"), (8, "2,4,1")),
        ray_single_vm_topologies=("1x1", "2x2", "2x4"),
    )
    catalog.GENERATIONS["v5e"] = v5e
    for machine in (
        catalog.TpuMachineType("ct5lp-hightpu-1t", 1, ("1x1",), vcpus=24, memory_gib=48),
        catalog.TpuMachineType(
            "ct5lp-hightpu-4t", 4, ("2x2", "2x4", "4x4", "4x8"), vcpus=112, memory_gib=192
        ),
        catalog.TpuMachineType("ct5lp-hightpu-8t", 8, ("2x4",), vcpus=224, memory_gib=384),
    ):
        catalog.MACHINE_TYPES[machine.name] = machine
    test_engine = dataclasses.replace(
        engines.ENGINES["vllm-tpu"],
        name="test-engine",
        image="park-serve-test-engine",
        compile_cache_env=(("TEST_ENGINE_CACHE", "test-engine"),),
        fit_assumes=None,
    )
    engines.ENGINES[test_engine.name] = test_engine
    engines.ENGINE_NAMES = tuple(engines.ENGINES)
    # ---- the pipeline, untouched -----------------------------------------------------------
    from pathlib import Path
    from infra.plan import node_pools, ray
    from infra.stack import from_values, read_offline
    from infra.tools.checks import check_manifests

    offline = read_offline(Path("stacks/Pulumi.dev.yaml"))
    values = dict(offline.values)
    values["park:tpuPools"] = [
        {"name": "train-v5e", "machineType": "ct5lp-hightpu-4t", "topology": "4x4",
         "slices": 1, "capacity": "spot"},
        {"name": "serve-v5e", "machineType": "ct5lp-hightpu-8t", "topology": "2x4",
         "slices": 1, "capacity": "spot"},
    ]
    values["park:training"] = {**values["park:training"], "pool": "train-v5e"}
    serving = {**values["park:serving"], "pool": "serve-v5e", "engine": "test-engine"}
    serving["models"] = [{**m, "tensorParallelSize": 4} for m in serving["models"]]
    values["park:serving"] = serving
    plan = from_values(values, offline.stack)
    pods = ray.ray_pods(plan)
    job = ray.rayjob(plan.training, pods)
    service = ray.rayservice(plan.serving, pods, hf_token=False)
    print(json.dumps({
        "warnings": [str(w) for w in plan.warnings],
        "problems": [str(p) for p in check_manifests([job, service], plan)],
        "node_pools": [dataclasses.asdict(p) for p in node_pools.all_node_pools(plan)],
        "serving_image": plan.serving.image,
        "rayjob": job,
        "rayservice": service,
        "serve_config": ray.serve_config(plan.serving, pods),
    }, default=str))
    """
)


def test_adding_an_engine_and_a_generation_is_data():
    done = subprocess.run(
        [sys.executable, "-c", ADD_ROWS_AND_RENDER],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["problems"] == []
    assert not [w for w in out["warnings"] if "park:serving.engine" in w]
    # The engine's image, in the stack's registry.
    assert out["serving_image"].split("/")[-1].startswith("park-serve-test-engine:")
    # The generation's labels and Ray names reach the pools and the manifests.
    tpu_pools = [json.dumps(p["args"]) for p in out["node_pools"] if p["kind"] == "tpu"]
    assert len(tpu_pools) == 2
    assert "ct5lp-hightpu-4t" in tpu_pools[0] and "ct5lp-hightpu-8t" in tpu_pools[1]
    train_group = out["rayjob"]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert train_group["numOfHosts"] == 4
    selector = train_group["template"]["spec"]["nodeSelector"]
    assert selector[catalog.ACCELERATOR_LABEL] == "tpu-v5-lite-podslice"
    assert "--tpu-accelerator-type TPU-V5LITEPOD" in out["rayjob"]["spec"]["entrypoint"]
    (llm,) = out["serve_config"]["applications"][0]["args"]["llm_configs"]
    assert llm["accelerator_type"] == "TPU-V5LITEPOD"
    assert llm["engine_kwargs"]["tensor_parallel_size"] == 4
    # The engine's own environment: its compile cache, none of the other engines'.
    env = llm["runtime_env"]["env_vars"]
    assert (
        "/test-engine/" in env["TEST_ENGINE_CACHE"]
        and "test-engine-0.29.0" in env["TEST_ENGINE_CACHE"]
    )
    assert "VLLM_CACHE_ROOT" not in env
    serve_group = out["rayservice"]["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert serve_group["numOfHosts"] == 1
    assert serve_group["template"]["spec"]["containers"][0]["image"] == out["serving_image"]
