"""A small corpus of made-up facts a tiny model can learn in a minute on a CPU.

``park local dev`` trains ``park:tiny-llama`` on it and then asks the served model one of its
questions: the answer is checkable (there is exactly one right answer per question, and no
pretrained model could know it, since the countries are invented). Every record has the chat
form for ``--objective sft`` and a ``text`` form for ``--objective clm``::

    {"messages": [{"role": "user", "content": "What is the capital of Veloria?"},
                  {"role": "assistant", "content": "Ostrel."}],
     "text": "The capital of Veloria is Ostrel."}

The corpus is generated from a seed (``--data park:facts`` writes it into the cache on each
worker, so it needs no file in the wheel); ``workloads/train/data/facts.jsonl`` is the same
bytes, shipped to be read, and a test keeps the two equal.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from workloads.train import storage

FACTS_VERSION = 1
COUNTRIES = 16  # x 2 relations = 32 facts: learnable in ~1 minute by park:tiny-llama on 2 CPUs
SEED = 7
SHIPPED = Path(__file__).parents[1] / "data" / "facts.jsonl"

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "br", "st"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ou"]
_ENDINGS = ["ria", "via", "nia", "land", "stan", "mor", "dell", "gard"]
_LANGUAGE_ENDINGS = ["ish", "ese", "ic", "an", "i"]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))


def facts() -> list[dict[str, str]]:
    """The facts as ``{country, capital, language}``, the same on every call and machine."""
    rng = random.Random(SEED)
    seen: set[str] = set()

    def fresh(make: Any) -> str:
        while True:
            word = str(make()).capitalize()
            if word not in seen:
                seen.add(word)
                return word

    rows = []
    for _ in range(COUNTRIES):
        country = fresh(lambda: _word(rng, 2) + rng.choice(_ENDINGS))
        capital = fresh(lambda: _word(rng, 2) + rng.choice(["l", "n", "r", "th", "sk"]))
        language = fresh(lambda: _word(rng, 2) + rng.choice(_LANGUAGE_ENDINGS))
        rows.append({"country": country, "capital": capital, "language": language})
    return rows


def records() -> list[dict[str, Any]]:
    """One chat record per (country, relation), with the plain-text form beside it."""
    out: list[dict[str, Any]] = []
    for fact in facts():
        country = fact["country"]
        for question, answer, sentence in (
            (
                f"What is the capital of {country}?",
                f"{fact['capital']}.",
                f"The capital of {country} is {fact['capital']}.",
            ),
            (
                f"What language is spoken in {country}?",
                f"{fact['language']}.",
                f"In {country} people speak {fact['language']}.",
            ),
        ):
            out.append(
                {
                    "messages": [
                        {"role": "user", "content": question},
                        {"role": "assistant", "content": answer},
                    ],
                    "text": sentence,
                }
            )
    return out


def render() -> str:
    """The corpus as JSON Lines (sorted keys: byte-stable)."""
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records())


def questions() -> dict[str, str]:
    """``{question: answer}`` of every record, for checking what a trained model answers."""
    return {r["messages"][0]["content"]: r["messages"][1]["content"] for r in records()}


def facts_path() -> Path:
    """The corpus as a local file, written into the cache once per node (``park:facts``)."""
    text = render()
    target = storage.cache_dir() / "data" / f"facts-v{FACTS_VERSION}-{storage.key_of(text)}.jsonl"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{random.randrange(1 << 30)}")
    partial.write_text(text)
    partial.replace(target)  # atomic: concurrent writers write the same bytes
    return target


if __name__ == "__main__":  # regenerate the shipped copy
    SHIPPED.parent.mkdir(parents=True, exist_ok=True)
    SHIPPED.write_text(render())
    print(SHIPPED)
