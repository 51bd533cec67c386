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
import shutil
import tempfile
from pathlib import Path
from typing import Any

from workloads.train import facts, storage

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

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
# The serving side's tiny model uses the same template (workloads/serve/tiny_model.py).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

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
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, LlamaConfig, PreTrainedTokenizerFast

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
    tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=SPEC["hidden_size"],
        intermediate_size=SPEC["intermediate_size"],
        num_hidden_layers=SPEC["num_hidden_layers"],
        num_attention_heads=SPEC["num_attention_heads"],
        num_key_value_heads=SPEC["num_key_value_heads"],
        max_position_embeddings=SPEC["max_position_embeddings"],
        rope_parameters={"rope_type": "default", "rope_theta": SPEC["rope_theta"]},
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
    )
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out)
    GenerationConfig(
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    ).save_pretrained(out)


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
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            _build(staging)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target
