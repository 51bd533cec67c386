"""Records to token documents for one objective (the "Objectives" part of
workloads/train/inputs/text.py's story): clm text with BOS/EOS, or a chat rendered with the
tokenizer's template whose assistant turns alone are targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from workloads.train.inputs.batches import DataError

# The run's flags an Encoder is made of, named as its keyword arguments (Encoder.for_run).
RUN_FLAGS = ("objective", "text_field", "messages_field", "prompt_field", "response_field")


@dataclass
class Document:
    """Token ids and which of them are targets (``mask[i]``: train on predicting ``ids[i]``)."""

    ids: np.ndarray
    mask: np.ndarray


class Encoder:
    """Turns records into Documents with the model's tokenizer, for one objective."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        objective: str,
        text_field: str = "text",
        messages_field: str = "messages",
        prompt_field: str = "prompt",
        response_field: str = "completion",
    ) -> None:
        self.tokenizer = tokenizer
        self.objective = objective
        self.text_field = text_field
        self.messages_field = messages_field
        self.prompt_fields = [f.strip() for f in prompt_field.split(",") if f.strip()]
        self.response_field = response_field
        self.bos = tokenizer.bos_token_id
        self.eos = tokenizer.eos_token_id
        if self.eos is None:
            raise DataError("--tokenizer has no EOS token: documents could not be separated")
        if objective == "sft" and not getattr(tokenizer, "chat_template", None):
            raise DataError(
                "--objective sft needs a tokenizer with a chat template (--tokenizer or --model)"
            )

    @classmethod
    def for_run(cls, tokenizer: Any, cfg: Any) -> Encoder:
        """The encoder a training run's flags describe: ``cfg`` (a TrainConfig) holds each
        keyword argument of the constructor as the flag of the same name."""
        return cls(tokenizer, **{name: getattr(cfg, name) for name in RUN_FLAGS})

    def encode(self, record: Any) -> Document | None:
        """The record's document, or None when it has nothing to train on."""
        if self.objective == "sft":
            return self._encode_chat(self.messages(record))
        return self._encode_text(record)

    # clm

    def _encode_text(self, record: Any) -> Document | None:
        if isinstance(record, str):
            text = record
        elif isinstance(record, dict) and isinstance(record.get(self.text_field), str):
            text = record[self.text_field]
        elif isinstance(record, dict) and self.messages_field in record:
            text = self._render(self.messages(record), generation_prompt=False)
            ids = self._tokens(text)
            return self._document([*ids, self.eos], np.ones(len(ids) + 1, dtype=bool))
        else:
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise DataError(f"--text-field {self.text_field!r}: not in the record (it has {keys})")
        ids = [*([self.bos] if self.bos is not None else []), *self._tokens(text), self.eos]
        return self._document(ids, np.ones(len(ids), dtype=bool))

    # sft

    def messages(self, record: Any) -> list[dict[str, str]]:
        """The record's chat: its messages field, or a user and an assistant turn."""
        if not isinstance(record, dict):
            raise DataError(
                "--objective sft needs records with a chat or prompt/response fields, got text"
            )
        if self.messages_field in record:
            messages = record[self.messages_field]
            if not isinstance(messages, list) or not all(
                isinstance(m, dict) and "role" in m and "content" in m for m in messages
            ):
                raise DataError(
                    f"--messages-field {self.messages_field!r}: expected a list of "
                    "{role, content}"
                )
            return [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
        missing = [f for f in [*self.prompt_fields, self.response_field] if f not in record]
        if missing:
            raise DataError(
                f"a record has neither --messages-field {self.messages_field!r} nor "
                f"--prompt-field/--response-field {', '.join(missing)!r} (it has {sorted(record)})"
            )
        prompt = "\n\n".join(str(record[f]) for f in self.prompt_fields if record[f])
        return [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": str(record[self.response_field])},
        ]

    def _render(self, messages: Sequence[dict[str, str]], *, generation_prompt: bool) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=generation_prompt
            )
        )

    def response_spans(self, messages: Sequence[dict[str, str]]) -> tuple[str, list[range]]:
        """The rendered chat and the character ranges of the assistant turns in it.

        Each span runs from the end of the conversation-so-far with a generation prompt to the
        end of the conversation including that turn, so it holds exactly what the model must
        generate (its end-of-turn tokens included, trailing whitespace not). A template that
        renders earlier turns differently once later ones follow (some drop past reasoning)
        makes only the last assistant turn a target.
        """
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            return "", []
        full = self._render(messages[: turns[-1] + 1], generation_prompt=False)
        spans: list[range] = []
        for i in turns:
            prefix = self._render(messages[:i], generation_prompt=True)
            upto = self._render(messages[: i + 1], generation_prompt=False)
            if not (full.startswith(upto) and upto.startswith(prefix)):
                prefix = self._render(messages[: turns[-1]], generation_prompt=True)
                if not full.startswith(prefix):
                    raise DataError(
                        "the chat template does not render a conversation as its prefix plus "
                        "the reply; --objective sft cannot tell the response tokens"
                    )
                return full, [range(len(prefix), len(full.rstrip()))]
            spans.append(range(len(prefix), len(upto.rstrip())))
        return full, spans

    def _encode_chat(self, messages: list[dict[str, str]]) -> Document | None:
        text, spans = self.response_spans(messages)
        if not spans:
            return None
        encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(encoded["input_ids"])
        mask = np.zeros(len(ids), dtype=bool)
        for index, (start, end) in enumerate(encoded["offset_mapping"]):
            if end > start and any(start >= s.start and end <= s.stop for s in spans):
                mask[index] = True
        return self._document(ids, mask)

    def _tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    @staticmethod
    def _document(ids: list[int], mask: np.ndarray) -> Document | None:
        if len(ids) < 2 or not mask[1:].any():
            return None
        return Document(np.asarray(ids, dtype=np.int64), mask)
