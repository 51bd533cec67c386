"""The training loss without full-vocabulary logits: chunked, recomputed cross-entropy.

A causal LM's head turns each token's hidden state into one logit per vocabulary entry. For a
micro-batch of 4 x 2048 tokens and Qwen's 151,936 entries, fp32 logits are 4.6 GiB, and
autograd would keep them (and allocate their gradient) until backward. Here the head and the
fp32 cross-entropy run on :data:`~workloads.train.config.LOSS_CHUNK_TOKENS` tokens at a time,
each chunk under non-reentrant ``torch.utils.checkpoint``: forward keeps only the chunk's
summed loss, backward recomputes that chunk's logits, takes their gradient and drops both.
The sum over chunks is the same number as one cross-entropy over the whole micro-batch.

The loss runs *inside* the module's forward (the wrapped module returns the loss, not
logits): DDP only all-reduces gradients of a backward it has prepared in its own forward
(``Reducer.prepare_for_backward``), and FSDP2 gathers the root's parameters (embeddings, final
norm, head) in the root's pre-forward hook. A Hugging Face model therefore gets a forward of
its own (:func:`install_loss_forward`) that takes ``loss_labels=`` and returns the summed loss,
and behaves as before without it; the GPT presets take ``labels`` (workloads.train.models.gpt).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from workloads.train.config import LOSS_CHUNK_TOKENS
from workloads.train.inputs.batches import IGNORE

Head = Callable[[torch.Tensor], torch.Tensor]


def _chunk_loss(hidden: torch.Tensor, labels: torch.Tensor, head: Head) -> torch.Tensor:
    logits = head(hidden).float()
    return F.cross_entropy(logits, labels, ignore_index=IGNORE, reduction="sum")


def chunked_cross_entropy(
    hidden: torch.Tensor,
    labels: torch.Tensor,
    head: Head,
    chunk_tokens: int = LOSS_CHUNK_TOKENS,
) -> torch.Tensor:
    """Summed fp32 cross-entropy of ``head(hidden)`` against ``labels`` (``-100``: no target).

    ``hidden`` is ``[..., d]`` and ``labels`` the matching ``[...]``; no more than
    ``chunk_tokens`` tokens' logits exist at any time, in forward or backward.
    """
    flat = hidden.reshape(-1, hidden.shape[-1])
    targets = labels.reshape(-1)
    total: torch.Tensor | None = None
    for start in range(0, flat.shape[0], chunk_tokens):
        part = checkpoint(
            _chunk_loss,
            flat[start : start + chunk_tokens],
            targets[start : start + chunk_tokens],
            head,
            use_reentrant=False,
            preserve_rng_state=False,  # nothing random; saves a device RNG read per chunk
        )
        total = part if total is None else total + part
    assert total is not None, "a batch without tokens"
    return total


# ---- Hugging Face heads ---------------------------------------------------------------------

# What each family's ForCausalLM.forward does to the head's output before its loss, read in
# transformers 5.19's modeling files (e.g. models/gemma3/modeling_gemma3.py:632-636, softcap;
# models/cohere/modeling_cohere.py:495, times logit_scale; models/granite/modeling_granite.py:
# 486, divided by logits_scaling). Families not listed keep the full-logits loss (correct,
# but without the memory saving) until their forward has been read.
_PLAIN = ("llama", "mistral", "qwen2", "qwen3", "gemma")
_SOFTCAPPED = ("gemma2", "gemma3", "gemma3_text", "gemma4", "gemma4_text")
_SCALED = ("cohere", "cohere2")  # logits * model.logit_scale
_DIVIDED = ("granite",)  # logits / config.logits_scaling


def hf_head(model: nn.Module) -> Head | None:
    """The function from final hidden states to the logits ``model``'s forward returns, or
    None for a family whose head is not known here."""
    config: Any = model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    model_type = str(getattr(config, "model_type", ""))
    lm_head = model.get_output_embeddings()  # type: ignore[operator]
    if not isinstance(lm_head, nn.Module):
        return None
    if model_type in _PLAIN:
        return lm_head
    if model_type in _SOFTCAPPED:
        cap = getattr(text, "final_logit_softcapping", None)
        if cap is None:
            return lm_head
        cap = float(cap)

        def softcapped(hidden: torch.Tensor) -> torch.Tensor:
            return torch.tanh(lm_head(hidden) / cap) * cap

        return softcapped
    if model_type in _SCALED:
        scale = float(model.logit_scale)  # type: ignore[arg-type]
        return lambda hidden: lm_head(hidden) * scale
    if model_type in _DIVIDED:
        divisor = float(text.logits_scaling)
        return lambda hidden: lm_head(hidden) / divisor
    return None


def _base_model(model: nn.Module) -> nn.Module | None:
    """The decoder without the head (``model.model`` for the causal LMs here)."""
    base = getattr(model, "base_model", None)
    return base if isinstance(base, nn.Module) and base is not model else None


def hf_loss(
    model: nn.Module,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    chunk_tokens: int = LOSS_CHUNK_TOKENS,
) -> torch.Tensor:
    """Summed cross-entropy of a Hugging Face causal LM (call it from inside its forward)."""
    head, base = hf_head(model), _base_model(model)
    if head is None or base is None:  # a head not read here: the model's own logits
        out = type(model).forward(
            model, input_ids=input_ids, position_ids=position_ids, use_cache=False
        )
        return _chunk_loss(out.logits.flatten(0, 1), labels.flatten(), lambda x: x)
    out = base(input_ids=input_ids, position_ids=position_ids, use_cache=False)
    return chunked_cross_entropy(out.last_hidden_state, labels, head, chunk_tokens)


def install_loss_forward(model: nn.Module, chunk_tokens: int = LOSS_CHUNK_TOKENS) -> None:
    """Give ``model`` (this instance) a forward that returns the summed loss when called with
    ``loss_labels=``, so that DDP's and FSDP2's wrappers see the whole step in one forward.
    Without ``loss_labels`` it is the class's forward; parameters and state-dict keys are
    unchanged."""

    def forward(self: nn.Module, *args: Any, loss_labels: Any = None, **kwargs: Any) -> Any:
        if loss_labels is None:
            return type(self).forward(self, *args, **kwargs)
        return hf_loss(
            self,
            kwargs["input_ids"],
            loss_labels,
            kwargs.get("position_ids"),
            chunk_tokens=chunk_tokens,
        )

    model.forward = types.MethodType(forward, model)
