"""A tiny Llama-architecture model built on this machine, for serving on CPU without a hub.

Random weights, a byte-level BPE tokenizer trained here with ``tokenizers`` and a chat template:
enough for vLLM to load it and for the OpenAI endpoints to answer (the text is gibberish). The
build is deterministic and cached; a changed spec (``SPEC``) rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from workloads import local_models

SERVED_NAME = "tiny-llama"

# Everything that shapes the model. A change here changes the cache key and forces a rebuild.
SPEC: dict[str, Any] = {
    "version": 2,
    "seed": 0,
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
}

# Chat template and special tokens: training's tiny Llama's too (workloads/local_models.py).
CHAT_TEMPLATE = local_models.CHAT_TEMPLATE

_WORDS_TEXT = (
    "the a model serves tokens on a chip slice host ray serve cluster request reply stream "
    "prompt answer fast slow cloud tpu node pod engine cache memory batch queue replica "
    "hello world what is how why when where who can will should data train test one two "
    "three four five red green blue sky sea tree stone river city road light dark time"
)
_WORDS = _WORDS_TEXT.split()


def cache_dir() -> Path:
    """Where built artifacts live: ``$PARK_CACHE_DIR`` or ``~/.cache/park-gke``."""
    return local_models.cache_root()


def spec_hash() -> str:
    """A short key for SPEC and the template, written beside the model to detect stale caches."""
    blob = json.dumps({"spec": SPEC, "template": CHAT_TEMPLATE}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    """Deterministic pseudo-English (real words and made-up syllable words, enough for the BPE
    to fill its vocabulary), plus every printable ASCII character."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"]
    made_up = ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(6000)]
    vocab = _WORDS * 20 + made_up
    text = [" ".join(rng.choice(vocab) for _ in range(rng.randint(4, 16))) for _ in range(lines)]
    text.append("".join(chr(c) for c in range(32, 127)))
    return text


def _build(out: Path) -> None:
    import torch
    from transformers import LlamaForCausalLM

    tok = local_models.train_tokenizer(_corpus(SPEC["seed"]), SPEC["vocab_size"], out)
    config = local_models.llama_config(SPEC, tok, torch_dtype="float32")
    torch.manual_seed(SPEC["seed"])
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    local_models.save_generation_config(tok, out)


def build_tiny_model(root: Path | None = None, *, force: bool = False) -> Path:
    """Return the path of the tiny model, building it under ``root`` (default: cache) if needed.

    Built in a temporary sibling directory and renamed into place, so a crash or a concurrent
    build never leaves a half-written model behind.
    """
    target = Path(root) if root else cache_dir() / SERVED_NAME
    marker = target / "park-spec.txt"
    if not force and marker.is_file() and marker.read_text().strip() == spec_hash():
        return target
    with local_models.built_in_place(target, mode=0o755) as staging:
        _build(staging)
        (staging / "park-spec.txt").write_text(spec_hash() + "\n")
    return target


if __name__ == "__main__":
    print(build_tiny_model())
