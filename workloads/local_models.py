"""What training's and serving's locally built models share: the cache root, a folder built in
place, and the tiny Llamas' tokenizer, chat template and config.

Two tiny Llamas are built on the machine that uses them (nothing comes from a hub): training's
``park:tiny-llama`` (workloads/train/models/tiny_llama.py: config and tokenizer, weights from the
trainer) and serving's random-weight model (workloads/serve/tiny_model.py). They differ in size
and corpus (each keeps its ``SPEC``) and share the rest from here. Torch-free at import; the
``tokenizers`` / ``transformers`` imports are inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import LlamaConfig, PreTrainedTokenizerFast

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def cache_root() -> Path:
    """``$PARK_CACHE_DIR`` or ``~/.cache/park-gke``: where both sides keep what they build."""
    return Path(os.environ.get("PARK_CACHE_DIR") or Path.home() / ".cache" / "park-gke")


@contextlib.contextmanager
def built_in_place(target: Path, mode: int | None = None) -> Iterator[Path]:
    """A temporary sibling of ``target`` to fill; on success it replaces ``target`` by a rename,
    on any error it is removed. So ``target`` is complete or absent, never half-written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    if mode is not None:
        staging.chmod(mode)
    try:
        yield staging
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def train_tokenizer(corpus: list[str], vocab_size: int, out: Path) -> PreTrainedTokenizerFast:
    """A byte-level BPE learned from ``corpus`` with the special and role tokens and the chat
    template, saved to ``out`` in the form ``AutoTokenizer.from_pretrained`` reads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def llama_config(spec: dict[str, Any], tok: PreTrainedTokenizerFast, **extra: Any) -> LlamaConfig:
    """A ``LlamaForCausalLM`` config sized by ``spec``, with the tokenizer's real vocabulary and
    special token ids (``extra``: the keys one side sets and the other does not)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_key_value_heads"],
        max_position_embeddings=spec["max_position_embeddings"],
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        **extra,
    )
    config.architectures = ["LlamaForCausalLM"]
    return config


def save_generation_config(tok: PreTrainedTokenizerFast, out: Path) -> None:
    """generation_config.json with the tokenizer's ids (what transformers and vLLM stop on)."""
    from transformers import GenerationConfig

    GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    ).save_pretrained(out)
