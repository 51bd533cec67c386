"""Scenarios on a real local Ray 2.60, each in a process of its own (test_serve_wait.py runs
them): Ray Serve's own controller deciding whether a replica that waits for its model folder
fails, and Ray's runtime_env expanding a per-host path.

    python -m tests.workloads.serve_wait_probe serve  WORKDIR   # prints one JSON line
    python -m tests.workloads.serve_wait_probe expand WORKDIR

`serve` deploys two apps built by Ray's own builder (build_llm_deployment: LLMServer, its
deployment options from the LLMConfig) from the dev stack's rendered LLMConfig after the CPU
profile, both with their model folder absent: one keeps the rendered waiting callback, one has
Ray's default callback. The engine is FolderEngine, injected through Ray's own engine hook
(RAYLLM_VLLM_ENGINE_CLS): its start does what vLLM's engine start does first (the callback's
on_before_node_init, vllm_engine.py `start`), then reads the folder's config.json, so a
missing folder fails the start as vLLM's would, without loading vLLM's engine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ray.llm._internal.serve.core.engine.protocol import LLMEngine

MODULE = "tests.workloads.serve_wait_probe"  # not __name__: run as __main__
ATTEMPTS_ENV = "PARK_TEST_ATTEMPTS"
ENGINE_CLS = f"{MODULE}:FolderEngine"
DEADLINE_S = 600.0


class FolderEngine(LLMEngine):
    """An engine whose start is vLLM's up to reading the model: the callback, then the
    folder's config.json (each start appended to the file in PARK_TEST_ATTEMPTS)."""

    def __init__(self, llm_config: Any) -> None:
        self.llm_config = llm_config

    async def start(self) -> None:
        with open(os.environ[ATTEMPTS_ENV], "a") as attempts:
            attempts.write(f"{os.getpid()}\n")
        callback = self.llm_config.get_or_create_callback()
        await callback.run_callback("on_before_node_init")
        folder = self.llm_config.model_loading_config.model_source
        json.loads(Path(folder, "config.json").read_text())  # FileNotFoundError: no model

    async def check_health(self) -> None:
        return None

    def routing_stats(self) -> dict[str, Any]:
        return {}

    async def resolve_lora(self, lora_model: Any) -> None:
        raise NotImplementedError

    async def chat(self, request: Any, raw_request_info: Any = None) -> Any:
        raise NotImplementedError

    async def completions(self, request: Any, raw_request_info: Any = None) -> Any:
        raise NotImplementedError

    async def embeddings(self, request: Any, raw_request_info: Any = None) -> Any:
        raise NotImplementedError

    async def transcriptions(self, request: Any, raw_request_info: Any = None) -> Any:
        raise NotImplementedError

    async def reset_prefix_cache(self) -> None:
        return None


def build_app(args: dict[str, Any]) -> Any:
    """The app: Ray's own LLMServer deployment for the LLMConfig in args."""
    from ray.serve.llm import LLMConfig, build_llm_deployment

    return build_llm_deployment(LLMConfig.model_validate(args["llm_config"]))


def _llm_config(workdir: Path, name: str, *, wait: bool) -> dict[str, Any]:
    """dev's rendered LLMConfig after the CPU profile, its model in an absent folder."""
    import yaml

    from tests.conftest import render_stack
    from workloads.serve.cpu_profile import to_cpu

    (service,) = [m for m in render_stack("dev").manifests() if m["kind"] == "RayService"]
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    folder = workdir / name / "export"
    cpu, _ = to_cpu(config, str(folder), wait_s=int(DEADLINE_S) if wait else None)
    (llm,) = cpu["applications"][0]["args"]["llm_configs"]
    llm["model_loading_config"]["model_id"] = name
    env = llm["runtime_env"]["env_vars"]
    env["RAYLLM_VLLM_ENGINE_CLS"] = ENGINE_CLS
    env[ATTEMPTS_ENV] = str(workdir / f"{name}.attempts")
    (workdir / f"{name}.attempts").write_text("")
    return dict(llm)


def _status(app: str) -> tuple[str, str]:
    from ray import serve

    found = serve.status().applications.get(app)
    if found is None:
        return "MISSING", ""
    messages = " | ".join(d.message for d in found.deployments.values() if d.message)
    return str(getattr(found.status, "value", found.status)), messages  # a str Enum


def serve_scenario(workdir: Path) -> dict[str, Any]:
    import ray
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    from workloads import protocol

    ray.init(num_cpus=4, include_dashboard=False, namespace="serve", log_to_driver=False)
    apps = {"waits": _llm_config(workdir, "waits", wait=True)}
    apps["fails"] = _llm_config(workdir, "fails", wait=False)
    schema = ServeDeploySchema.model_validate(
        {
            "applications": [
                {
                    "name": name,
                    "route_prefix": f"/{name}",
                    "import_path": f"{MODULE}:build_app",
                    "args": {"llm_config": llm},
                }
                for name, llm in apps.items()
            ]
        }
    )
    client = serve_start(http_options={"host": "127.0.0.1", "port": 0})
    client.deploy_apps(schema)
    out: dict[str, Any] = {
        "callback": apps["waits"].get("callback_config"),
        "retries": apps["waits"]["deployment_config"]["max_constructor_retry_count"],
    }
    deadline = time.monotonic() + DEADLINE_S
    slow_seen = failed_seen = False
    while time.monotonic() < deadline and not (slow_seen and failed_seen):
        status, message = _status("waits")
        out["waits_while_waiting"] = [status, message]
        if status == "DEPLOY_FAILED":
            break
        slow_seen = slow_seen or "to initialize" in message  # STARTING, in its constructor
        failed, failed_message = _status("fails")
        if failed == "DEPLOY_FAILED":
            failed_seen = True
            out["fails"] = [failed, failed_message]
        time.sleep(0.2)  # poll Serve's status
    # the waiting replica has been STARTING past Serve's slow-start warning: now the run exports
    folder = workdir / "waits" / "export"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / protocol.EXPORT_MARKER).write_text("{}")
    status = ""
    while time.monotonic() < deadline and status not in ("RUNNING", "DEPLOY_FAILED"):
        status, message = _status("waits")
        out["waits"] = [status, message]
        time.sleep(0.2)
    for name in apps:
        out[f"{name}_attempts"] = len((workdir / f"{name}.attempts").read_text().splitlines())
    return out


def expand_scenario(workdir: Path) -> dict[str, Any]:
    """The rendered per-host compile-cache paths of prod's LLMConfig, as an actor and the actor
    it starts see them on a host whose pod env has TPU_WORKER_ID (set for this process, so for
    the raylet and its workers, as the TPU webhook sets it for a pod)."""
    import ray
    import yaml

    from tests.conftest import render_stack

    (service,) = [m for m in render_stack("prod").manifests() if m["kind"] == "RayService"]
    config = yaml.safe_load(service["spec"]["serveConfigV2"])
    (llm,) = config["applications"][0]["args"]["llm_configs"]
    rendered = dict(llm["runtime_env"]["env_vars"])
    names = ["TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "VLLM_CACHE_ROOT"]

    @ray.remote(num_cpus=0)
    class Child:
        def env(self) -> dict[str, str | None]:
            return {n: os.environ.get(n) for n in names}

    @ray.remote(num_cpus=0)
    class Replica:
        def env(self) -> dict[str, str | None]:
            return {n: os.environ.get(n) for n in names}

        def child_env(self) -> dict[str, str | None]:
            child = Child.remote()  # no runtime_env of its own: it inherits the replica's
            return ray.get(child.env.remote())  # type: ignore[no-any-return]

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    replica = Replica.options(runtime_env={"env_vars": rendered}).remote()
    return {
        "rendered": {n: rendered[n] for n in names},
        "replica": ray.get(replica.env.remote()),
        "child": ray.get(replica.child_env.remote()),
    }


def main() -> None:
    scenario, workdir = sys.argv[1], Path(sys.argv[2])
    run = {"serve": serve_scenario, "expand": expand_scenario}[scenario]
    print("RESULT " + json.dumps(run(workdir)), flush=True)


if __name__ == "__main__":
    main()
