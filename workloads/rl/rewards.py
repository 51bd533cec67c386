"""Verifiable rewards: plain Python callables, named in the stack as ``module:function``.

A reward is ``fn(*, prompt: str, completion: str, answer: str | None) -> float`` (keywords, so a
function may take ``**kwargs`` and ignore what it does not need). Per completion rather than
TRL's batched ``fn(prompts, completions, **kw) -> list``: a check of one answer is what a user
writes, and the rollout side calls it beside each engine anyway. A stack names either a
built-in (:data:`BUILTINS`: ``exact_match``, ``numeric``, ``format``) or ``package.module:
function`` importable on the cluster (the image or the job's runtime env). Resolution happens
at job start and refuses anything it cannot call with those keywords, with the name, the
reason and what is allowed.

The built-ins read an answer out of free text the way the math sets and the models mark it: the
last ``\\boxed{...}`` (MATH, Qwen-Math, DeepSeek-R1 style), else the last ``#### <answer>``
(GSM8K, verl's GSM8K prompt), else ``answer is <x>`` / ``Answer: <x>`` (Markdown emphasis such as
``**Answer:** 72`` ignored), else (``numeric`` only) the last number in the text, as verl's
"flexible" GSM8K extraction does. A marked answer is read as one number after the LaTeX a model
wraps it in (``\\$``, ``\\%``, ``\\text{...}``, ``{,}``, ``\\frac{a}{b}``) is taken off; an
expression such as ``x+1`` is no number and scores 0 rather than a guess. The reference goes
through the same extraction, so a GSM8K solution with its ``#### 72`` line is a valid ``answer``.

Reasoning models (Qwen3, DeepSeek-R1) think inside ``<think>…</think>`` before they answer: the
built-ins read only what follows the last ``</think>`` (:func:`answer_text`), so a number the
model tries while thinking is not its answer, and a completion whose ``<think>`` never closes (a
trace cut off at ``maxTokens``) scores 0 instead of being paid for the last number it reached.
A chat template that opens ``<think>`` in the prompt itself (Qwen3-Thinking-2507) leaves only
``</think>`` in the completion: read the same way, except that a trace truncated there carries no
tag at all and is read whole.

:class:`Rewards` sums the rewards and keeps a non-finite value (±inf, NaN) out of the sum: it
contributes 0, as TRL's ``nansum`` over the reward functions treats a NaN/None, and is counted
(the step's ``rewards_nonfinite``), because one -inf would make its group's mean -inf and every
advantage of the group NaN, and the optimizer would step on NaN gradients.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Callable, Sequence
from fractions import Fraction

RewardFn = Callable[..., float]

BOXED = re.compile(r"\\boxed\s*\{((?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*)\}")
HASHES = re.compile(r"####\s*([^\n]+)")
# "answer is 72", "Answer: 72", "final answer is: $18." up to the end of the sentence or line.
ANSWER_IS = re.compile(r"answer\s*(?:is\b|:|=)\s*:?\s*([^\n]*?)\s*(?:\.(?=\s|$)|\n|$)", re.I)
EMPHASIS = re.compile(r"\*\*|__|(?<!\w)\*(?!\s)|(?<!\s)\*(?!\w)")
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")
FRAC = re.compile(r"\\[dt]?frac\{\s*(-?[\d.]+)\s*\}\{\s*(-?[\d.]+)\s*\}")
TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
# LaTeX a model wraps a number in: escaped units, thin spaces, braces around a thousands comma.
LATEX_NOISE = (("{,}", ","), ("\\$", ""), ("\\%", ""), ("\\,", ""), ("\\!", ""),
               ("\\;", ""), ("^\\circ", ""), ("^{\\circ}", ""), ("\\left", ""),
               ("\\right", ""), ("$", ""), ("\u2212", "-"))  # fmt: skip
OPERATORS = re.compile(r"[+*^=\\{}]")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class RewardError(ValueError):
    """A reward name that cannot be used; the message says which, why, and what is allowed."""


def marked_answer(text: str) -> str | None:
    """The answer ``text`` marks explicitly (``\\boxed{}``, ``####``, ``answer is``), or None."""
    plain = EMPHASIS.sub("", text)
    for pattern in (BOXED, HASHES, ANSWER_IS):
        found = pattern.findall(plain)
        if found:
            return str(found[-1]).strip()
    return None


def plain_number_text(marked: str) -> str:
    """A marked answer without the LaTeX around its number (``\\$18``, ``18\\%``,
    ``1{,}234``, ``72 \\text{ clips}``, ``\\frac{3}{4}`` as ``3/4``)."""
    plain = FRAC.sub(r"\1/\2", TEXT.sub(r"\1", marked))
    for noise, replacement in LATEX_NOISE:
        plain = plain.replace(noise, replacement)
    return plain.strip()


def parse_number(text: str) -> Fraction | None:
    """The last number in ``text`` (``1,234``, ``-3.5``, ``3/4``, ``$12``), exactly, or None."""
    found = NUMBER.findall(text)
    if not found:
        return None
    raw = found[-1].replace(",", "").replace(" ", "")
    try:
        return Fraction(raw)
    except (ValueError, ZeroDivisionError):
        return None


def extract_number(text: str) -> Fraction | None:
    """The number a completion answers: its marked answer when it has one (which must then be
    one number, units allowed, ``\\frac{a}{b}`` read as ``a/b``; an expression such as
    ``x+1`` is no number), else the last number of the text."""
    marked = marked_answer(text)
    if marked is None:
        return parse_number(text.replace("\u2212", "-"))
    plain = plain_number_text(marked)
    if OPERATORS.search(plain) or len(NUMBER.findall(plain)) != 1:
        return None
    return parse_number(plain)


def answer_text(completion: str) -> str | None:
    """What follows the last ``</think>`` of ``completion`` (all of it when it has no think
    tags), or None when a ``<think>`` is left open there: the trace was cut off before the
    answer, so there is nothing to score."""
    tail = completion.rpartition(THINK_CLOSE)[2]
    return None if THINK_OPEN in tail else tail


def _normalise(text: str) -> str:
    return " ".join(text.strip().strip(".").lower().split())


def exact_match(*, completion: str, answer: str | None, **_: object) -> float:
    """1.0 when the completion's marked answer (or, unmarked, the whole completion) equals the
    reference's, ignoring case, surrounding space and a final period (after ``</think>``)."""
    text = answer_text(completion)
    if answer is None or text is None:
        return 0.0
    got = marked_answer(text)
    want = marked_answer(answer)
    got_text = text if got is None else got
    want_text = answer if want is None else want
    return float(_normalise(got_text) == _normalise(want_text))


def numeric(*, completion: str, answer: str | None, **_: object) -> float:
    """1.0 when the completion's number equals the reference's (exactly, as fractions; floats
    within a relative 1e-6). Only the answer after ``</think>`` counts (:func:`answer_text`)."""
    text = answer_text(completion)
    if answer is None or text is None:
        return 0.0
    got, want = extract_number(text), extract_number(answer)
    if got is None or want is None:
        return 0.0
    return float(got == want or math.isclose(float(got), float(want), rel_tol=1e-6))


def format_reward(*, completion: str, **_: object) -> float:
    """1.0 when the completion marks its answer in one of the recognised forms (so a number
    can be read from it without guessing), else 0.0: rewards the format, not correctness. A mark
    inside ``<think>`` is not the answer's format (:func:`answer_text`)."""
    text = answer_text(completion)
    marked = None if text is None else marked_answer(text)
    return float(marked is not None and marked != "")


BUILTINS: dict[str, RewardFn] = {
    "exact_match": exact_match,
    "numeric": numeric,
    "format": format_reward,
}


def resolve(name: str) -> RewardFn:
    """The reward called ``name``: a built-in, or ``module:function`` imported here."""
    if name in BUILTINS:
        return BUILTINS[name]
    allowed = f"a built-in ({', '.join(BUILTINS)}) or module:function"
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise RewardError(f"reward {name!r}: not {allowed}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise RewardError(
            f"reward {name!r}: module {module_name!r} does not import ({err}); it must be on "
            "the cluster's Python path (the image or the job's runtime env)"
        ) from err
    fn: object = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise RewardError(f"reward {name!r}: {module_name} has no {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise RewardError(f"reward {name!r}: {attr} is a {type(fn).__name__}, not callable")
    try:
        inspect.signature(fn).bind(prompt="", completion="", answer=None)
    except TypeError as err:
        raise RewardError(
            f"reward {name!r}: cannot be called as fn(prompt=, completion=, answer=) ({err})"
        ) from err
    except ValueError:  # a builtin without a signature: trust it
        pass
    return fn


class Rewards:
    """Several rewards, each with a weight, summed into one number per completion."""

    def __init__(
        self, names: Sequence[str], weights: Sequence[float] | None = None, *, gate: bool = False
    ) -> None:
        if not names:
            raise RewardError("no reward named: give at least one")
        if weights is not None and len(weights) != len(names):
            raise RewardError(f"{len(names)} rewards but {len(weights)} weights")
        self.names = list(names)
        self.fns = [resolve(name) for name in names]
        self.weights = [1.0] * len(names) if weights is None else [float(w) for w in weights]
        self.gate = gate  # the rewards after the first count only where the first is > 0

    def __call__(self, *, prompt: str, completion: str, answer: str | None) -> float:
        return self.evaluate(prompt=prompt, completion=completion, answer=answer)[0]

    def evaluate(self, *, prompt: str, completion: str, answer: str | None) -> tuple[float, int]:
        """The weighted sum, and how many rewards returned a non-finite value (±inf, NaN): each
        such value contributes 0 instead (module docstring). A value that is no number at all
        (a string, None) is a bug in the reward and raises, naming it. With ``gate``, the rewards
        after the first are not asked where the first is not > 0 (wrong): a format bonus is
        paid only beside a right answer, so it cannot become a full-size advantage in a group
        whose answers are all wrong."""
        total, nonfinite, first = 0.0, 0, 0.0
        for index, (name, fn, weight) in enumerate(
            zip(self.names, self.fns, self.weights, strict=True)
        ):
            if self.gate and index > 0 and not first > 0:
                break
            value = fn(prompt=prompt, completion=completion, answer=answer)
            if not isinstance(value, int | float):
                raise RewardError(f"reward {name!r} returned {value!r}, not a number")
            weighted = weight * float(value)
            if index == 0:
                first = float(value)
            if not math.isfinite(weighted):  # inf, NaN, or a finite value the weight overflows
                nonfinite += 1
                continue
            total += weighted
        return total, nonfinite
