"""Which Hugging Face checkpoints the trainer trains: one rule set for the worker and preview.

The worker (``workloads.train.models.hf.load_source``) asks it of the ``config.json`` it downloaded;
preview (``infra.rules.workloads``) asks it of the same facts read from the hub, a folder or the
catalogue. Both print the same reason, so a model preview accepts is one the worker trains.
Torch-free and transformers-free: infra imports it.

What the trainer can train follows from how it loads and exports (``hf.py``): it builds the
model with ``AutoModelForCausalLM.from_config``, reads the checkpoint's tensors as state-dict
keys through DCP's safetensors reader, and writes them back the same way. So:

- dense causal LMs whose checkpoint keys are their state-dict keys (transformers converts none
  of them on load; a test holds this against the installed ``transformers.conversion_mapping``);
- the text model of a multimodal checkpoint whose text model is such a causal LM and whose
  weights sit under one prefix (Gemma 3, Gemma 4): the trainer builds ``text_config``'s causal
  LM, reads the prefixed tensors, and exports a text-only checkpoint of that class;
- no mixture of experts: transformers fuses expert weights on load (Mixtral, Qwen-MoE,
  DeepSeek), which the key-for-key loader and exporter cannot follow, and the trainer's FSDP2
  sharding and preview's memory model have no expert parallelism (Gemma 4's MoE too).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

KEY = "park:training.model"
# Every refusal says this, so tools and tests can tell the rule's refusals from other problems.
REFUSED = "the trainer does not train it"

# Dense causal LMs, by config.json's architectures[0], with the model_type that names each
# when a config.json leaves `architectures` out (a config saved from a config class).
CAUSAL_LMS: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma4_text": "Gemma4ForCausalLM",
}


@dataclass(frozen=True)
class WeightLayout:
    """Where a causal LM's tensors sit in a checkpoint: ``model.X`` at ``body + X``, every
    other key (``lm_head.weight``) at ``head + key``."""

    body: str
    head: str

    def checkpoint_key(self, key: str) -> str:
        if key.startswith("model."):
            return self.body + key.removeprefix("model.")
        return self.head + key


AS_IS = WeightLayout("model.", "")
# The text model inside a multimodal checkpoint: transformers 4's layout (the hub's Gemma 3
# files; transformers 5 writes Gemma 3 back in it), and transformers 5's own (Gemma 4).
LEGACY_MULTIMODAL = WeightLayout("language_model.model.", "language_model.")
MULTIMODAL = WeightLayout("model.language_model.", "")
LAYOUTS = (AS_IS, LEGACY_MULTIMODAL, MULTIMODAL)


def layout_of(keys: set[str], available: set[str]) -> WeightLayout:
    """Where a model's state-dict ``keys`` sit among a checkpoint's tensor names: as they are,
    or under a multimodal checkpoint's text-model prefix (the layout that finds the most)."""
    return max(LAYOUTS, key=lambda layout: sum(layout.checkpoint_key(k) in available for k in keys))


# Multimodal checkpoints whose text model the trainer trains (and exports, text only): the
# causal LM class of their text_config.
MULTIMODAL_TEXT_MODELS: dict[str, str] = {
    "Gemma3ForConditionalGeneration": "Gemma3ForCausalLM",
    "Gemma4ForConditionalGeneration": "Gemma4ForCausalLM",
}
MULTIMODAL_TYPES = {
    "gemma3": "Gemma3ForConditionalGeneration",
    "gemma4": "Gemma4ForConditionalGeneration",
}
# Where config.json files keep the routed-expert count (model_facts reads the same keys).
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


@dataclass(frozen=True)
class ModelTraits:
    """What the rule needs of a model: the worker reads them from config.json, preview from
    the model's facts (infra.model_facts, which reads the same file or the catalogue)."""

    architecture: str  # config.json's architectures[0] ("" when absent)
    model_type: str = ""
    experts: int = 0  # routed experts (0: dense)
    multimodal: bool = False  # config.json has a text_config

    @property
    def name(self) -> str:
        """The architecture, or the one its model_type names when config.json has none."""
        if self.architecture:
            return self.architecture
        return CAUSAL_LMS.get(self.model_type) or MULTIMODAL_TYPES.get(self.model_type, "")


def traits_of_config(config: Mapping[str, Any]) -> ModelTraits:
    """The traits of a config.json's contents (the text_config's experts for multimodal ones)."""
    text = config.get("text_config")
    text = text if isinstance(text, Mapping) else {}
    experts = 0
    for key in EXPERT_KEYS:
        value = text.get(key) if text.get(key) is not None else config.get(key)
        if value:
            experts = int(value)
            break
    architectures = config.get("architectures") or []
    return ModelTraits(
        architecture=str(architectures[0]) if architectures else "",
        model_type=str(config.get("model_type") or ""),
        experts=experts,
        multimodal="text_config" in config,
    )


def allowed() -> str:
    """What the trainer takes, for the messages."""
    return (
        f"dense causal LMs ({', '.join(CAUSAL_LMS.values())}) and the text model of "
        f"{', '.join(MULTIMODAL_TEXT_MODELS)} checkpoints"
    )


def refusal(traits: ModelTraits) -> str | None:
    """Why the trainer cannot train this model (None: it can). Worker and preview print this."""
    name = traits.name or (
        f"model_type {traits.model_type}" if traits.model_type else "a config without architectures"
    )
    if traits.experts:
        return (
            f"{name} is a mixture of experts ({traits.experts} routed experts): {REFUSED} "
            "(transformers fuses most MoE checkpoints' experts on load, which its key-for-key "
            "loader and exporter cannot follow, and its FSDP2 sharding and memory model have "
            f"no expert parallelism); allowed: {allowed()}"
        )
    if name in CAUSAL_LMS.values() or name in MULTIMODAL_TEXT_MODELS:
        return None
    if traits.multimodal:
        return (
            f"{name} is a multimodal checkpoint whose text model {REFUSED} (it extracts the "
            f"text model of {', '.join(MULTIMODAL_TEXT_MODELS)} only); train a text-only "
            f"checkpoint of its family instead; allowed: {allowed()}"
        )
    return f"{name}: {REFUSED}; allowed: {allowed()}"


def trained_architecture(traits: ModelTraits) -> str:
    """The transformers class the trainer builds and exports (a refused model: "")."""
    if refusal(traits) is not None:
        return ""
    return MULTIMODAL_TEXT_MODELS.get(traits.name, traits.name)
