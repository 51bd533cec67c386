"""The rendered RayService's serving config, held against Ray 2.60's and vLLM's own code.

For every shipped stack that serves and a two-model dev stack (one of whose models may scale):
each rendered app is built from its own ``import_path`` (our builder, workloads/serve/app.py,
over Ray's LLMServer and build_openai_app) and then by Serve's own ``build_app``, under its pods'
env (in the early-started Ray LLM probe, tests/workloads/test_serve_config.py): one model is its
own ingress with no router in front, two get Ray's OpenAI ingress; what the
builders make of it (after Ray LLM deep-merges its defaults) states ``target_ongoing_requests``
wherever a deployment may scale, a health-check timeout of at most 120 s and a graceful shutdown
of at least 120 s; ``engine_kwargs`` pin the batch the memory fit costs; the serve Service leaves
the head out; HAProxy has a server timeout.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import SHIPPED_STACKS, STACKS_DIR, render_stack

TWO_MODELS = "dev-two-models"
SECOND_MODEL = {
    "name": "qwen2.5-1.5b-instruct",
    "source": "Qwen/Qwen2.5-1.5B-Instruct",
    "tensorParallelSize": 4,
    "maxModelLen": 8192,
}
HEALTH_CHECK_MAX_S = 120
DRAIN_MIN_S = 120


def two_model_plan():
    """The dev stack serving two models on three slices; its first may scale from 1 to 2."""
    from infra.schema.read import read_stack_file
    from infra.stack import from_values

    values, secrets = read_stack_file(STACKS_DIR / "Pulumi.dev.yaml")
    values = copy.deepcopy(values)
    pools = values["park:tpuPools"]
    serve = next(p for p in pools if p["name"] == values["park:serving"]["pool"])
    serve["slices"] = 3
    models = values["park:serving"]["models"]
    models[0]["maxReplicas"] = 2
    models.append(dict(SECOND_MODEL))
    return from_values(values, "dev", secrets)


@functools.cache
def _plan(stack: str):
    from infra.stack import from_file

    if stack == TWO_MODELS:
        return two_model_plan()
    return from_file(STACKS_DIR / f"Pulumi.{stack}.yaml", stack)


def _plans() -> dict[str, Any]:
    plans = {s: _plan(s) for s in [*SHIPPED_STACKS, TWO_MODELS]}
    return {s: p for s, p in plans.items() if p.serving is not None}


def _rayservice(plan) -> dict[str, Any]:
    from infra.plan import ray as ray_plan

    return ray_plan.rayservice(plan.serving, ray_plan.ray_pods(plan), hf_token=False)


def probe_apps() -> list[dict[str, Any]]:
    """What the Ray LLM probe builds: each stack's apps, with its pods' Ray env."""
    from infra.tools.local.ray_head import pods_ray_env

    apps = []
    for stack, plan in _plans().items():
        service = _rayservice(plan)
        config = yaml.safe_load(service["spec"]["serveConfigV2"])
        for app in config["applications"]:
            apps.append({"stack": stack, "app": app, "env": pods_ray_env(service)})
    return apps


@pytest.fixture(scope="module")
def built(ray_llm_probe) -> dict[tuple[str, str], dict[str, Any]]:
    """(stack, app) -> the deployments Ray's builder made of it (the probe's BUILT_APP lines)."""
    import json

    stdout = ray_llm_probe[0]
    rows = [
        json.loads(x[len("BUILT_APP ") :])
        for x in stdout.splitlines()
        if x.startswith("BUILT_APP ")
    ]
    return {(r["stack"], r["app"]): r for r in rows}


@pytest.mark.serve
def test_every_rendered_app_builds_with_rays_builder_under_its_pods_env(built) -> None:
    expected = {(a["stack"], a["app"]["name"]) for a in probe_apps()}
    assert TWO_MODELS in {stack for stack, _ in expected}
    assert set(built) == expected
    for (stack, _), row in built.items():
        assert row["error"] is None, f"{stack}: {row['error']}"
        assert row["import_path"] == "workloads.serve.app:build_app", stack
        assert not row["router"], f"{stack}: a router deployment in front of the ingress"
        if stack == TWO_MODELS:  # Ray's OpenAI ingress routes by the request's model
            assert not row["direct_streaming"]
            assert "OpenAiIngress" in row["ingress"], row["ingress"]
            assert sum("LLMServer" in d["name"] for d in row["deployments"]) == 2
        else:  # one model: its LLMServer is the ingress, alone (HAProxy -> replica)
            assert [d["name"] for d in row["deployments"]] == [row["ingress"]], stack
            assert row["ingress"].startswith("LLMServer:"), row["ingress"]


@pytest.mark.serve
def test_what_rays_builder_made_scales_drains_and_checks_health(built) -> None:
    """After Ray LLM's deep merge of its defaults (L/core/server/builder.py:27-34, 1e9 target)."""
    for (stack, _), row in built.items():
        servers = [d for d in row["deployments"] if "LLMServer" in d["name"]]
        assert servers, stack
        for d in servers:
            scaling = d["autoscaling"]
            if scaling and scaling["max_replicas"] > scaling["min_replicas"]:
                assert scaling["target_ongoing_requests"] < 1e9, (stack, d["name"])
            if scaling:
                assert scaling["target_ongoing_requests"] < 1e9, (stack, d["name"])
            assert d["health_check_timeout_s"] <= HEALTH_CHECK_MAX_S, (stack, d["name"])
            assert d["graceful_shutdown_timeout_s"] >= DRAIN_MIN_S, (stack, d["name"])
    scalable = [
        d
        for (s, _), row in built.items()
        if s == TWO_MODELS
        for d in row["deployments"]
        if d["autoscaling"] and d["autoscaling"]["max_replicas"] > d["autoscaling"]["min_replicas"]
    ]
    assert scalable, "the two-model stack's first model may scale"


# ---- the render itself (fast) -------------------------------------------------------------------


def _serving_stacks() -> list[str]:
    return [s for s in SHIPPED_STACKS if s not in ("rl", "rl-8b")]


@pytest.fixture(params=[*_serving_stacks(), TWO_MODELS])
def service(request) -> tuple[Any, dict[str, Any]]:
    """(plan, RayService) as the program renders it (two-model: as the plan renders it)."""
    if request.param == TWO_MODELS:
        plan = two_model_plan()
        return plan, _rayservice(plan)
    rendered = render_stack(request.param)
    if rendered.plan.serving is None:
        pytest.skip("no RayService")
    (manifest,) = [m for m in rendered.manifests() if m["kind"] == "RayService"]
    return rendered.plan, manifest


def _llm_configs(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    return [llm for app in config["applications"] for llm in app["args"]["llm_configs"]]


@pytest.mark.parametrize("stack", _serving_stacks())
def test_the_probe_builds_what_the_program_renders(stack: str) -> None:
    """The probe's input (from the plan) is the rendered RayService's, for each shipped stack."""
    from infra.tools.local.ray_head import pods_ray_env

    rendered = render_stack(stack)
    (manifest,) = [m for m in rendered.manifests() if m["kind"] == "RayService"]
    planned = _rayservice(_plan(stack))
    assert planned["spec"]["serveConfigV2"] == manifest["spec"]["serveConfigV2"]
    assert pods_ray_env(planned) == pods_ray_env(manifest)


def test_engine_kwargs_pin_the_batch_the_fit_costs(service) -> None:
    plan, manifest = service
    for model, llm in zip(plan.serving.models, _llm_configs(manifest), strict=True):
        kwargs = llm["engine_kwargs"]
        assert kwargs["max_num_seqs"] == model.settings.max_num_seqs
        assert kwargs["max_num_batched_tokens"] == model.settings.max_num_batched_tokens
        if model.fit is not None:  # one number, read by both
            assert model.fit.max_num_batched_tokens == kwargs["max_num_batched_tokens"]
            assert model.fit.settings.max_num_seqs == kwargs["max_num_seqs"]
        # vLLM's SchedulerConfig refuses fewer batched tokens than sequences
        assert kwargs["max_num_batched_tokens"] >= kwargs["max_num_seqs"]


@pytest.mark.serve  # imports vLLM
def test_vllms_scheduler_takes_the_pinned_batch(service) -> None:
    """vLLM's own SchedulerConfig (its checks: batched tokens ≥ sequences, and ≥ max_model_len
    without chunked prefill, vllm/config/scheduler.py) keeps both numbers as pinned."""
    from vllm.config.scheduler import SchedulerConfig

    _, manifest = service
    for llm in _llm_configs(manifest):
        kwargs = llm["engine_kwargs"]
        config = SchedulerConfig(
            max_model_len=kwargs["max_model_len"],
            is_encoder_decoder=False,
            max_num_seqs=kwargs["max_num_seqs"],
            max_num_batched_tokens=kwargs["max_num_batched_tokens"],
            enable_chunked_prefill=kwargs.get("enable_chunked_prefill", True),
        )
        assert (config.max_num_seqs, config.max_num_batched_tokens) == (
            kwargs["max_num_seqs"],
            kwargs["max_num_batched_tokens"],
        )


def test_deployments_scale_drain_and_check_health(service) -> None:
    plan, manifest = service
    for model, llm in zip(plan.serving.models, _llm_configs(manifest), strict=True):
        deployment = llm["deployment_config"]
        scaling = deployment["autoscaling_config"]
        assert scaling["target_ongoing_requests"] == model.target_ongoing_requests
        assert 1 <= scaling["target_ongoing_requests"] <= model.settings.max_num_seqs
        assert deployment["health_check_timeout_s"] <= HEALTH_CHECK_MAX_S
        assert deployment["graceful_shutdown_timeout_s"] >= DRAIN_MIN_S
        assert deployment["graceful_shutdown_timeout_s"] == model.drain_s


def test_rayservice_leaves_the_head_out_and_bounds_haproxy(service) -> None:
    from infra.plan.ray.service import drain_window_s
    from infra.tools.local.ray_head import pods_ray_env

    plan, manifest = service
    spec = manifest["spec"]
    assert spec["excludeHeadPodFromServeSvc"] is True
    drain = drain_window_s(plan.serving)
    env = pods_ray_env(manifest)
    assert env["RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S"] == str(drain)
    assert env["RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S"] == str(drain)
    direct = env.get("RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING") == "1"
    assert direct == (len(plan.serving.models) == 1)
    # HAProxy picks the LLM replica itself (no LLMRouter in front): by open connections
    assert env["RAY_SERVE_HAPROXY_BALANCE_ALGORITHM"] == "leastconn"
    (app,) = yaml.safe_load(spec["serveConfigV2"])["applications"]
    assert app["import_path"] == "workloads.serve.app:build_app"
    if "rayClusterDeletionDelaySeconds" in spec:
        assert spec["rayClusterDeletionDelaySeconds"] == drain


def test_env_names_are_rays_own() -> None:
    """Each variable the pods carry for Serve is one Ray 2.60 reads."""
    import ray

    from infra.plan import serve_tuning

    root = Path(ray.__file__).parent
    source = (root / "serve/_private/constants.py").read_text()
    source += (root / "llm/_internal/serve/constants.py").read_text()
    for name in serve_tuning.ray_env(num_models=1, drain_s=300):
        assert f'"{name}"' in source, f"Ray 2.60 reads no {name}"


def test_the_rayservice_fields_are_kuberay_1_7s() -> None:
    crd = (
        Path(__file__).resolve().parents[2] / "infra/schemas/kuberay-v1.7.0/ray.io_rayservices.yaml"
    )
    text = crd.read_text()
    for field in ("excludeHeadPodFromServeSvc", "rayClusterDeletionDelaySeconds"):
        assert f"{field}:" in text
