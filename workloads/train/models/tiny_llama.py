"""``--model park:tiny-llama``: a Llama-architecture config and a tokenizer, built on the worker.

Pretraining from scratch needs no download: the worker trains a byte-level BPE tokenizer with
``tokenizers`` (on the facts corpus and some English, so the facts are a few tokens each and
any text still encodes), writes a ``LlamaConfig`` sized by ``SPEC`` and a generation config,
and the trainer initializes the weights (``--init config``). The folder is what
``from_pretrained`` reads minus the weights, so the export of a trained run is a complete model
folder that transformers and vLLM load (``LlamaForCausalLM``, a chat template, head_dim 64,
which vLLM's CPU attention supports).

Built once per node under the cache, keyed by a hash of ``SPEC``, the template and the corpus;
a changed spec builds a new folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workloads import local_models
from workloads.train import storage
from workloads.train.inputs import facts

NAME = "tiny-llama"

# Everything that shapes the model; a change gives a new cache key.
SPEC: dict[str, Any] = {
    "version": 1,
    "vocab_size": 1024,  # the BPE's target; the config takes the tokenizer's real size
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,  # head_dim 64
    "num_key_value_heads": 1,
    "max_position_embeddings": 512,
    "rope_theta": 10000.0,
}

# The chat template and special tokens are the serving side's too (workloads/local_models.py).
CHAT_TEMPLATE = local_models.CHAT_TEMPLATE

_ENGLISH_TEXT = (
    "the a an of to in is are was what which who where when how why capital language spoken "
    "people speak city country river name answer question please tell me about and or not "
    "one two three four five hello world model train data this that it be can will"
)
_ENGLISH = _ENGLISH_TEXT.split()


def _tokenizer_corpus() -> list[str]:
    """Text the BPE learns its merges from: the facts (as chats and sentences), English words,
    and every printable ASCII character (the byte alphabet covers the rest)."""
    lines = []
    for record in facts.records():
        lines.append(record["text"])
        for message in record["messages"]:
            lines.append(message["content"])
    lines += [" ".join(_ENGLISH[i : i + 8]) for i in range(0, len(_ENGLISH), 8)] * 4
    lines.append("".join(chr(c) for c in range(32, 127)))
    return lines


def spec_key() -> str:
    blob = json.dumps(
        {"spec": SPEC, "template": CHAT_TEMPLATE, "corpus": _tokenizer_corpus()}, sort_keys=True
    )
    return storage.key_of(blob)


def _build(out: Path) -> None:
    tok = local_models.train_tokenizer(_tokenizer_corpus(), SPEC["vocab_size"], out)
    rope = {"rope_type": "default", "rope_theta": SPEC["rope_theta"]}
    local_models.llama_config(SPEC, tok, rope_parameters=rope).save_pretrained(out)
    local_models.save_generation_config(tok, out)


def build(root: Path | None = None) -> Path:
    """The folder of ``park:tiny-llama`` (config, tokenizer, generation config; no weights),
    built under ``root`` or the cache if it is not there yet. Safe to call from every worker
    of a node at once: one builds, under a lock, into a temporary folder renamed into place."""
    target = Path(root) if root else storage.cache_dir() / "models" / f"{NAME}-{spec_key()}"
    if (target / "config.json").exists():
        return target
    with storage.node_lock(f"build-{target.name}"):
        if (target / "config.json").exists():
            return target
        with local_models.built_in_place(target) as staging:
            _build(staging)
    return target
