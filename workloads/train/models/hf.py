"""Hugging Face causal LMs in the trainer: find the files, read the config and tokenizer.

A model comes from ``--model``: a hub id (downloaded with ``huggingface_hub``, which reads the
token from ``HF_TOKEN`` or the file at ``HF_TOKEN_PATH``; pods get the latter at
``/var/run/secrets/huggingface/token``), a ``gs://`` folder (mirrored once per node), a local
folder, or ``park:tiny-llama`` (built on the worker). Which models train is
``workloads.train.models.model_rules`` (preview asks the same rule): the dense causal LMs whose
checkpoint keys are their state-dict keys (Llama, Qwen2/Qwen3, Mistral, Gemma 1-4), and the
text model of a Gemma 3 or Gemma 4 multimodal checkpoint, built from its ``text_config``, read
from under its prefix and exported as a text-only checkpoint of that causal LM. Mixtures of
experts are refused: transformers fuses their experts on load, and the sharded loader
(hf_build.py) and the exporter read and write the keys as they are.

Building the model and filling it with weights is workloads/train/models/hf_build.py; its names are
importable from here too.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workloads.train import storage
from workloads.train.config import DEFAULT_HF_SEQ_LEN, TrainConfig
from workloads.train.config_rules import BUILTIN_PREFIX
from workloads.train.models import model_rules, tiny_llama
from workloads.train.models.hf_build import (
    ModelError,
    architecture_of,
    block_modules,
    checkpoint_keys,
    count_params,
    init_buffers,
    init_from_config,
    load_pretrained,
    meta_model,
    retie,
    tie_groups,
    tied_export_keys,
    train_flops_per_token,
)

# The building and filling live in hf_build.py; their names stay importable here.
__all__ = [
    "HF_TOKEN_HINT",
    "HUB_IGNORE",
    "SIDE_FILES",
    "HFSource",
    "ModelError",
    "architecture_of",
    "block_modules",
    "checkpoint_keys",
    "count_params",
    "init_buffers",
    "init_from_config",
    "load_pretrained",
    "load_source",
    "meta_model",
    "refusal_message",
    "resolve_folder",
    "retie",
    "seq_len_for",
    "tie_groups",
    "tied_export_keys",
    "train_flops_per_token",
    "trained_config",
]

# What a model folder needs besides weights; a gs:// folder is mirrored with these only.
SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
)
HUB_IGNORE = [
    "*.bin",
    "*.pt",
    "*.pth",
    "*.msgpack",
    "*.h5",
    "*.onnx",
    "original/*",
    "consolidated*",
]
HF_TOKEN_HINT = (
    "a gated or private model needs a token: HF_TOKEN, or a file at HF_TOKEN_PATH "
    "(pods get /var/run/secrets/huggingface/token)"
)


# ---- finding the files ------------------------------------------------------------------------


def resolve_folder(source: str, *, weights: bool, flag_name: str = "--model") -> Path:
    """A local folder holding ``source``'s files (weights only when ``weights``)."""
    if source.startswith(BUILTIN_PREFIX):
        return tiny_llama.build()
    if "://" in source:  # gs:// (or file://, which the tests use for it)
        try:
            return storage.mirror(source, keep=lambda name: _wanted(name, weights))
        except FileNotFoundError as err:
            raise ModelError(f"{flag_name} {source}: no such folder") from err
    local = Path(os.path.expanduser(source))
    if local.is_dir():
        return local
    if source.startswith(("/", ".", "~")) or source.count("/") > 1:
        raise ModelError(
            f"{flag_name} {source!r}: not a folder here, nor a hub id (org/name or name)"
        )
    return _download(source, weights=weights, flag_name=flag_name)


def _wanted(name: str, weights: bool) -> bool:
    return name in SIDE_FILES or (weights and name.endswith(".safetensors"))


def _download(repo_id: str, *, weights: bool, flag_name: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    patterns = [*SIDE_FILES, *(["*.safetensors"] if weights else [])]
    try:
        path = snapshot_download(
            repo_id,
            allow_patterns=patterns,
            ignore_patterns=HUB_IGNORE,
            cache_dir=str(storage.cache_dir() / "hub"),
        )
    except (GatedRepoError, RepositoryNotFoundError) as err:
        raise ModelError(f"{flag_name} {repo_id}: the hub refused it; {HF_TOKEN_HINT}") from err
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        raise ModelError(
            f"{flag_name} {repo_id}: could not download it from the Hugging Face hub ({err}); "
            f"offline, give a local folder or gs:// instead; {HF_TOKEN_HINT}"
        ) from err
    return Path(path)


# ---- what a run trains --------------------------------------------------------------------------


@dataclass
class HFSource:
    """The files and objects of ``--model`` / ``--tokenizer``, resolved on a worker."""

    spec: str
    folder: Path
    config: Any  # transformers.PretrainedConfig
    tokenizer: Any  # transformers.PreTrainedTokenizerBase
    tokenizer_folder: Path
    init: str  # "pretrained" | "config"

    @property
    def architecture(self) -> str:
        names = getattr(self.config, "architectures", None) or []
        return (
            str(names[0]) if names else type(self.config).__name__.replace("Config", "ForCausalLM")
        )


def load_source(cfg: TrainConfig) -> HFSource:
    """Resolve ``--model`` and ``--tokenizer`` to local files and load config and tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    assert cfg.model is not None
    init = cfg.init_mode
    folder = resolve_folder(cfg.model, weights=init == "pretrained")
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as err:
        raise ModelError(f"--model {cfg.model}: no usable config.json in {folder}: {err}") from err
    config = trained_config(config, _raw_config(folder), cfg.model)
    tokenizer_folder = (
        resolve_folder(cfg.tokenizer, weights=False, flag_name="--tokenizer")
        if cfg.tokenizer
        else folder
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    except (OSError, ValueError) as err:
        flag_name = "--tokenizer" if cfg.tokenizer else "--model"
        raise ModelError(f"{flag_name}: no tokenizer in {tokenizer_folder}: {err}") from err
    _check_convertible(config, cfg.model)
    if init == "pretrained" and not any(folder.glob("*.safetensors")):
        raise ModelError(
            f"--model {cfg.model}: no safetensors weights in {folder} (the trainer reads "
            "safetensors only); use --init config to start from random weights"
        )
    if len(tokenizer) > config.vocab_size:
        raise ModelError(
            f"--tokenizer has {len(tokenizer)} tokens but the model's vocabulary is "
            f"{config.vocab_size}"
        )
    return HFSource(cfg.model, folder, config, tokenizer, tokenizer_folder, init)


def _raw_config(folder: Path) -> dict[str, Any]:
    """config.json as written: what preview's model facts read too (transformers' config
    objects add defaults the file does not have)."""
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def refusal_message(spec: str, reason: str) -> str:
    """A model_rules refusal as the worker says it: the flag, the stack key, the rule's words."""
    return f"--model {spec} ({model_rules.KEY}): {reason}"


def trained_config(config: Any, raw: dict[str, Any], spec: str) -> Any:
    """The config of the causal LM the trainer builds: the model's own, or a multimodal
    checkpoint's text_config (its architecture the text causal LM, which the export names)."""
    traits = model_rules.traits_of_config(raw or config.to_dict())
    reason = model_rules.refusal(traits)
    if reason is not None:
        raise ModelError(refusal_message(spec, reason))
    text = config.get_text_config(decoder=True)
    text = copy.deepcopy(text) if text is not config else config
    text.architectures = [model_rules.trained_architecture(traits)]
    return text


def _check_convertible(config: Any, spec: str) -> None:
    """A belt to model_rules: a model_type transformers converts on load would be loaded and
    exported wrong (a test holds every allowed family against transformers' own table)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # transformers 4: no load-time conversions
        return
    model_type = getattr(config, "model_type", "")
    if get_checkpoint_conversion_mapping(model_type):
        raise ModelError(
            refusal_message(
                spec,
                f"transformers converts {model_type} checkpoints on load; "
                f"{model_rules.REFUSED}; allowed: {model_rules.allowed()}",
            )
        )


def seq_len_for(cfg: TrainConfig, config: Any) -> int:
    """``--seq-len``, or the default capped at what the model has positions for."""
    limit = int(getattr(config, "max_position_embeddings", DEFAULT_HF_SEQ_LEN) or 0)
    if cfg.seq_len is not None:
        if limit and cfg.seq_len > limit:
            raise ModelError(
                f"--seq-len {cfg.seq_len} is beyond the model's max_position_embeddings ({limit})"
            )
        return cfg.seq_len
    return min(DEFAULT_HF_SEQ_LEN, limit) if limit else DEFAULT_HF_SEQ_LEN
