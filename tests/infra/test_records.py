"""The serving engine and the TPU generation are records: adding either is a row of data.

`test_adding_an_engine_and_a_generation_is_data` runs a stack on a second engine and a second
generation that exist only as rows this test adds to infra/engines.py's and infra/catalog.py's
tables, and checks that the stack validates, resolves and renders with no other code change.
It runs in a subprocess that adds the rows before anything reads the tables, as an edit of the
table would: the spec derives its allowed engines from the table at import.

The rows are TEST DATA (tests/data/records/v5e-and-an-engine.yaml, which says which of its
values are placeholders), not catalog facts this project vouches for.
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
from infra.schema.models import ServingConfig

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

    # ---- the rows: tests/data/records/v5e-and-an-engine.yaml (TEST DATA) -------------------
    import yaml
    rows = yaml.safe_load(open("tests/data/records/v5e-and-an-engine.yaml"))

    def tuples(value):
        return tuple(map(tuples, value)) if isinstance(value, list) else value

    generation = catalog.TpuGeneration(**{k: tuples(v) for k, v in rows["generation"].items()})
    catalog.GENERATIONS[generation.name] = generation
    for row in rows["machine_types"]:
        machine = catalog.TpuMachineType(**{k: tuples(v) for k, v in row.items()})
        catalog.MACHINE_TYPES[machine.name] = machine
    row = {k: tuples(v) for k, v in rows["engine"].items()}
    added = dataclasses.replace(engines.ENGINES[row.pop("like")], **row)
    engines.ENGINES[added.name] = added
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
    from ray._private.accelerators.tpu import get_chips_per_host
    added_slices = [s for s in catalog.all_slices() if s.generation.name == generation.name]
    ray_hosts = [
        [s.ray_hosts, -(-s.chips // get_chips_per_host(s.topology, s.generation.ray_name))]
        for s in added_slices
    ]
    print(json.dumps({
        "ray_hosts": ray_hosts,
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


def _run_program(program: str) -> dict:
    """Run a program that adds records and renders, in a fresh process (the catalog's tables
    are module state); its last line of output, as JSON."""
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_adding_an_engine_and_a_generation_is_data():
    out = _run_program(ADD_ROWS_AND_RENDER)
    assert out["problems"] == []
    # Ray's own placement of each added slice is what the added row says.
    assert len(out["ray_hosts"]) == 6  # the rows' (machine type, topology) pairs
    assert all(ours == rays for ours, rays in out["ray_hosts"])
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


# A made-up generation after TPU7x (two devices per chip, a workload policy, its own boot disk):
# only rows, then the ironwood stack's pools moved onto it.
ADD_NEXT_GENERATION_AND_RENDER = textwrap.dedent(
    """
    import dataclasses, json
    import yaml
    from infra import catalog

    def tuples(value):
        return tuple(map(tuples, value)) if isinstance(value, list) else value

    rows = yaml.safe_load(open("tests/data/records/next-generation.yaml"))
    generation = catalog.TpuGeneration(**{k: tuples(v) for k, v in rows["generation"].items()})
    catalog.GENERATIONS[generation.name] = generation
    for row in rows["machine_types"]:
        machine = catalog.TpuMachineType(**{k: tuples(v) for k, v in row.items()})
        catalog.MACHINE_TYPES[machine.name] = machine
    # ---- the pipeline, untouched -----------------------------------------------------------
    from pathlib import Path
    from infra.plan import node_pools, ray
    from infra.stack import from_values, read_offline
    from infra.tools.checks import check_manifests

    offline = read_offline(Path("stacks/Pulumi.ironwood.yaml"))
    values = dict(offline.values)
    values["park:tpuPools"] = [
        {**p, "machineType": "tpu9z-standard-4t"} for p in values["park:tpuPools"]
    ]
    plan = from_values(values, offline.stack)
    pods = ray.ray_pods(plan)
    job = ray.rayjob(plan.training, pods)
    service = ray.rayservice(plan.serving, pods, hf_token=False)
    print(json.dumps({
        "problems": [str(p) for p in check_manifests([job, service], plan)],
        "node_pools": [dataclasses.asdict(p) for p in node_pools.all_node_pools(plan)],
        "rayjob": job,
        "serve_config": ray.serve_config(plan.serving, pods),
    }, default=str))
    """
)


def test_a_next_generation_is_a_record_too():
    out = _run_program(ADD_NEXT_GENERATION_AND_RENDER)
    assert out["problems"] == []
    pools = {p["pool"]: p for p in out["node_pools"] if p["kind"] == "tpu"}
    train, serve = pools["train-7x"], pools["serve-7x"]
    # placed by a workload policy, as the row says; the single-host slice takes none
    assert train["args"]["placement_policy"] == {"type": "", "tpu_topology": "2x2x2"}
    assert train["workload_policy"]["workload_policy"]["accelerator_topology"] == "2x2x2"
    assert "placement_policy" not in serve["args"] and serve["workload_policy"] is None
    assert train["args"]["node_config"]["disk_type"] == "hyperdisk-ml"
    # a Ray Train worker per device: 2 hosts x 4 chips x 2 devices
    entry = out["rayjob"]["spec"]["entrypoint"]
    assert "--num-workers 16 " in entry and "--torch-tpu-topology 2,2,2,2 " in entry
    assert "--peak-tflops-per-device 2000 " in entry
    group = out["rayjob"]["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    assert json.loads(json.loads(group["rayStartParams"]["resources"])) == {"TPU": 8}
    container = group["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"][catalog.TPU_RESOURCE] == "4"  # chips
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RAY_TPU_RESOURCE_PER_CHIP"] == "2"
    (llm,) = out["serve_config"]["applications"][0]["args"]["llm_configs"]
    assert llm["accelerator_type"] == "TPU-V9Z"
    assert llm["runtime_env"]["env_vars"]["RAY_TPU_RESOURCE_PER_CHIP"] == "2"
