"""What a served model is, known before anything is deployed: heads, layers, sizes, context.

The pure half: the facts themselves, read from a config.json's contents (and a safetensors
index or header, handed in as a reader), from the committed catalogue
(infra/data/models/catalogue.yaml, every entry with its source) or from the trainer's built-in
model. Where the files come from — a local folder, a `gs://` path, the Hugging Face hub, each
bounded in time — is infra.model_lookup's.

A config.json is read the way vLLM reads it (vllm/transformers_utils/model_arch_config_
convertor.py in vLLM 0.29): an explicit `head_dim` wins over hidden_size / heads; KV heads from
num_key_value_heads (or its aliases); a multimodal model's text_config. With transformers
installed its config class fills the defaults a config.json leaves out (Gemma 3's text_config).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from infra import datafile

DATA = Path(__file__).parent / "data"
CATALOGUE = DATA / "models" / "catalogue.yaml"
ARCHITECTURES = DATA / "vllm_architectures.yaml"
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1, "float8_e4m3fn": 1}
_KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


# Past these a config.json is not a real model (the largest today have ~100-200 layers and a
# hidden size of ~20,000): the planner walks layers, so these bound its work too.
MAX_LAYERS = 10_000
MAX_HIDDEN = 1 << 20
MAX_VOCAB = 1 << 24


class FactsError(ValueError):
    """A model source whose facts cannot be read (a folder without config.json, bad JSON)."""


@dataclass(frozen=True)
class ModelFacts:
    """The architecture facts the serving checks need, and where they were read."""

    architecture: str
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    dtype: str
    params: int | None  # total stored parameters; None when not known
    source: str  # where these facts come from
    active_params: int | None = None  # MoE: parameters used per token
    experts: int = 0  # MoE: routed experts (0: dense)
    experts_per_token: int = 0
    sliding_window: int | None = None
    sliding_layers: int = 0  # layers that only attend `sliding_window` tokens back
    global_kv_heads: int | None = None  # Gemma 4: full-attention layers' own KV heads
    global_head_dim: int | None = None
    mla_kv_dim: int | None = None  # MLA (DeepSeek): kv_lora_rank + qk_rope_head_dim per token
    gated: bool = False  # the hub needs a token to download it
    multimodal: bool = False
    params_estimated: bool = False  # params computed from the shapes, not read
    model_type: str = ""  # config.json's own (a multimodal model's outer one): the training rule's
    intermediate_size: int | None = None  # dense MLP width (the training memory model's)
    # Serving's memory model (infra.engine, infra.kv_cache):
    moe_intermediate_size: int | None = None  # one routed expert's MLP width
    expert_params: int = 0  # every routed expert of every MoE layer (expert parallel places them)
    kv_shared_layers: int = 0  # Gemma 3n/4: the last layers reuse earlier layers' KV, hold none
    layer_types: tuple[str, ...] = ()  # "sliding" / "full" per layer, when the config says

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES.get(self.dtype, 2)


@dataclass(frozen=True)
class FactsLookup:
    """The outcome of a lookup: the facts, or why none were found (and what was tried).

    `error`: the source exists but is broken (a folder without config.json, bad JSON): a
    config problem. No facts and no error: unknown here (offline, say), a warning."""

    facts: ModelFacts | None
    tried: tuple[str, ...] = ()
    reason: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    error: str | None = None


def weights_bytes(facts: ModelFacts | None) -> int | None:
    """Stored weights: parameters at the checkpoint's dtype; None when the size is not known
    (the disk plan and the host memory plan size copies of them)."""
    if facts is None or facts.params is None:
        return None
    return facts.params * facts.dtype_bytes


# ---- config.json ----------------------------------------------------------------------------

# A model folder's file by name: its bytes (the first `limit` when given), or None when absent.
Reader = Callable[..., bytes | None]


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's config, with transformers' defaults when it is installed."""
    text = config.get("text_config")
    merged = {**config, **text} if isinstance(text, dict) else dict(config)
    model_type = (text or {}).get("model_type") if isinstance(text, dict) else None
    model_type = model_type or config.get("model_type")
    try:
        from transformers import CONFIG_MAPPING

        built = CONFIG_MAPPING[str(config.get("model_type"))](
            **{k: v for k, v in config.items() if k != "model_type"}
        )
        text_obj = built.get_text_config()
        defaults = text_obj.to_dict()
        return {
            **defaults,
            **(text if isinstance(text, dict) else config),
            "model_type": model_type,
        }
    except Exception:  # transformers absent, or a model type it does not know: the file as is
        return merged


def _first(config: dict[str, Any], keys: tuple[str, ...], default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return default


def _estimate_params(text: dict[str, Any], experts: int) -> int:
    """Parameters from the shapes of a decoder (when no size was read): embeddings, attention,
    MLP (or experts), norms; good to a few percent for Llama-like models."""
    hidden = int(text["hidden_size"])
    layers = int(text["num_hidden_layers"])
    heads = int(text["num_attention_heads"])
    kv = int(_first(text, _KV_HEAD_KEYS, heads))
    head_dim = int(text.get("head_dim") or hidden // heads)
    vocab = int(text["vocab_size"])
    inter = int(text.get("moe_intermediate_size") or text.get("intermediate_size") or 4 * hidden)
    attention = hidden * head_dim * (heads + 2 * kv) + heads * head_dim * hidden
    mlp = 3 * hidden * inter * max(experts, 1) + (hidden * experts if experts else 0)
    embeddings = vocab * hidden * (1 if text.get("tie_word_embeddings") else 2)
    return layers * (attention + mlp + 2 * hidden) + embeddings + hidden


def facts_from_config(
    config: dict[str, Any], source: str, *, params: int | None = None, gated: bool = False
) -> ModelFacts:
    """ModelFacts from a config.json's contents; raises FactsError naming a missing field."""
    text = _text_config(config)
    architectures = config.get("architectures") or []
    try:
        heads = int(text["num_attention_heads"])
        hidden = int(text["hidden_size"])
        layers = int(text["num_hidden_layers"])
        vocab = int(text["vocab_size"])
    except (KeyError, TypeError, ValueError) as err:
        raise FactsError(f"{source}: config.json lacks {err} (not a decoder LM config?)") from None
    if not (
        1 <= layers <= MAX_LAYERS and 1 <= heads <= hidden <= MAX_HIDDEN and 1 <= vocab <= MAX_VOCAB
    ):
        # read from a bucket or a folder anyone may write: the planner loops over layers
        raise FactsError(
            f"{source}: config.json says {layers} layers, {heads} heads, hidden size {hidden}, "
            f"vocabulary {vocab}: not a model park can plan (at most {MAX_LAYERS} layers, "
            f"hidden {MAX_HIDDEN}, vocabulary {MAX_VOCAB})"
        )
    mla = None
    head_dim = int(text.get("head_dim") or hidden // heads)
    if text.get("kv_lora_rank"):
        # MLA: the KV cache holds one latent per token (vLLM: kv_lora_rank + qk_rope_head_dim);
        # the query/key head is qk_nope + qk_rope wide
        mla = int(text["kv_lora_rank"]) + int(text.get("qk_rope_head_dim") or 0)
        head_dim = int(text.get("qk_nope_head_dim") or 0) + int(text.get("qk_rope_head_dim") or 0)
    experts = int(_first(text, _EXPERT_KEYS, 0) or 0)
    window = text.get("sliding_window") if text.get("use_sliding_window", True) else None
    layer_types = text.get("layer_types") or []
    sliding = sum(1 for t in layer_types if "sliding" in str(t))
    if window and not layer_types:
        pattern = int(text.get("sliding_window_pattern") or 0)
        sliding = layers - layers // pattern if pattern else layers
    estimated = params is None
    if params is None:
        params = _estimate_params(text, experts)
    dtype = str(config.get("torch_dtype") or config.get("dtype") or text.get("torch_dtype") or "")
    return ModelFacts(
        architecture=str(architectures[0]) if architectures else "",
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=int(_first(text, _KV_HEAD_KEYS, heads)),
        head_dim=head_dim,
        vocab_size=vocab,
        max_positions=int(text.get("max_position_embeddings") or 0),
        dtype=dtype or "bfloat16",
        params=params,
        source=source,
        experts=experts,
        experts_per_token=int(_first(text, ("num_experts_per_tok", "top_k_experts"), 0) or 0),
        sliding_window=int(window) if window else None,
        sliding_layers=sliding if window else 0,
        # Gemma 4: full-attention layers' own KV heads apply with attention_k_eq_v only
        # (transformers' Gemma4TextConfig; an absent flag counts as set)
        global_kv_heads=text.get("num_global_key_value_heads")
        if text.get("attention_k_eq_v", True)
        else None,
        global_head_dim=text.get("global_head_dim"),
        mla_kv_dim=mla,
        gated=gated,
        multimodal="text_config" in config,
        model_type=str(config.get("model_type") or ""),
        params_estimated=estimated,
        intermediate_size=int(text["intermediate_size"]) if text.get("intermediate_size") else None,
        **_serving_fields(text, experts, layers, hidden),
    )


def _serving_fields(text: dict[str, Any], experts: int, layers: int, hidden: int) -> dict[str, Any]:
    """What serving's memory model reads beyond the basics, from a (text) config the way vLLM's
    model classes read it: KV-shared layers (vllm/model_executor/
    models/gemma4.py: the last num_kv_shared_layers hold no cache), which layers route experts
    (Qwen MoE: mlp_only_layers, decoder_sparse_step; DeepSeek: first_k_dense_replace,
    moe_layer_freq) and their size (gate, up and down projections of each expert)."""
    expert_width = int(
        text.get("moe_intermediate_size")
        or text.get("expert_intermediate_size")
        or text.get("intermediate_size")
        or 0
    )
    dense = set(text.get("mlp_only_layers") or [])
    first = int(text.get("first_k_dense_replace") or 0)
    step = int(text.get("decoder_sparse_step") or 1)
    freq = int(text.get("moe_layer_freq") or 1)
    moe_layers = sum(
        1
        for i in range(layers)
        if experts and i >= first and i not in dense and (i + 1) % step == 0 and i % freq == 0
    )
    pattern = int(text.get("sliding_window_pattern") or 0)
    raw = text.get("layer_types") or (
        [("sliding" if (i + 1) % pattern else "full") for i in range(layers)]  # Gemma's rule
        if text.get("sliding_window") and pattern
        else ()
    )
    types = tuple("sliding" if "sliding" in str(t) else "full" for t in raw)
    fields: dict[str, Any] = {
        "moe_intermediate_size": expert_width if experts else None,
        "expert_params": moe_layers * experts * 3 * hidden * expert_width,
        "kv_shared_layers": int(text.get("num_kv_shared_layers") or 0),
        "layer_types": types if len(types) == layers else (),
    }
    return fields


def _safetensors_params(read: Reader, dtype_bytes: int) -> int | None:
    """Parameters from a folder's safetensors index (total_size) or single file header."""
    index = read("model.safetensors.index.json")
    if index is not None:
        total = json.loads(index).get("metadata", {}).get("total_size")
        return int(total) // dtype_bytes if total else None
    header = read("model.safetensors", limit=8)
    if header is None or len(header) < 8:
        return None
    (length,) = struct.unpack("<Q", header[:8])
    blob = read("model.safetensors", limit=8 + length)
    if blob is None:
        return None
    tensors = json.loads(blob[8:])
    count = 0
    for name, info in tensors.items():
        if name == "__metadata__":
            continue
        elements = 1
        for dim in info.get("shape", []):
            elements *= int(dim)
        count += elements
    return count


def from_reader(read: Reader, source: str) -> ModelFacts:
    """ModelFacts of a model folder seen through `read` (its config.json, and the safetensors
    index or header for the size); raises FactsError when config.json is missing or broken."""
    raw = read("config.json")
    if raw is None:
        raise FactsError(f"{source}: no config.json there (is it a Hugging Face model folder?)")
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as err:
        raise FactsError(f"{source}/config.json: not JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(config, dict):
        raise FactsError(f"{source}/config.json: not a JSON object")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    params = _safetensors_params(read, DTYPE_BYTES.get(dtype, 2))
    return facts_from_config(config, source, params=params)


# ---- the catalogue --------------------------------------------------------------------------


@cache
def _catalogue() -> dict[str, dict[str, Any]]:
    data: dict[str, Any] = datafile.load(CATALOGUE)
    entries: dict[str, dict[str, Any]] = {}
    for repo, entry in data["models"].items():
        entries[repo] = entry
        for alias in entry.get("aliases") or []:
            override = (entry.get("alias_overrides") or {}).get(alias) or {}
            overrides = {
                "max_positions": override.get("max_position_embeddings", entry.get("max_positions"))
            }
            entries[alias] = {**entry, **overrides, "_alias_of": repo}
    return entries


def catalogued() -> list[str]:
    """Every model id the catalogue knows (aliases included)."""
    return sorted(_catalogue())


def from_catalogue(repo: str) -> ModelFacts | None:
    entry = _catalogue().get(repo)
    if entry is None:
        return None
    mla = entry.get("mla") or {}
    window = entry.get("sliding_window")
    pattern = int(entry.get("sliding_window_pattern") or 0)
    layers = int(entry["layers"])
    return ModelFacts(
        architecture=str(entry["architecture"]),
        layers=layers,
        hidden_size=int(entry["hidden_size"]),
        attention_heads=int(entry["attention_heads"]),
        kv_heads=int(entry["kv_heads"]),
        head_dim=int(entry["head_dim"]),
        vocab_size=int(entry["vocab_size"]),
        max_positions=int(entry["max_positions"]),
        dtype=str(entry.get("dtype", "bfloat16")),
        params=int(entry["params"]),
        active_params=entry.get("active_params"),
        source=f"catalogue: {entry.get('hf_config') or repo} (read from {entry['config_source']})",
        experts=int(entry.get("experts") or 0),
        experts_per_token=int(entry.get("experts_per_token") or 0),
        sliding_window=int(window) if window else None,
        sliding_layers=(layers - layers // pattern) if window and pattern else 0,
        global_kv_heads=entry.get("global_kv_heads"),
        global_head_dim=entry.get("global_head_dim"),
        mla_kv_dim=(int(mla["kv_lora_rank"]) + int(mla.get("qk_rope_head_dim", 0)))
        if mla
        else None,
        gated=bool(entry.get("gated")),
        multimodal=bool(entry.get("multimodal")),
        model_type=str(entry.get("model_type") or ""),
        intermediate_size=_catalogued_intermediate(entry.get("_alias_of") or repo),
        **_catalogued_serving(entry.get("_alias_of") or repo, entry),
    )


def _catalogued_serving(repo: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Serving's fields (_serving_fields) from the committed config.json of a catalogued model;
    the catalogue's sliding_window_pattern stands in for transformers' default layer_types."""
    config = (_catalogued_configs().get(repo) or {}).get("config") or {}
    text = dict(config.get("text_config") or config)
    if entry.get("sliding_window_pattern") and not text.get("layer_types"):
        text["sliding_window_pattern"] = entry["sliding_window_pattern"]
        text["sliding_window"] = entry.get("sliding_window")
    return _serving_fields(
        text, int(entry.get("experts") or 0), int(entry["layers"]), int(entry["hidden_size"])
    )


def _catalogued_configs() -> dict[str, Any]:
    configs: dict[str, Any] = datafile.load(DATA / "models" / "configs.json")["models"]
    return configs


def _catalogued_intermediate(repo: str) -> int | None:
    """The MLP width from the committed config.json of a catalogued model (configs.json)."""
    config = (_catalogued_configs().get(repo) or {}).get("config") or {}
    text = config.get("text_config") or config
    value = text.get("intermediate_size")
    return int(value) if value else None


@cache
def served_architectures() -> frozenset[str]:
    """What the pinned vLLM registers (infra/data/vllm_architectures.yaml)."""
    data = datafile.load(ARCHITECTURES)
    return frozenset(
        [*data["text_generation"]["architectures"], *data["multimodal"]["architectures"]]
    )


# ---- model ids ----------------------------------------------------------------------------------


def is_hub_id(source: str) -> bool:
    """`org/name` as the hub spells repositories (not a path, not a URI)."""
    return source.count("/") == 1 and "://" not in source and not source.startswith(("/", ".", "~"))


BUILTIN_PREFIX = "park:"  # models the trainer builds itself (workloads/train/models/tiny_llama.py)


def builtin(source: str) -> FactsLookup:
    """A model the trainer builds on the worker: its facts from the spec it builds it from."""
    from workloads.train.models import tiny_llama

    tried = (f"the trainer's built-in {source}",)
    if source != f"{BUILTIN_PREFIX}{tiny_llama.NAME}":
        reason = f"{source}: no such built-in model; allowed: {BUILTIN_PREFIX}{tiny_llama.NAME}"
        return FactsLookup(None, tried, reason, error=reason)
    config = {
        **{k: v for k, v in tiny_llama.SPEC.items() if k != "version"},
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": "float32",
        "tie_word_embeddings": True,
    }
    return FactsLookup(facts_from_config(config, source=source), tried)
