"""Ray Serve LLM settings the stack ships for throughput, each read in Ray 2.60's source.

`plan/ray.py:serve_config` merges these into every rendered serveConfigV2 (so TPU gets them
too); what only this 2-core CPU machine needs stays in workloads/serve/cpu_profile.py.
Measured by benchmarks/serve_overhead.py.
"""

from __future__ import annotations

from typing import Any


def llm_config_options() -> dict[str, Any]:
    """Keys merged into each LLMConfig (beside model_loading_config, engine_kwargs, ...)."""
    return {}


def deployment_options() -> dict[str, Any]:
    """Keys merged into each LLMConfig's deployment_config (beside autoscaling_config)."""
    return {}


def app_args() -> dict[str, Any]:
    """Keys merged into the OpenAI app's args (beside llm_configs), e.g. the ingress' options."""
    return {}
