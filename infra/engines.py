"""The serving engines: one record per engine, the one place its facts live.

`park:serving.engine` names a row of ENGINES. The spec's allowed values and the config
reference's description are derived from this table; the resolve step (its image), the engine
rules (infra.engine: how TP is formed), the rules (how many multi-host slices a cluster may
hold, what the fit assumes), the RayService (its environment and placement) and the manifest
checks read the record, never the name. Adding an engine is a row here (and its image).

Kept free of other infra imports: infra.schema reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The image that runs training and the default engine (workloads/Dockerfile's default target).
WORKLOAD_IMAGE = "park-workloads"

# How TP is formed on a multi-host slice (infra.engine.tensor_parallel_options):
# "whole_slice": one engine spans every chip of the slice (TP = the slice's chips);
# "whole_hosts": any divisor of the chips, in whole hosts past one host.
TpAcrossHosts = Literal["whole_slice", "whole_hosts"]
# ... and on a single host: "runtime_worlds": the world sizes the TPU runtime forms a slice from
# (catalog.TpuGeneration.torch_tpu_world_topologies); "divisors": any divisor of the chips.
TpOnOneHost = Literal["runtime_worlds", "divisors"]


@dataclass(frozen=True)
class Engine:
    """One serving engine an image carries: what the plan, the rules and the checks branch on."""

    name: str  # the value of park:serving.engine
    version: str  # the wheel its image pins (workloads/requirements-serve*.txt)
    image: str  # its image in the stack's registry
    image_target: str  # the workloads/Dockerfile stage that builds it (infra.images)
    runtime: str  # what it runs on, for the docs ("" for the default engine's torch_tpu)
    tp_across_hosts: TpAcrossHosts
    tp_on_one_host: TpOnOneHost
    # Multi-host slices one RayService cluster can serve; None: the engine sets no limit.
    multi_host_slices_per_cluster: int | None
    # What the engine must be told to run a replica across the hosts of a multi-host slice.
    multi_host_env: tuple[tuple[str, str], ...]
    # Persistent compile caches it reads from the environment: (variable, folder under the
    # bucket's cache/), each keyed per model, slice shape, TP and version (plan/ray/service.py).
    compile_cache_env: tuple[tuple[str, str], ...]
    # Serve LLM's placement bundle per engine worker (placement_group_config.bundle_per_worker).
    worker_bundle: tuple[tuple[str, int], ...]
    # None: infra.engine's memory and TP rules were read in this engine's own source. Else what
    # they assume instead, said as a preview warning (infra.rules.workloads.serving_warnings).
    fit_assumes: str | None = None


VLLM_TORCHTPU = Engine(
    name="vllm-torchtpu",
    version="0.29.0",
    image=WORKLOAD_IMAGE,
    image_target="workloads",
    runtime="",
    # The plugin's Ray executor lists every chip of every TPU host of the Ray cluster
    # as one slice; one host runs the multiprocess executor with torch_tpu's worlds
    # (infra/engine.py's docstring, file:line).
    tp_across_hosts="whole_slice",
    tp_on_one_host="runtime_worlds",
    multi_host_slices_per_cluster=1,
    # else vLLM silently runs on one host (vllm_torchtpu picks its Ray executor from it)
    multi_host_env=(("TPU_MULTIHOST_BACKEND", "ray"),),
    # torch_tpu 0.2.0's persistent executable cache (off unless set; its C++ runtime and
    # vllm_torchtpu/envs.py:980) and vLLM's compiled-graph cache (vllm/compilation/
    # backends.py:1058). Not VLLM_DISABLE_COMPILE_CACHE=1, the engine's CI setting:
    # every replica start would recompile.
    compile_cache_env=(
        ("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "torch-tpu"),
        ("VLLM_CACHE_ROOT", "vllm"),
    ),
    # its workers take one TPU each (ray_distributed_executor_v2.py:181-188)
    worker_bundle=(("TPU", 1),),
)

VLLM_TPU = Engine(
    name="vllm-tpu",
    version="0.29.0",
    image="park-serve-vllm-tpu",  # its libtpu pins conflict with torch_tpu's
    image_target="serve-vllm-tpu",
    runtime="JAX",
    # Divisors of the chips, whole hosts past one: Serve LLM's host bundles.
    tp_across_hosts="whole_hosts",
    tp_on_one_host="divisors",
    multi_host_slices_per_cluster=None,
    multi_host_env=(("TPU_MULTIHOST_BACKEND", "ray"),),
    compile_cache_env=(),
    worker_bundle=(("TPU", 1),),
    fit_assumes=(
        "vllm-tpu (tpu-inference) was not read here: the memory fit assumes "
        "vllm-torchtpu's accounting"
    ),
)

ENGINES: dict[str, Engine] = {e.name: e for e in (VLLM_TORCHTPU, VLLM_TPU)}
DEFAULT_ENGINE = VLLM_TORCHTPU.name
ENGINE_NAMES: tuple[str, ...] = tuple(ENGINES)


def get(name: str) -> Engine:
    """The record of a named engine (the spec only lets known names through)."""
    return ENGINES[name]


def describe() -> str:
    """The description of park:serving.engine (config reference, schema), from the table."""
    default_image = ENGINES[DEFAULT_ENGINE].image
    items = []
    for e in ENGINES.values():
        notes = [e.runtime] if e.runtime else []
        notes += ["separate image"] if e.image != default_image else []
        items.append(f"`{e.name}`" + (f" ({'; '.join(notes)})" if notes else ""))
    listed = items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"
    return f"{listed}."
