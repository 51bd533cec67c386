"""Greedy completions from an exported folder with plain transformers: the reference a served
model is compared with, and the check that a run learned what it was trained on.

    python -m workloads.train.generate EXPORT_FOLDER "What is the capital of Sevaeria?"
    python -m workloads.train.generate EXPORT_FOLDER "What is ...?" --answer "Fougisk."

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


def answer_logprob(model: Any, tokenizer: Any, prompt: str, answer: str) -> float:
    """The log-probability the model gives ``answer`` as its reply to ``prompt``: the tokens
    the chat template puts after the generation prompt for that assistant turn (the turn's
    end included), as a fine-tune on the chat learned them. How near a wrong answer the model
    is to the right one: the higher, the more often sampling gives it."""
    import torch

    user = [{"role": "user", "content": prompt}]
    prefix = tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=True)
    whole = tokenizer.apply_chat_template(
        [*user, {"role": "assistant", "content": answer}], tokenize=True
    )
    prefix, whole = list(_ids(prefix)), list(_ids(whole))
    if whole[: len(prefix)] != prefix:  # a template that renders the turn otherwise
        whole = prefix + tokenizer(answer, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([whole])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    targets = ids[0, len(prefix) :]
    picked = logprobs[len(prefix) - 1 :].gather(1, targets[:, None])
    return float(picked.sum())


def _ids(rendered: Any) -> list[int]:
    """Token ids from apply_chat_template(tokenize=True): a list, or a BatchEncoding."""
    return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)


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
    parser.add_argument(
        "--answer",
        action="append",
        default=[],
        help="a reference answer per prompt, in order: each line then ends with the "
        "log-probability of that answer as the reply (answer_logprob)",
    )
    args = parser.parse_args(argv)
    if args.answer and len(args.answer) != len(args.prompt):
        parser.error(f"{len(args.answer)} --answer for {len(args.prompt)} prompts: one each")
    model, tokenizer = load(args.folder)
    for i, prompt in enumerate(args.prompt):
        line = f"{prompt}\t{greedy_reply(model, tokenizer, prompt, args.max_new_tokens)}"
        if args.answer:
            line += f"\t{answer_logprob(model, tokenizer, prompt, args.answer[i]):.4f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
