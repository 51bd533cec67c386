"""The serving app's builder: one hop fewer than Ray's (issue 39, "One hop fewer").

Ray 2.60's ``ray.serve.llm:build_openai_app`` puts its own deployment in front of the model's
``LLMServer``. Without direct streaming that is the ``OpenAiIngress`` (FastAPI parsing, then a
DeploymentHandle call to the LLM replica: HAProxy -> ingress replica -> LLM replica). Under
``RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING`` the LLM server is the ingress, but Ray attaches an
``LLMRouter`` deployment as the app's *ingress request router*
(``ray/llm/_internal/serve/core/ingress/builder.py`` ``build_openai_app`` and
``_build_openai_ingress_request_router``): for every POST, HAProxy's Lua action first calls
that router over HTTP (``POST /internal/route``, ``ray/serve/_private/
ingress_request_router.lua.tmpl``), the router picks a replica (round robin by default,
``_get_direct_streaming_serve_options``), and only then does HAProxy forward the request.

With one model, ``build_app`` binds the ``LLMServer`` deployment itself as the ingress, with no
router: Serve builds vLLM's own OpenAI FastAPI app inside each replica once its engine started
(``LLMServer.__serve_build_asgi_app__``: ``vllm.entrypoints.openai.api_server.build_app``, which
serves ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``, streamed or not, plus
Ray's ``/v1/models/{id}``), and HAProxy forwards each request straight to a replica's own port,
choosing by its backend's ``balance`` (``RAY_SERVE_HAPROXY_BALANCE_ALGORITHM``, least
connections: the replica with the fewest open streams). Without HAProxy, Serve's Python proxy
routes to the replicas with the deployment's request router, still without an ingress hop.

Ray's builder is used, unchanged, wherever an ingress in front of the model does something:

- several models: one OpenAI base URL is routed by the request body's ``model``, which only
  Ray's ``OpenAiIngress`` reads (HAProxy routes by path; one app per model would give each model
  its own URL prefix, not one OpenAI endpoint);
- a model with ``lora_config``: adapters are routed by multiplexed model id, for which Ray
  keeps a router (LLMRouter / OpenAiIngress) in front;
- a ``request_router_config`` on the model: HAProxy never consults a deployment's own router,
  and Ray refuses one on an ingress under HAProxy (``ray/serve/_private/build_app.py``
  ``build_app``) unless its LLMRouter asks it;
- the app's own ``ingress_deployment_config`` or ``ingress_cls_config``: options for an
  ingress deployment, which only Ray's builder makes.

The args are ``build_openai_app``'s (``LLMServingArgs``): a rendered ``serveConfigV2`` changes
only its ``import_path`` (``IMPORT_PATH``) to use this builder.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from ray.serve.deployment import Application
    from ray.serve.llm import LLMConfig, LLMServingArgs

IMPORT_PATH = "workloads.serve.app:build_app"
RAYS_IMPORT_PATH = "ray.serve.llm:build_openai_app"  # Ray's builder, same args

logger = logging.getLogger(__name__)


def _llm_configs(args: LLMServingArgs) -> list[LLMConfig]:
    """The validated args' LLMConfigs: LLMServingArgs' validator has made every entry (a dict,
    a YAML file's path) one; the field's declared type still lists what it accepts."""
    return cast("list[LLMConfig]", args.llm_configs)


def why_rays_ingress(args: LLMServingArgs) -> str | None:
    """Why this app needs Ray's ingress in front of its model(s); None when the model's own
    LLMServer can be the ingress (see the module's docstring for each reason)."""
    configs = _llm_configs(args)
    if len(configs) != 1:
        return f"{len(configs)} models: one endpoint routes by the request's model"
    (config,) = configs
    if config.lora_config is not None:
        return "lora_config: adapters are routed by Ray's router"
    if config.deployment_config.get("request_router_config") is not None:
        return "request_router_config: only Ray's LLMRouter consults it under HAProxy"
    if args.ingress_deployment_config:
        return "ingress_deployment_config: options for Ray's ingress deployment"
    if "ingress_cls_config" in args.model_fields_set:
        return "ingress_cls_config: Ray's ingress class"
    return None


def build_app(llm_serving_args: dict[str, Any]) -> Application:
    """An OpenAI-compatible app whose ingress is the model's ``LLMServer`` (one model), else
    Ray's ``build_openai_app`` on the same args. Called by Serve with the app's ``args``."""
    from ray import serve
    from ray.serve.llm import LLMServingArgs, build_llm_deployment, build_openai_app
    from ray.serve.llm.deployment import LLMServer

    args = LLMServingArgs.model_validate(llm_serving_args)
    reason = why_rays_ingress(args)
    if reason is not None:
        logger.info("Ray's OpenAI ingress in front of the model(s): %s", reason)
        return build_openai_app(llm_serving_args)
    (config,) = _llm_configs(args)
    server_cls = config.server_cls or LLMServer
    # serve.ingress() with no app: the class builds its ASGI app in the replica, after its
    # engine started (__serve_build_asgi_app__), as Ray's direct streaming does.
    app: Application = build_llm_deployment(config, deployment_cls=serve.ingress()(server_cls))
    logger.info("The LLMServer is the ingress: no router deployment in front of it")
    return app
