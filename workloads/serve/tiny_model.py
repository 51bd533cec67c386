"""A tiny Llama-architecture model built on this machine, for serving on CPU without a hub.

Random weights, a byte-level BPE tokenizer trained here with ``tokenizers`` and a chat template:
enough for vLLM to load it and for the OpenAI endpoints to answer (the text is gibberish). The
build is deterministic and cached; a changed spec (``SPEC``) rebuilds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

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

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORDS_TEXT = (
    "the a model serves tokens on a chip slice host ray serve cluster request reply stream "
    "prompt answer fast slow cloud tpu node pod engine cache memory batch queue replica "
    "hello world what is how why when where who can will should data train test one two "
    "three four five red green blue sky sea tree stone river city road light dark time"
)
_WORDS = _WORDS_TEXT.split()


def cache_dir() -> Path:
    """Where built artifacts live: ``$PARK_CACHE_DIR`` or ``~/.cache/park-gke``."""
    return Path(os.environ.get("PARK_CACHE_DIR") or Path.home() / ".cache" / "park-gke")


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


def _build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=SPEC["vocab_size"],
        special_tokens=[PAD, BOS, EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(SPEC["seed"]), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def _build_model(out: Path) -> None:
    import torch
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    tok = PreTrainedTokenizerFast.from_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=SPEC["hidden_size"],
        intermediate_size=SPEC["intermediate_size"],
        num_hidden_layers=SPEC["num_hidden_layers"],
        num_attention_heads=SPEC["num_attention_heads"],
        num_key_value_heads=SPEC["num_key_value_heads"],
        max_position_embeddings=SPEC["max_position_embeddings"],
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SPEC["seed"])
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    ).save_pretrained(out)


def build_tiny_model(root: Path | None = None, *, force: bool = False) -> Path:
    """Return the path of the tiny model, building it under ``root`` (default: cache) if needed.

    Built in a temporary sibling directory and renamed into place, so a crash or a concurrent
    build never leaves a half-written model behind.
    """
    target = Path(root) if root else cache_dir() / SERVED_NAME
    marker = target / "park-spec.txt"
    if not force and marker.is_file() and marker.read_text().strip() == spec_hash():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    tmp.chmod(0o755)
    try:
        _build_tokenizer(tmp)
        _build_model(tmp)
        (tmp / "park-spec.txt").write_text(spec_hash() + "\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


if __name__ == "__main__":
    print(build_tiny_model())
