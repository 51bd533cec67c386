"""Deploy the stack's rendered ``serveConfigV2`` to a local Ray Serve on CPU, for real.

The same document KubeRay hands to the RayService goes through ``cpu_profile.to_cpu`` (the only
place that changes anything, and it lists each change), is checked with Ray's classes, and is
deployed the way the Ray dashboard's REST API deploys it for KubeRay: ``serve_start`` +
``deploy_apps`` on the Serve controller, which builds the app with ``build_openai_app`` inside the
cluster. Ready means a 1-token completion answered: ``/v1/models`` answers 40-60 s before vLLM
can generate.

    python -m workloads.serve.local --serve-config serve.yaml [--port N] [--keep] [--smoke]

Every model of every app is served (on this machine's CPU, each from the tiny model unless
``--serve-from ID=PATH`` names its folder); ``--smoke`` asks each one question. It prints
``PARK_ENDPOINT http://127.0.0.1:<port>/v1`` (one line, for scripts), the CPU changes, and
``PARK_RAY_ADDRESS <gcs address>``. Without ``--keep`` it then shuts down; with it, it serves
until interrupted (Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from workloads.protocol import (
    CHANGE_ITEM,
    CHANGES_HEADER,
    ENDPOINT_MARKER,
    RAY_ADDRESS_MARKER,
    REPLY_PREFIX,
    SMOKE_MARKER,
    free_port,
)
from workloads.serve.cpu_profile import to_cpu
from workloads.serve.validate import (
    register_llm_components_before_connecting,
    validate_serve_config,
)

DEFAULT_TIMEOUT_S = 900.0


def load_serve_config(path: str | Path) -> dict[str, Any]:
    """Read a ``serveConfigV2`` YAML file (``-`` reads stdin)."""
    text = sys.stdin.read() if str(path) == "-" else Path(path).read_text()
    config = yaml.safe_load(text)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a serveConfigV2 must be a YAML mapping")
    return config


def served_models(serve_config: dict[str, Any]) -> list[str]:
    """The served model ids of every LLM app, in order."""
    return [
        llm["model_loading_config"]["model_id"]
        for app in serve_config.get("applications") or []
        for llm in (app.get("args") or {}).get("llm_configs") or []
        if isinstance(llm, dict)
    ]


def _post_json(url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())


def probe(endpoint: str, model_id: str, timeout_s: float = 30.0) -> bool:
    """True when the model generates one token (the only proof that vLLM is ready)."""
    body = {"model": model_id, "prompt": "ping", "max_tokens": 1}
    try:
        reply = _post_json(f"{endpoint}/completions", body, timeout_s)
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return bool(reply.get("choices"))


SMOKE_PROMPT = "Say hello."


PROMPT_POLL_S = 0.2


def read_prompt(path: str, timeout_s: float) -> str:
    """The smoke request's message from ``path``, which the caller writes while the deployment
    starts (`park local rl` picks its question from the starting policy then, so the replica's
    start does not wait for the pick); its first line, once the file exists (the caller renames
    it into place whole), at most ``timeout_s`` after the replica is ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return Path(path).read_text().splitlines()[0]
        except (FileNotFoundError, IndexError):
            if time.monotonic() > deadline:
                raise SystemExit(f"--prompt-file {path}: not written in {timeout_s:.0f}s") from None
        time.sleep(PROMPT_POLL_S)


def smoke(endpoint: str, model_id: str, max_tokens: int = 16, prompt: str = SMOKE_PROMPT) -> str:
    """One greedy chat completion of `prompt`; returns the reply text (random weights: expect
    gibberish; a trained export: what it learned)."""
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    reply = _post_json(f"{endpoint}/chat/completions", body, timeout_s=120)
    return str(reply["choices"][0]["message"]["content"])


@dataclass
class LocalServe:
    """A running local deployment; ``shutdown()`` undoes what ``deploy`` started."""

    endpoint: str
    model_ids: list[str]
    changes: list[str]
    ray_address: str
    app_names: list[str] = field(default_factory=list)
    started_ray: bool = True

    def shutdown(self) -> None:
        import ray
        from ray import serve

        if not ray.is_initialized():
            return
        if self.started_ray:
            serve.shutdown()
            ray.shutdown()
        else:  # attached to someone's cluster: remove only our apps
            for name in self.app_names:
                serve.delete(name)
            ray.shutdown()


def _start_ray(address: str | None, dashboard: bool) -> bool:
    """Attach to ``address`` or start a private local Ray on random ports; True if started."""
    import ray

    register_llm_components_before_connecting()  # else validating below races the controller
    if address:
        # Ray 2.60 starts clusters with token auth (~/.ray/auth_token); a driver attaching by
        # address only sends the token in token mode.
        if (Path.home() / ".ray" / "auth_token").is_file():
            os.environ.setdefault("RAY_AUTH_MODE", "token")
        ray.init(address=address, namespace="serve", log_to_driver=False)
        return False
    options: dict[str, Any] = {"include_dashboard": dashboard, "log_to_driver": False}
    if dashboard:
        options["dashboard_port"] = free_port()
    # GCS and the other Ray ports are random for a ray.init()-started cluster.
    # At least 2 logical CPUs: the LLM server asks for 2 (replica actor + engine bundle).
    ray.init(num_cpus=max(2, os.cpu_count() or 1), namespace="serve", **options)
    return True


def _wait_ready(
    endpoint: str, model_ids: list[str], app_names: list[str], timeout_s: float
) -> None:
    """Wait for Serve to report the apps RUNNING and every model to generate one token."""
    from ray import serve

    deadline = time.monotonic() + timeout_s
    pending = list(model_ids)
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"not ready after {timeout_s:.0f}s: {pending}")
        apps = serve.status().applications
        for name in app_names:
            app = apps.get(name)
            if app is not None and app.status == "DEPLOY_FAILED":
                raise RuntimeError(f"app {name!r} failed to deploy: {app.message}")
        pending = [m for m in pending if not probe(endpoint, m)]
        if pending:
            time.sleep(2)


def cpu_serve_config(
    serve_config: dict[str, Any],
    *,
    model_path: str | None = None,
    model_paths: Mapping[str, str] | None = None,
    keep_models: list[str] | None = None,
    wait_s: int | None = None,
    config_from: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """What ``deploy`` deploys, before any port or Ray: the CPU profile applied to every
    model, each from its folder in ``model_paths`` (waited for, with ``wait_s``) or from
    ``model_path`` (default: the tiny model, built here only when a model needs it)."""
    named = dict(model_paths or {})
    if model_path is None and not set(served_models(serve_config)) <= set(named):
        from workloads.serve.tiny_model import build_tiny_model

        model_path = str(build_tiny_model())
    return to_cpu(
        serve_config,
        model_path or "",
        keep_models=keep_models,
        wait_s=wait_s,
        config_from=config_from,
        model_paths=named,
        waiting=list(named) if named else None,
    )


def deploy(
    serve_config: dict[str, Any],
    *,
    model_path: str | None = None,
    port: int | None = None,
    address: str | None = None,
    keep_models: list[str] | None = None,
    dashboard: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    announce: Callable[[list[str]], None] | None = None,
    wait_for_model: bool = False,
    config_from: str | None = None,
    model_paths: Mapping[str, str] | None = None,
) -> LocalServe:
    """Run a rendered ``serveConfigV2`` on this machine's CPU; return once it generates.

    ``model_path`` defaults to the cached tiny model (built on first use); ``port`` to a free one;
    ``address`` attaches to an existing Ray instead of starting one. ``announce`` receives the
    list of changes before the (minutes-long) deployment starts. ``wait_for_model``: another
    job is still writing ``model_path`` (a run's export): its replica waits for the folder's
    marker as the rendered config says (workloads/serve/wait.py), within ``timeout_s``;
    ``config_from`` then names a folder with the same config (the shapes it is served with).
    ``model_paths``: served id -> its own folder (the others get ``model_path``); with it, only
    those folders are waited for.
    """
    from ray.serve._private.api import serve_start
    from ray.serve.schema import ServeDeploySchema

    cpu_config, changes = cpu_serve_config(
        serve_config,
        model_path=model_path,
        model_paths=model_paths,
        keep_models=keep_models,
        wait_s=int(timeout_s) if wait_for_model else None,
        config_from=config_from,
    )
    port = port or free_port()
    http = cpu_config.get("http_options") or {}
    if (http.get("host"), http.get("port")) != ("127.0.0.1", port):
        changes.append(f"http_options {http or 'default'} -> 127.0.0.1:{port} (local only)")
    cpu_config["http_options"] = {**http, "host": "127.0.0.1", "port": port}
    if announce:
        announce(changes)
    schema = ServeDeploySchema.model_validate(cpu_config)
    started_ray = _start_ray(address, dashboard)
    import ray

    app_names = [app.name for app in schema.applications]
    local = LocalServe(
        endpoint=f"http://127.0.0.1:{port}/v1",
        model_ids=served_models(cpu_config),
        changes=changes,
        ray_address=ray.get_runtime_context().gcs_address,
        app_names=app_names,
        started_ray=started_ray,
    )
    try:
        client = serve_start(
            http_options=schema.http_options.model_dump(),
            proxy_location=schema.proxy_location,
        )
        client.deploy_apps(schema)
        # Checked with Ray's LLM classes while the controller builds the app (their import
        # loads vLLM, seconds the replica's start need not wait for); refused, it goes.
        problems = validate_serve_config(cpu_config)
        if problems:
            raise ValueError("the CPU serve config is invalid:\n  " + "\n  ".join(problems))
        _wait_ready(local.endpoint, local.model_ids, app_names, timeout_s)
    except BaseException:
        local.shutdown()
        raise
    return local


def _serve_until_signalled() -> None:
    """Block until SIGINT or SIGTERM (both end in the same clean shutdown)."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass


def model_folders(pairs: list[str] | None) -> dict[str, str]:
    """``--serve-from ID=PATH`` values as {served id: folder}."""
    folders: dict[str, str] = {}
    for pair in pairs or []:
        model, sep, path = pair.partition("=")
        if not sep or not model or not path:
            raise SystemExit(f"--serve-from {pair!r}: expected MODEL_ID=PATH")
        folders[model] = path
    return folders


def build_parser() -> argparse.ArgumentParser:
    """The command line (park local builds it: infra/tools/local/serving.py)."""
    parser = argparse.ArgumentParser(
        prog="python -m workloads.serve.local",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--serve-config", required=True, help="rendered serveConfigV2 YAML, or -")
    parser.add_argument("--port", type=int, default=None, help="Serve HTTP port (default: free)")
    parser.add_argument("--keep", action="store_true", help="keep serving until interrupted")
    parser.add_argument("--smoke", action="store_true", help="answer one chat completion")
    parser.add_argument("--prompt", default=SMOKE_PROMPT, help="the smoke request's message")
    parser.add_argument(
        "--prompt-file",
        help="read the smoke request's message from this file, waiting for it (its writer "
        "picks it while the deployment starts)",
    )
    parser.add_argument("--max-tokens", type=int, default=16, help="the smoke reply's length")
    parser.add_argument("--model", action="append", help="served model id to keep (repeatable)")
    parser.add_argument("--model-path", help="local HF model dir (default: the tiny model)")
    parser.add_argument(
        "--serve-from",
        action="append",
        metavar="ID=PATH",
        help="serve model ID from the HF folder PATH (repeatable; the others: --model-path)",
    )
    parser.add_argument("--address", help="attach to this Ray cluster instead of starting one")
    parser.add_argument("--dashboard", action="store_true", help="start Ray's dashboard")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="readiness, s")
    parser.add_argument(
        "--wait-for-model",
        action="store_true",
        help="--model-path is still being written (a run's export): the replica waits for it",
    )
    parser.add_argument("--config-from", help="a folder with the model's config (see above)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)

    config = load_serve_config(args.serve_config)
    started = time.monotonic()

    def announce(changes: list[str]) -> None:
        print(CHANGES_HEADER)
        for change in changes:
            print(f"{CHANGE_ITEM}{change}")
        print("deploying (about 1.5 min on 2 cores)...", flush=True)

    local = deploy(
        config,
        model_path=args.model_path,
        port=args.port,
        address=args.address,
        keep_models=args.model,
        dashboard=args.dashboard,
        timeout_s=args.timeout,
        announce=announce,
        wait_for_model=args.wait_for_model,
        config_from=args.config_from,
        model_paths=model_folders(args.serve_from),
    )
    try:
        print(f"{ENDPOINT_MARKER}{local.endpoint}", flush=True)
        print(f"{RAY_ADDRESS_MARKER}{local.ray_address}", flush=True)
        print(f"ready in {time.monotonic() - started:.0f}s; models: {', '.join(local.model_ids)}")
        if args.smoke:  # every model served answers once
            prompt = args.prompt
            if args.prompt_file:
                prompt = read_prompt(args.prompt_file, args.timeout)
            for model_id in local.model_ids:
                reply = smoke(local.endpoint, model_id, args.max_tokens, prompt)
                answer = {"model": model_id, "prompt": prompt, "reply": reply}
                print(f"{REPLY_PREFIX}{json.dumps(answer)}", flush=True)
                print(f"{SMOKE_MARKER}chat completion from {model_id!r}: {reply!r}", flush=True)
        if args.keep:
            print("serving; Ctrl-C to stop", flush=True)
            _serve_until_signalled()
    finally:
        local.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
