"""The serving RayService: Ray Serve LLM's serveConfigV2 (one LLMConfig per served model,
each engine's environment from its record in infra.engines) around the shared Ray pods."""

from __future__ import annotations

from typing import Any

import yaml

from infra import engine, engines, kuberay
from infra.names import EXPOSE_SERVE_ANNOTATION, OPENAI_SERVICE_NAME, SERVE_PORT, SERVICE_NAME
from infra.plan import serve_tuning
from infra.plan.ray.pods import RayPods, app_labels, head_group, label_pods, tpu_worker_group
from infra.resolve import ServedModelPlan, ServingPlan, disk
from infra.resolve.types import ModelWait
from infra.versions import IMAGE_TAG, RAY_VERSION
from workloads import protocol
from workloads.serve import app as serve_app


def model_source(pods: RayPods, source: str) -> str | dict[str, str]:
    """What the engine loads: a hub id's copy staged once in our bucket (`park stage-model`,
    resolve.disk), and our own bucket's folders, through the FUSE mount and its sized file cache
    (never a per-host hub download into scratch); other buckets mirrored by Serve LLM."""
    if disk.needs_staging(source):
        return disk.staged_path(pods.mount_path, source)
    own = f"gs://{pods.bucket}/"
    if source.startswith(own):
        return f"{pods.mount_path}/{source[len(own) :]}"
    if source.startswith("gs://"):
        return {"bucket_uri": source}
    return source


# How long Serve waits on a replica's health check (Ray 2.60 LLM's default: 10 s, RAY_SERVE_LLM_
# DEFAULT_HEALTH_CHECK_TIMEOUT_S in L/constants.py:39-41). The check is a flag read: LLMServer.
# check_health (L/core/server/llm_server.py:590-601) awaits vLLM's AsyncLLM.check_health, which
# raises only when the engine is dead (vllm/v1/engine/async_llm.py:1089-1092); an XLA compile runs
# in the engine's own process, not on the replica's event loop, and the engine's start is bounded
# by RAYLLM_ENGINE_START_TIMEOUT_S instead (llm_server.py:257; Serve checks health only once the
# constructor returned). So the timeout only waits out a busy event loop: the request path runs
# on it (RAY_SERVE_THROUGHPUT_OPTIMIZED). Serve restarts a replica after 3 failed checks
# (REPLICA_HEALTH_CHECK_UNHEALTHY_THRESHOLD, S/constants.py:329), each period 10 s: a wedged replica
# is replaced within ~3.5 minutes. (Google's TorchTPU serving sample uses 900 s: ~45 minutes.)
HEALTH_CHECK_TIMEOUT_S = 60
COMPILE_CACHE_DIR = "cache"  # under the bucket mount: <mount>/cache/{torch-tpu,vllm}/<key>
# Each host of a multi-host replica compiles the same programs under the same cache keys, and
# GCS FUSE has no locking across hosts: two hosts finalizing one object race (one's upload
# replaces the other's, or fails its generation precondition). So each host writes its own
# folder. The TPU webhook injects TPU_WORKER_ID (0..hosts-1) into every TPU worker pod, and
# Ray 2.60 expands ``${VAR}`` in a runtime_env's env_vars from each worker process's own
# environment when it starts it (ray/_private/utils.py `update_envs`), which the replica's
# children inherit: so each host resolves its own path. A single host is its own writer.
PER_HOST_CACHE = "host-${TPU_WORKER_ID}"
# LLMServer waits this long for its engine to start (RAYLLM_ENGINE_START_TIMEOUT_S, Ray 2.60's
# default: L/constants.py ENGINE_START_TIMEOUT_S, read in the replica); a model that waits for
# its folder inside the start (workloads/serve/wait.py) gets its wait on top.
ENGINE_START_TIMEOUT_S = 3600


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "-" for c in text.lower()).strip("-")


def compile_cache_key(serving: ServingPlan, model_name: str, tensor_parallel: int) -> str:
    """Entries only a replica of the same model, slice shape, TP and engine may reuse."""
    tpu, record = serving.pool.slice, engines.get(serving.spec.engine)
    return (
        f"{_slug(model_name)}-{tpu.machine_type}-{tpu.topology}-tp{tensor_parallel}-"
        f"{record.name}-{record.version}-{IMAGE_TAG}"
    )


def _engine_env(serving: ServingPlan, pods: RayPods, model_name: str, tp: int) -> dict[str, str]:
    """The engine's environment (its record, infra.engines): its executor on multi-host, the
    topology torch_tpu must use, and its compile caches on the bucket so a restarted replica
    starts warm."""
    tpu, record = serving.pool.slice, engines.get(serving.spec.engine)
    env: dict[str, str] = {}
    if tpu.multi_host:
        env.update(record.multi_host_env)
    topology = engine.torch_tpu_topology(tpu, tp)
    if topology:
        # The TPU webhook injects the whole host's TORCH_TPU_TOPOLOGY, which torch_tpu keeps
        # (vllm_torchtpu/platforms/tpu_platform.py:540): a TP-4 engine on 8 chips needs 2,2,1.
        env["TORCH_TPU_TOPOLOGY"] = topology
    # The key keeps models, slice shapes, TPs and versions apart; the engine hashes its own
    # config (max_model_len, memory utilization...) inside.
    key = compile_cache_key(serving, model_name, tp)
    root = f"{pods.mount_path}/{COMPILE_CACHE_DIR}"
    host = f"/{PER_HOST_CACHE}" if tpu.multi_host else ""
    for variable, folder in record.compile_cache_env:
        env[variable] = f"{root}/{folder}/{key}{host}"
    return env


def _waits(model: ServedModelPlan) -> dict[str, Any]:
    """A model whose folder another job writes: Serve LLM's callback that waits for the
    folder's marker inside the replica's start (workloads/serve/wait.py), its bound, and the
    engine start's timeout raised by that bound."""
    return {} if model.wait is None else {"callback_config": wait_callback(model.wait)}


def wait_callback(wait: ModelWait) -> dict[str, Any]:
    """An LLMConfig's callback_config: wait for ``wait.marker`` inside the replica's start."""
    return {
        "callback_class": protocol.SERVE_WAIT_CALLBACK,
        "callback_kwargs": {
            "timeout_s": wait.timeout_s,
            "marker": wait.marker,
            "writer": wait.writer,
        },
    }


def _start_env(model: ServedModelPlan) -> dict[str, str]:
    if model.wait is None:
        return {}
    return {"RAYLLM_ENGINE_START_TIMEOUT_S": str(ENGINE_START_TIMEOUT_S + model.wait.timeout_s)}


def serve_config(serving: ServingPlan, pods: RayPods) -> dict[str, Any]:
    """serveConfigV2: an OpenAI app of Ray Serve LLM's LLMServer (workloads/serve/app.py), one
    LLMConfig per served model.

    Aligned with Google's TorchTPU serving sample (kubernetes-engine-samples ai-ml/gke-ray/
    rayserve/llm/torchtpu/serve_vllm_torchtpu.py): one TPU per engine worker's placement bundle,
    a health-check timeout that covers XLA compilation, the Ray executor across hosts.
    Deliberately not taken from it: `language_model_only` and `disable_hybrid_kv_cache_manager`
    (Gemma 4 choices: the latter makes sliding-window layers hold full context, a stack sets it
    in engineKwargs when it wants it), and `USE_MOE_SPARSE_CORE=0` (routes Gemma 4's experts;
    other MoE models keep the default). `max_num_seqs` and `max_num_batched_tokens` are pinned to
    the numbers the plan's memory fit costs (ServedModelPlan.settings), so the engine cannot
    settle on another batch than the one the fit was made for.
    """
    tpu, record = serving.pool.slice, engines.get(serving.spec.engine)
    llm_configs = []
    for model in serving.models:
        spec = model.spec
        kwargs: dict[str, Any] = {
            **spec.engine_kwargs,
            "tensor_parallel_size": model.tensor_parallel,
            "max_model_len": spec.max_model_len,
            "enable_expert_parallel": spec.enable_expert_parallel,
            "max_num_seqs": model.settings.max_num_seqs,
            "max_num_batched_tokens": model.settings.max_num_batched_tokens,
        }
        if tpu.multi_host:
            # What Serve LLM forces anyway for an accelerator (vllm_models.py:147-162); the
            # plugin then picks its Ray executor from TPU_MULTIHOST_BACKEND.
            kwargs["distributed_executor_backend"] = "ray"
        llm_configs.append(
            {
                "model_loading_config": {
                    "model_id": spec.name,
                    # source: training is the run's export on the bucket, through the mount.
                    "model_source": model_source(pods, model.source or spec.source),
                },
                "accelerator_type": tpu.ray_accelerator_type,
                "accelerator_config": {"kind": "tpu", "topology": tpu.topology},
                # The engine's bundle per worker (one TPU: its workers take one chip each); the
                # slice placement group then holds every chip of the topology as such bundles.
                "placement_group_config": {"bundle_per_worker": dict(record.worker_bundle)},
                "engine_kwargs": kwargs,
                "deployment_config": {
                    "autoscaling_config": {
                        "min_replicas": spec.min_replicas,
                        "max_replicas": spec.max_replicas,
                        "target_ongoing_requests": model.target_ongoing_requests,
                    },
                    "health_check_timeout_s": HEALTH_CHECK_TIMEOUT_S,
                    # A replica stopped (downscale, config update, a draining node) finishes
                    # its streams first: Serve waits while it has requests, up to this long
                    # (its default is 20 s, S/constants.py:270).
                    "graceful_shutdown_timeout_s": model.drain_s,
                    "max_constructor_retry_count": model.start_attempts,
                    **serve_tuning.deployment_options(),
                },
                "runtime_env": {
                    "env_vars": {
                        **tpu.ray_env(),
                        **_engine_env(serving, pods, spec.name, model.tensor_parallel),
                        **_start_env(model),
                    }
                },
                **_waits(model),
                **serve_tuning.llm_config_options(),
            }
        )
    return {
        "applications": [
            {
                "name": "llm",
                "route_prefix": "/",
                # Our builder over Ray's (workloads/serve/app.py, issue 39 "One hop fewer"):
                # with one model the LLMServer is the ingress and HAProxy forwards straight to
                # its replicas, by least connections, without Ray's LLMRouter call per request;
                # with several models it is Ray's build_openai_app on the same args.
                "import_path": serve_app.IMPORT_PATH,
                "args": {"llm_configs": llm_configs, **serve_tuning.app_args()},
            }
        ]
    }


DELETION_DELAY = "rayClusterDeletionDelaySeconds"


def _declares(release: str, field: str) -> bool:
    """Whether KubeRay ``release`` declares the RayService spec field (infra.kuberay's data)."""
    try:
        probe = {"kind": "RayService", "spec": {field: 0}}
        return bool(release) and not kuberay.unknown_fields(probe, release)
    except ValueError:  # not a release version: the rules refuse it
        return False


def drain_window_s(serving: ServingPlan) -> int:
    """The longest stream any served model may send (ServedModelPlan.drain_s): the cluster-wide
    windows (HAProxy's, the old cluster's deletion delay) wait that long."""
    return max((m.drain_s for m in serving.models), default=engine.DRAIN_FLOOR_S)


def rayservice(serving: ServingPlan, pods: RayPods, *, hf_token: bool) -> dict[str, Any]:
    """The serving RayService. Each replica holds a whole slice (infra.resolve), so the TPU
    worker group starts at the slices of the models' minReplicas and Serve autoscaling grows it
    up to those of their maxReplicas. Upgrade strategy "NewCluster" (blue/green) holds a second
    cluster of the same size while it runs; the default "None" updates the serve config in
    place and needs no spare slice."""
    spec, image = serving.spec, serving.image
    drain_s = drain_window_s(serving)
    # Ray Serve settings read from the process environment
    ray_env = serve_tuning.ray_env(num_models=len(serving.models), drain_s=drain_s)
    service_type = "LoadBalancer" if spec.expose_publicly else "ClusterIP"
    metadata: dict[str, Any] = {
        "name": SERVICE_NAME,
        "namespace": pods.namespace,
        "labels": app_labels(SERVICE_NAME),
    }
    if spec.expose_publicly:
        # park:serving.exposePublicly, made visible to review and to the policy pack
        metadata["annotations"] = {EXPOSE_SERVE_ANNOTATION: "true"}
    manifest: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": metadata,
        "spec": {
            "upgradeStrategy": {"type": spec.upgrade_strategy},
            # The serve Service selects the worker pods only: the head runs no replica, and
            # through its proxy every request took one more hop (KubeRay 1.7.0 CRD field).
            "excludeHeadPodFromServeSvc": True,
            "serveConfigV2": yaml.safe_dump(serve_config(serving, pods), sort_keys=False),
            "serveService": {
                "metadata": {"name": OPENAI_SERVICE_NAME},
                "spec": {
                    "type": service_type,
                    "ports": [{"name": "serve", "port": SERVE_PORT, "targetPort": SERVE_PORT}],
                },
            },
            "rayClusterConfig": {
                "rayVersion": RAY_VERSION,
                "enableInTreeAutoscaling": True,
                "headGroupSpec": head_group(
                    pods,
                    image,
                    hf_token=hf_token,
                    autoscaler=True,
                    extra_env=ray_env,
                    role="serving-head",
                ),
                "workerGroupSpecs": [
                    tpu_worker_group(
                        pods,
                        serving.pool,
                        image,
                        replicas=serving.min_slices,
                        min_replicas=0,
                        max_replicas=serving.max_slices,
                        hf_token=hf_token,
                        extra_env=ray_env,
                        role="serving-worker",
                    )
                ],
            },
        },
    }
    if serving.upgrade_clusters > 1 and _declares(serving.kuberay, DELETION_DELAY):
        # After a blue/green switch the old cluster keeps its in-flight streams until KubeRay
        # deletes it (60 s by default, ray_service_controller.go RayClusterDeletionDelayDuration):
        # as long as one max-length stream instead. A KubeRay before 1.5.0 lacks the field (the
        # API server would prune it): there the old cluster goes after 60 s, streams or not.
        manifest["spec"]["rayClusterDeletionDelaySeconds"] = drain_s
    label_pods(manifest["spec"]["rayClusterConfig"], SERVICE_NAME)
    return manifest
