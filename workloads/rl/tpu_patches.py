"""FP32 numerics for RL rollouts on vllm-torchtpu: log-probabilities and sampling noise.

vllm-torchtpu's runner computes what the GRPO loss divides by, and the noise it samples with, in
the logits' dtype (bf16 on TPU):

- ``TPUModelRunner.gather_logprobs`` takes ``(token_logit - logsumexp(logits)).to(float32)``:
  the subtraction is done in bf16 before the cast, so a small log-probability loses its digits
  to cancellation (an error of up to ~0.06 nats at |logp| ~ 10), more than the learner/sampler
  mismatch the importance weights are meant to correct.
- ``sample_tokens`` draws ``u = torch.rand_like(logits)`` (bf16) for the Gumbel-max trick in
  ``TPUModelRunner.sample_from_logits``; bf16 uniforms clamped to ``1 - eps(bf16)`` cap the
  Gumbel noise at ~4.85, so tokens far in the tail are drawn less often than their probability
  ("bf16 noise biases policy-gradient training", Google's verl TPU plugin).

:data:`PATCHES` names what is replaced, as read in the source (:data:`SOURCE`); the replacements
compute in fp32 (:func:`fp32_gather_logprobs`, :func:`fp32_uniform`). :func:`apply` installs them
when vllm-torchtpu is importable, and only then: on vLLM for CPU or GPU nothing is touched. It
runs in every vLLM worker process when the worker extension is imported
(workloads/rl/engine_weights.py), which vLLM does before it builds the worker and its runner
(``WorkerWrapperBase.init_worker``), and the runner binds ``sample_from_logits_func`` to the
class's method in its ``__init__``: the patch has to be on the class by then. Not yet run on a
TPU.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENGINE_MODULE = "vllm_torchtpu"

# Where the names below were read (the package on PyPI is a placeholder; the source is not
# installable here). The verl plugin's patch targets the same names and parameters.
SOURCE = {
    "repo": "github.com/kowalski-4831/vllm-torchtpu (a copy of vllm-project's vllm-torchtpu)",
    "path": "src/vllm_torchtpu/runner/tpu_runner.py",
    "commit": "0095cdcbda2a44e2b3cd5975d2954765e2e95629",
    "also": "verl-project/verl-hardware-plugin verl_hardware_plugin/rollout/tpu_vllm_patches.py "
    "(patch_tpu_logprobs, patch_tpu_sampler; pins vllm-torchtpu 9faafb17, vLLM 0.29.0)",
}
# Both methods are ``@torch.compile(backend="tpu", fullgraph=True, dynamic=False)`` there.
COMPILE_BACKEND = "tpu"
# A guard on the class, so that a second apply (another extension import) changes nothing.
APPLIED_ATTR = "_park_fp32_patches"


@dataclass(frozen=True)
class Patch:
    """One method replaced: its module, class, name and parameters as read in the source."""

    name: str  # what the report calls it
    module: str
    cls: str
    method: str
    params: tuple[str, ...]


PATCHES = (
    Patch(
        "fp32-logprobs",
        "vllm_torchtpu.runner.tpu_runner",
        "TPUModelRunner",
        "gather_logprobs",
        ("self", "logits", "sampled_tokens"),
    ),
    Patch(
        "fp32-sampling-noise",
        "vllm_torchtpu.runner.tpu_runner",
        "TPUModelRunner",
        "sample_from_logits",
        ("self", "logits", "temperatures", "u", "top_k", "top_p", "all_greedy"),
    ),
)


def fp32_gather_logprobs(
    logits: Any, sampled_tokens: Any, max_logprobs: int
) -> tuple[Any, Any, Any]:
    """``(token ids, fp32 log-probabilities, ranks)`` as the engine's ``gather_logprobs``
    returns them (the sampled token first, then the ``max_logprobs`` most likely), with the
    normalisation done in fp32: ``log_softmax(logits.float())``. Ranks and the top-k choice are
    read off the logits as the engine does."""
    import torch

    token_ids = sampled_tokens.to(torch.int64)
    token_logits = logits.gather(-1, token_ids)
    ranks = (logits >= token_logits).sum(dim=-1, dtype=torch.int32)
    logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    chosen = logprobs.gather(-1, token_ids)
    if max_logprobs > 0:
        top = torch.topk(logits, max_logprobs, dim=-1).indices
        token_ids = torch.cat((token_ids, top), dim=1)
        chosen = torch.cat((chosen, logprobs.gather(-1, top)), dim=1)
    return token_ids.to(torch.int32), chosen, ranks


def fp32_uniform(like: Any, generator: Any) -> Any:
    """Uniforms of ``like``'s shape and device in fp32, from the runner's sampling generator (the
    one that keeps tensor-parallel ranks drawing the same numbers)."""
    import torch

    return torch.rand(like.shape, dtype=torch.float32, device=like.device, generator=generator)


def _sampling_generator(runner: Any) -> Any:
    """The runner's generator for sampling draws (``_get_sampling_generator()`` in the source
    read; None where it has none, as during warm-up, where the engine uses the global RNG)."""
    get = getattr(runner, "_get_sampling_generator", None)
    return get() if callable(get) else getattr(runner, "_sampling_generator", None)


def _compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled as the engine compiles the method it replaces, where that backend exists
    (torch_tpu registers it); eager elsewhere (tests stand the engine in with plain classes)."""
    import torch

    if COMPILE_BACKEND not in torch._dynamo.list_backends(exclude_tags=()):
        return fn
    return torch.compile(fn, backend=COMPILE_BACKEND, fullgraph=True, dynamic=False)


def _gather_logprobs_fp32(logprobs_tensors: type) -> Callable[..., Any]:
    def gather_logprobs(self: Any, logits: Any, sampled_tokens: Any) -> Any:
        ids, logprobs, ranks = fp32_gather_logprobs(
            logits, sampled_tokens, int(self.model_config.max_logprobs)
        )
        return logprobs_tensors(
            logprob_token_ids=ids, logprobs=logprobs, selected_token_ranks=ranks
        )

    return _compiled(gather_logprobs)


def _sample_with_fp32_noise(original: Callable[..., Any]) -> Callable[..., Any]:
    def sample_from_logits(
        self: Any,
        logits: Any,
        temperatures: Any,
        u: Any,
        top_k: Any,
        top_p: Any,
        all_greedy: bool = False,
    ) -> Any:
        # Plain Python around the engine's compiled method: the greedy path never reads ``u``
        # and keeps its graph; otherwise the noise is drawn again, in fp32.
        import torch

        if not all_greedy and u.dtype != torch.float32:
            u = fp32_uniform(u, _sampling_generator(self))
        return original(self, logits, temperatures, u, top_k, top_p, all_greedy=all_greedy)

    sample_from_logits.__wrapped__ = original  # type: ignore[attr-defined]
    return sample_from_logits


def _params(fn: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


@dataclass
class NumericsReport:
    """What :func:`apply` did in this process, for the engine's start-up line and stats."""

    engine: str  # "vllm-torchtpu" or "vllm"
    applied: list[str]
    refused: list[str]  # a target whose name or parameters differ from the source read

    def line(self) -> str:
        if self.engine != "vllm-torchtpu":
            return f"rollout numerics: {self.engine}, no patches (fp32 where vLLM computes it)"
        done = ", ".join(self.applied) or "none"
        bad = f"; NOT applied: {', '.join(self.refused)}" if self.refused else ""
        return f"rollout numerics: vllm-torchtpu, patched {done}{bad}"


_report: NumericsReport | None = None


def engine_present() -> bool:
    """Whether vllm-torchtpu is importable in this process (its worker is the engine's)."""
    return importlib.util.find_spec(ENGINE_MODULE) is not None


def apply() -> NumericsReport:
    """Install the fp32 replacements on vllm-torchtpu's runner class, once per process; nothing
    anywhere else. A target whose parameters differ from the ones read (a newer engine) is left
    alone and reported, not guessed at."""
    global _report
    if _report is not None:
        return _report
    if not engine_present():
        _report = NumericsReport("vllm", [], [])
        return _report
    from vllm.v1.outputs import LogprobsTensors

    report = NumericsReport("vllm-torchtpu", [], [])
    for patch in PATCHES:
        cls = getattr(importlib.import_module(patch.module), patch.cls)
        done: set[str] = getattr(cls, APPLIED_ATTR, set())
        original = getattr(cls, patch.method, None)
        if patch.name in done:
            report.applied.append(patch.name)
        elif original is None or _params(original) != patch.params:
            read_at = SOURCE["commit"][:8]
            report.refused.append(f"{patch.cls}.{patch.method} (not as read at {read_at})")
        else:
            if patch.method == "gather_logprobs":
                setattr(cls, patch.method, _gather_logprobs_fp32(LogprobsTensors))
            else:
                setattr(cls, patch.method, _sample_with_fp32_noise(original))
            setattr(cls, APPLIED_ATTR, done | {patch.name})
            report.applied.append(patch.name)
    print(report.line(), flush=True)
    _report = report
    return report


def runner_uses_patches(runner: Any) -> bool:
    """Whether a runner built before :func:`apply` would still sample with the old method:
    ``sample_from_logits_func`` is bound in its ``__init__``. True where there is nothing to
    check (no such attribute)."""
    bound = getattr(runner, "sample_from_logits_func", None)
    current = getattr(type(runner), "sample_from_logits", None)
    return bound is None or getattr(bound, "__func__", bound) is current
