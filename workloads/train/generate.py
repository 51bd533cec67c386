"""Greedy completions from an exported folder with plain transformers: the reference a served
model is compared with, and the check that a run learned what it was trained on.

    python -m workloads.train.generate EXPORT_FOLDER "What is the capital of Sevaeria?"

The prompt goes through the folder's chat template with a generation prompt, as an OpenAI chat
completion request does in vLLM; decoding is greedy (temperature 0) and stops at the
tokenizer's EOS, and the reply is the generated text without special tokens, stripped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def load(folder: str | Path) -> tuple[Any, Any]:
    """(model, tokenizer) of an export, in float32 on the CPU, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model.eval()
    return model, AutoTokenizer.from_pretrained(folder)


def greedy_reply(
    model: Any, tokenizer: Any, prompt: str | Sequence[dict[str, str]], max_new_tokens: int = 16
) -> str:
    """The model's greedy reply to a user message (or a whole chat)."""
    import torch

    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(
            **encoded,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        )
    reply = out[0, encoded["input_ids"].shape[1] :]
    return str(tokenizer.decode(reply, skip_special_tokens=True)).strip()


def greedy_replies(
    folder: str | Path, prompts: Iterable[str], max_new_tokens: int = 16
) -> dict[str, str]:
    """``{prompt: reply}`` for each prompt, loading the folder once."""
    model, tokenizer = load(folder)
    return {p: greedy_reply(model, tokenizer, p, max_new_tokens) for p in prompts}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", help="an exported Hugging Face folder")
    parser.add_argument("prompt", nargs="+", help="user messages, one reply each")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    for prompt, reply in greedy_replies(args.folder, args.prompt, args.max_new_tokens).items():
        print(f"{prompt}\t{reply}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
