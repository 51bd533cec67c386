"""Our serving app's builder (workloads/serve/app.py), held against Ray 2.60's own code.

Built: the early-started Ray LLM probe (tests/workloads/test_serve_config.py) imports the
builder by its ``IMPORT_PATH`` on the dev config's CPU args and on variants of them, and hands
each app to Serve's own ``build_app`` under HAProxy: one model is an ``LLMServer`` ingress with
no router deployment; what needs Ray's ingress gets Ray's ``build_openai_app``. (The rendered
apps of every shipped stack: tests/infra/test_serve_render.py.)

Served: the dev stack's render (our import path) on vLLM for CPU, with the RayService pods'
Ray env (HAProxy, throughput mode), through ``python -m workloads.serve.local`` as the
benchmark's Ray side starts it (benchmarks/serve/servers.py); it answers
``/v1/models`` and chat completions, streamed and not, and HAProxy's own config shows it
forwards to the LLM replica by least connections with no router call.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tests.workloads.serve_fixtures import ROOT
from workloads.serve import local

pytestmark = pytest.mark.serve

# Each variant's expected ingress: the LLMServer itself, or Ray's OpenAI ingress (and why).
EXPECTED = {
    "one": None,
    "two": "2 models",
    "lora": "lora_config",
    "router": "request_router_config",
    "ingress": "ingress_deployment_config",
    "ingress_cls": "ingress_cls_config",
}
ROUND_ROBIN = "ray.serve.experimental.round_robin_router:RoundRobinRouter"


def builder_variants(args: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The dev config's CPU ``args`` (one model) and one variant per reason for Ray's ingress."""
    llm = args["llm_configs"][0]
    second = {**llm, "model_loading_config": {**llm["model_loading_config"], "model_id": "two"}}
    lora = {**llm, "lora_config": {"dynamic_lora_loading_path": "gs://bucket/adapters"}}
    routed = {
        **llm,
        "deployment_config": {
            **llm["deployment_config"],
            "request_router_config": {"request_router_class": ROUND_ROBIN},
        },
    }
    ingress_cls = "ray.serve.llm.ingress:OpenAiIngress"
    return {
        "one": args,
        "two": {**args, "llm_configs": [llm, second]},
        "lora": {**args, "llm_configs": [lora]},
        "router": {**args, "llm_configs": [routed]},
        "ingress": {**args, "ingress_deployment_config": {"ray_actor_options": {"num_cpus": 0}}},
        "ingress_cls": {**args, "ingress_cls_config": {"ingress_cls": ingress_cls}},
    }


@pytest.fixture(scope="module")
def variants(ray_llm_probe: tuple[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    rows = [
        json.loads(line.removeprefix("OUR_BUILDER "))
        for line in ray_llm_probe[0].splitlines()
        if line.startswith("OUR_BUILDER ")
    ]
    return {row["variant"]: row for row in rows}


def test_one_model_is_its_own_ingress_with_no_router(variants: dict[str, Any]) -> None:
    one = variants["one"]
    assert one["error"] is None, one["error"]
    assert one["why"] is None
    assert one["ingress"].startswith("LLMServer:"), one["ingress"]
    assert one["deployments"] == [one["ingress"]]  # nothing else: no OpenAiIngress, no LLMRouter
    assert not one["router"]


def test_what_needs_an_ingress_gets_rays(variants: dict[str, Any]) -> None:
    assert set(variants) == set(EXPECTED)
    for name, why in EXPECTED.items():
        if why is None:
            continue
        row = variants[name]
        assert row["error"] is None, f"{name}: {row['error']}"
        assert why in row["why"], (name, row["why"])
        assert "OpenAiIngress" in row["ingress"], (name, row["ingress"])
        servers = [d for d in row["deployments"] if d.startswith("LLMServer:")]
        assert len(servers) == (2 if name == "two" else 1), (name, row["deployments"])


# ---- served on CPU, as shipped ------------------------------------------------------------------


@dataclass
class Served:
    endpoint: str
    model_id: str
    sid: int  # the server's session: Ray's processes, HAProxy among them, stay in it


def _shipped_dev() -> tuple[dict[str, Any], dict[str, str]]:
    """The dev stack's serveConfigV2 as the plan renders it, and its serving pods' Ray env."""
    from infra.plan import ray as ray_plan
    from infra.stack import from_file
    from infra.tools.local.ray_head import pods_ray_env

    plan = from_file(ROOT / "stacks" / "Pulumi.dev.yaml", "dev")
    assert plan.serving is not None
    service = ray_plan.rayservice(plan.serving, ray_plan.ray_pods(plan), hf_token=False)
    return yaml.safe_load(service["spec"]["serveConfigV2"]), pods_ray_env(service)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``python -m workloads.serve.local --keep`` on the render, with the pods' Ray env (the
    benchmark's Ray side: it stops every process of the server, or fails)."""
    from benchmarks.serve import servers
    from infra.tools.local.ray_head import LOCAL_RAY_ENV

    config, pods_env = _shipped_dev()
    assert config["applications"][0]["import_path"] == "workloads.serve.app:build_app"
    (model_id,) = local.served_models(config)
    work = tmp_path_factory.mktemp("serve-app")
    env = {**LOCAL_RAY_ENV, **pods_env}
    with servers.ray_serve_llm("ours", config, env, work, f"test-{os.getpid()}/ours") as server:
        yield Served(f"{server.base_url}/v1", model_id, server.sid)


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=60) as response:
        return dict(json.loads(response.read()))


def _post(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return bytes(response.read())


def _haproxy_config(sid: int) -> str:
    """The config of the HAProxy that Serve started for the server, once it names a replica."""
    from benchmarks.serve import servers

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for text in servers.haproxy_configs(sid):
            if "SERVE_REPLICA" in text:
                return text
        time.sleep(1)
    raise AssertionError("no HAProxy config naming a replica in the server's session")


def test_served_through_our_app_answers_models_and_chat(served: Served) -> None:
    models = _get(f"{served.endpoint}/models")
    assert [m["id"] for m in models["data"]] == [served.model_id]
    chat = {
        "model": served.model_id,
        "messages": [{"role": "user", "content": "What is a TPU?"}],
        "max_tokens": 6,
        "temperature": 0.0,
    }
    reply = json.loads(_post(f"{served.endpoint}/chat/completions", chat))
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert 0 < reply["usage"]["completion_tokens"] <= 6
    streamed = _post(f"{served.endpoint}/chat/completions", {**chat, "stream": True}).decode()
    chunks = [x for x in streamed.splitlines() if x.startswith("data: {")]
    assert len(chunks) >= 2, streamed
    assert streamed.rstrip().endswith("data: [DONE]")
    prompt = {"model": served.model_id, "prompt": "A TPU is", "max_tokens": 4}
    completion = json.loads(_post(f"{served.endpoint}/completions", prompt))
    assert completion["choices"][0]["text"] is not None


def test_haproxy_forwards_to_the_llm_replica_by_least_connections(served: Served) -> None:
    """Ray's HAProxy config (S/haproxy_templates.py): no ingress-request-router Lua action (the
    LLMRouter call Ray's direct streaming makes per POST), least connections, and the app's
    backend serves straight from the LLMServer replica."""
    text = _haproxy_config(served.sid)
    assert "lua-load" not in text and "via-ingress-request-router" not in text
    assert re.search(r"^\s*balance leastconn\s*$", text, re.MULTILINE), text
    assert re.search(r"server SERVE_REPLICA\S*LLMServer\S* \S+:\d+", text), text
    assert "OpenAiIngress" not in text and "LLMRouter" not in text
