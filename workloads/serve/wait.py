"""A serving replica that waits for its model folder instead of failing its start.

Ray 2.60's Serve gives a deployment ``min(max_constructor_retry_count, replicas x
RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT)`` failed starts before any replica ran, then marks it
DEPLOY_FAILED for good (ray/serve/_private/deployment_state.py `_failed_to_start_threshold`,
`_terminally_failed`), and KubeRay 1.7 resubmits a serve config only when it changes. A model
whose folder another job is still writing (a run's export, a hub model's staging) would use up
those starts in seconds. A replica that is still starting counts as nothing: the controller
only warns about it (`_check_startup_replicas` stops slow replicas in RECOVERING only).

So the wait happens inside the start: Serve LLM's LLMConfig ``callback_config`` names this
class, and vLLM's engine awaits its ``on_before_node_init`` before it reads the model
(ray/llm/_internal/serve/engines/vllm/vllm_engine.py `start`, inside LLMServer's constructor).
It polls for the folder's completion marker (workloads/protocol.py) in a thread, so the
replica's event loop stays free, for at most ``timeout_s`` (the plan's bound, infra.resolve);
past it the start fails with a message that says why, and counts as one failed start.

The engine's own start is bounded too (LLMServer waits RAYLLM_ENGINE_START_TIMEOUT_S for it,
3600 s by default): the plan raises it by the wait (infra/plan/ray/service.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ray.llm._internal.common.callbacks.base import CallbackBase
from ray.serve._private.constants import SERVE_LOGGER_NAME

from workloads import ready
from workloads.protocol import COMPLETION_MARKERS


class WaitForModel(CallbackBase):
    """Before the engine starts: wait for ``marker`` in the model's folder (its
    ``model_loading_config.model_source``), at most ``timeout_s`` seconds."""

    def __init__(
        self,
        llm_config: Any,
        raise_error_on_callback: bool = True,
        ctx_kwargs: dict[str, Any] | None = None,
        *,
        timeout_s: float,
        marker: str | None = None,
        writer: str = "the job that writes it",
        **kwargs: Any,
    ) -> None:
        super().__init__(llm_config, raise_error_on_callback, ctx_kwargs, **kwargs)
        self.timeout_s = float(timeout_s)
        self.markers = (marker,) if marker else COMPLETION_MARKERS
        self.writer = writer
        self.waited: ready.Waited | None = None

    async def on_before_node_init(self) -> None:
        loading = self.llm_config.model_loading_config
        source = getattr(loading, "model_source", None)
        if not isinstance(source, str):  # a bucket mirrored by Serve LLM: nothing to wait on
            return
        try:
            self.waited = await asyncio.to_thread(
                ready.wait_for_model,
                source,
                timeout_s=self.timeout_s,
                who=f"serving model {self.llm_config.model_id}",
                writer=self.writer,
                markers=self.markers,
            )
        finally:
            _flush_serve_log()


def _flush_serve_log() -> None:
    """What the wait printed, in the replica's log now: Serve redirects a replica's print to
    its logger, which buffers up to 1000 records under RAY_SERVE_THROUGHPUT_OPTIMIZED
    (ray/serve/_private/logging_utils.py `configure_component_logger`)."""
    for handler in logging.getLogger(SERVE_LOGGER_NAME).handlers:
        handler.flush()
