"""The plan's waits and bounds as the stacks render them (issue 27, items 4 and 10).

- the trainer's --model-wait-s is its staged model's staging bound, and the RayJob's deadline
  is the stack's budget plus that wait (the trainer waits inside the job);
- a served model whose folder another job writes names Serve LLM's waiting callback, which
  Ray's own loader resolves, with the writer's bound: a run's export, every attempt of its
  RayJob to its deadline (KubeRay 1.7's rules, infra.resolve.training.RunLimits); a staged hub
  model, its staging bound; the engine's start timeout is raised by the wait;
- Serve's failed-start threshold is the plan's on both operands of Ray's min();
- a multi-host replica's hosts write their compile caches to paths of their own.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra import model_facts, ray_serve
from infra.plan.ray import service
from infra.resolve import disk
from infra.tools.local.ray_head import pods_ray_env
from tests.conftest import SHIPPED_STACKS, render_stack
from workloads import protocol
from workloads.protocol import split_entrypoint


def _manifest(stack: str, kind: str) -> dict[str, Any]:
    (found,) = [m for m in render_stack(stack).manifests() if m["kind"] == kind]
    return found


def _llm_configs(stack: str) -> list[dict[str, Any]]:
    config = yaml.safe_load(_manifest(stack, "RayService")["spec"]["serveConfigV2"])
    return list(config["applications"][0]["args"]["llm_configs"])


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_the_trainer_waits_for_its_staged_model_within_the_jobs_deadline(stack: str) -> None:
    plan = render_stack(stack).plan
    training = plan.training
    assert training is not None and plan.disk is not None
    staged = plan.disk.staged_model(training.spec.model or "")
    assert staged is not None  # both stacks train a hub model from its staged copy
    limits = training.limits
    assert limits.model_wait_s == staged.stage_timeout_s
    assert staged.stage_timeout_s == disk.stage_timeout_s(
        model_facts.weights_bytes(training.facts.facts)
    )
    job = _manifest(stack, "RayJob")["spec"]
    _, fields = split_entrypoint(job["entrypoint"])
    assert fields["model"] == staged.path
    assert int(fields["model_wait_s"] or 0) == limits.model_wait_s
    # the wait happens inside the job: the deadline is the budget plus the wait
    assert (
        job["activeDeadlineSeconds"]
        == training.spec.active_deadline_seconds + staged.stage_timeout_s
    )
    assert job["backoffLimit"] == training.spec.backoff_limit == limits.backoff_limit


def test_a_staging_bound_grows_with_the_weights() -> None:
    small, large = disk.stage_timeout_s(3 * 2**30), disk.stage_timeout_s(73 * 10**9)
    assert disk.STAGE_START_S < small < large
    assert large >= 73 * 10**9 / disk.STAGE_FLOOR_BYTES_PER_S
    assert disk.stage_timeout_s(None) == disk.STAGE_UNKNOWN_SIZE_S


def test_a_run_export_is_waited_for_as_long_as_its_rayjob_may_run() -> None:
    """dev serves its training run: the replica waits for the export's marker as long as the
    RayJob may take to write it: the staging wait, then every attempt to its deadline."""
    plan = render_stack("dev").plan
    assert plan.training is not None and plan.serving is not None
    (model,) = plan.serving.models
    limits = plan.training.limits
    assert model.wait is not None
    expected = (limits.model_wait_s or 0) + (limits.backoff_limit + 1) * limits.active_deadline_s
    assert model.wait.timeout_s == limits.export_within_s == expected
    (llm,) = _llm_configs("dev")
    kwargs = llm["callback_config"]["callback_kwargs"]
    assert llm["callback_config"]["callback_class"] == protocol.SERVE_WAIT_CALLBACK
    assert kwargs["marker"] == protocol.EXPORT_MARKER
    assert kwargs["timeout_s"] == model.wait.timeout_s
    assert llm["model_loading_config"]["model_source"].endswith("/export/final")
    env = llm["runtime_env"]["env_vars"]
    assert int(env["RAYLLM_ENGINE_START_TIMEOUT_S"]) == service.ENGINE_START_TIMEOUT_S + int(
        kwargs["timeout_s"]
    )


def test_a_staged_hub_model_is_waited_for_as_long_as_its_staging() -> None:
    plan = render_stack("prod").plan
    assert plan.serving is not None and plan.disk is not None
    (model,) = plan.serving.models
    staged = plan.disk.staged_model(model.spec.source or "")
    assert staged is not None and model.wait is not None
    assert model.wait.marker == protocol.STAGED_MARKER
    assert model.wait.timeout_s == staged.stage_timeout_s
    (llm,) = _llm_configs("prod")
    assert llm["callback_config"]["callback_kwargs"]["timeout_s"] == staged.stage_timeout_s
    assert llm["model_loading_config"]["model_source"] == staged.path


@pytest.mark.serve  # ray.serve.llm imports vLLM (~9 s when it is the first)
def test_rays_loader_resolves_the_rendered_callback_and_its_engine_timeout() -> None:
    """The rendered LLMConfig as Ray 2.60 reads it: the callback class Ray's own loader
    imports is ours, built with the rendered kwargs; Ray's engine-start default is the one the
    plan adds the wait to, under the name Ray reads."""
    from pathlib import Path

    import ray
    from ray.llm._internal.common.callbacks.base import CallbackBase
    from ray.llm._internal.common.utils.import_utils import load_class
    from ray.llm._internal.serve import constants
    from ray.serve.llm import LLMConfig

    from workloads.serve.wait import WaitForModel

    (llm,) = _llm_configs("dev")
    config = LLMConfig.model_validate(llm)
    loaded = load_class(config.callback_config.callback_class)
    assert loaded is WaitForModel and issubclass(loaded, CallbackBase)
    callback = loaded(llm_config=config, **config.callback_config.callback_kwargs)
    assert callback.markers == (protocol.EXPORT_MARKER,)
    assert callback.timeout_s == llm["callback_config"]["callback_kwargs"]["timeout_s"]
    source = (Path(ray.__file__).parent / "llm/_internal/serve/constants.py").read_text()
    assert '"RAYLLM_ENGINE_START_TIMEOUT_S"' in source
    assert constants.ENGINE_START_TIMEOUT_S == service.ENGINE_START_TIMEOUT_S


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_serves_failed_start_threshold_is_the_plans(stack: str) -> None:
    """Ray 2.60: min(max_constructor_retry_count, target x RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT).
    The plan sets the per-replica count in the pods' env (the controller reads it) and the
    retry count to it times the most replicas: the threshold is the plan's per replica."""
    plan = render_stack(stack).plan
    if plan.serving is None:
        pytest.skip("no serving")
    env = pods_ray_env(_manifest(stack, "RayService"))
    per_replica = int(env["RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT"])
    assert per_replica == ray_serve.SERVE_START_ATTEMPTS_PER_REPLICA
    for model, llm in zip(plan.serving.models, _llm_configs(stack), strict=True):
        retries = llm["deployment_config"]["max_constructor_retry_count"]
        assert retries == model.start_attempts
        for target in range(1, model.spec.max_replicas + 1):
            assert min(retries, target * per_replica) == target * per_replica


@pytest.mark.parametrize("stack", SHIPPED_STACKS)
def test_each_host_of_a_replica_writes_its_own_compile_caches(stack: str) -> None:
    plan = render_stack(stack).plan
    if plan.serving is None:
        pytest.skip("no serving")
    multi_host = plan.serving.pool.slice.multi_host
    for llm in _llm_configs(stack):
        env = llm["runtime_env"]["env_vars"]
        caches = [
            env[v]
            for v in ("TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT", "VLLM_CACHE_ROOT")
            if v in env
        ]
        assert caches
        for path in caches:
            assert path.endswith("/host-${TPU_WORKER_ID}") == multi_host, path
        assert len(set(caches)) == len(caches)  # and each engine cache its own folder
