"""Rewards: the built-ins' answer extraction, and resolving ``module:function`` names."""

from __future__ import annotations

from fractions import Fraction

import pytest

from workloads.rl import rewards
from workloads.rl.rewards import RewardError, Rewards, extract_number, marked_answer, resolve

GSM8K_ANSWER = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 72"


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("so the total is \\boxed{42}.", Fraction(42)),
        ("first 3 then \\boxed{\\frac{1}{2}} wait, 7", Fraction(1, 2)),
        ("\\boxed{x+1}", None),  # an expression is no number: no guess
        ("\\boxed{3/4}", Fraction(3, 4)),
        ("It costs 1,234 dollars\n#### 1,234", Fraction(1234)),
        ("#### -3.5", Fraction(-7, 2)),
        ("The answer is $18.", Fraction(18)),
        ("I think 3 apples, then 5 more: 8", Fraction(8)),  # unmarked: the last number
        ("no numbers at all", None),
        (GSM8K_ANSWER, Fraction(72)),  # the marked answer, not the 48+24 before it
    ],
)
def test_extract_number(text: str, number: Fraction | None) -> None:
    assert extract_number(text) == number


def test_numeric_reward_compares_numbers_not_strings() -> None:
    assert rewards.numeric(completion="so it is 72.0", answer=GSM8K_ANSWER) == 1.0
    assert rewards.numeric(completion="\\boxed{0.75}", answer="#### 3/4") == 1.0
    assert rewards.numeric(completion="#### 71", answer=GSM8K_ANSWER) == 0.0
    assert rewards.numeric(completion="no idea", answer="#### 3") == 0.0
    assert rewards.numeric(completion="3", answer=None) == 0.0


def test_exact_match_reads_marked_answers_and_normalises() -> None:
    assert rewards.exact_match(completion="The answer is Paris.", answer="paris") == 1.0
    assert rewards.exact_match(completion="  Paris ", answer="Paris") == 1.0
    assert rewards.exact_match(completion="London", answer="Paris") == 0.0
    assert rewards.exact_match(completion="\\boxed{x+1}", answer="#### x+1") == 1.0


def test_format_reward_wants_a_marked_answer() -> None:
    assert rewards.format_reward(completion="... #### 12") == 1.0
    assert rewards.format_reward(completion="\\boxed{12}") == 1.0
    assert rewards.format_reward(completion="it is 12") == 0.0
    assert rewards.format_reward(completion="\\boxed{}") == 0.0


def test_resolve_builtins_and_module_functions() -> None:
    assert resolve("numeric") is rewards.numeric
    assert resolve("workloads.rl.rewards:format_reward") is rewards.format_reward


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("numeric_answer", "not a built-in"),
        ("no_such_module_xyz:fn", "does not import"),
        ("workloads.rl.rewards:missing", "has no 'missing'"),
        ("workloads.rl.rewards:BUILTINS", "not callable"),
        ("workloads.rl.rewards:parse_number", "cannot be called"),
        ("workloads.rl.rewards:Rewards.__call__", "cannot be called"),  # nested name, unbound
        (":fn", "not a built-in"),
    ],
)
def test_resolve_refuses_with_the_name_and_the_reason(name: str, message: str) -> None:
    with pytest.raises(RewardError, match=message) as err:
        resolve(name)
    assert repr(name) in str(err.value)


def test_weighted_sum_and_bad_values() -> None:
    combined = Rewards(["numeric", "format"], [1.0, 0.25])
    assert combined(prompt="q", completion="#### 5", answer="5") == 1.25
    assert combined(prompt="q", completion="5", answer="5") == 1.0
    with pytest.raises(RewardError, match="2 rewards but 1 weights"):
        Rewards(["numeric", "format"], [1.0])
    with pytest.raises(RewardError, match="not a number"):
        Rewards(["tests.workloads.test_rl_rewards:_bad_reward"])(
            prompt="", completion="", answer=None
        )


def _bad_reward(**_: object) -> object:
    return "yes"


@pytest.mark.parametrize("value", [float("-inf"), float("inf"), float("nan"), 1e308])
def test_a_non_finite_reward_is_left_out_and_counted(
    value: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL sums the reward functions with ``nansum`` (a NaN/None contributes nothing); here
    ±inf and NaN do the same, and each is counted. 1e308 x weight 10 overflows: counted too."""
    import sys

    module = sys.modules[__name__]
    monkeypatch.setattr(module, "_VALUE", value)
    combined = Rewards(["numeric", f"{__name__}:_value_reward"], [1.0, 10.0])
    assert combined.evaluate(prompt="q", completion="#### 5", answer="5") == (1.0, 1)
    assert combined(prompt="q", completion="#### 4", answer="5") == 0.0
    monkeypatch.setattr(module, "_VALUE", -2.0)
    assert combined.evaluate(prompt="q", completion="#### 5", answer="5") == (-19.0, 0)


_VALUE = 0.0


def _value_reward(**_: object) -> float:
    return _VALUE


# ---- reasoning traces (Qwen3, DeepSeek-R1): only what follows </think> is the answer --------
@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ("<think>48/2 = 24, so 72? no wait</think>\nThe answer is 5.", 1.0),
        ("<think>so it is 5. Hmm, or 72</think>\n#### 72", 0.0),  # the 5 inside is not it
        ("<think>it must be \\boxed{5}</think>\nSo it is 7.", 0.0),  # a marked 5, inside
        ("<think>\\boxed{7}?</think> no: 5", 1.0),  # the marked 7 inside is not the answer
        ("<think>the answer is 5</think> I give up", 0.0),  # nothing after it
        ("<think>\n\n</think>\n\n#### 5", 1.0),  # thinking off: the template's empty trace
        ("<think>the answer is 5", 0.0),  # truncated trace: no answer yet
        ("<think>a</think> first 3 <think>then the answer is 5", 0.0),  # reopened, not closed
        ("reasoning ... 5</think>\n\n#### 5", 1.0),  # the template opened <think> itself
        ("#### 5", 1.0),  # no think tags: the whole completion, as before
    ],
)
def test_numeric_scores_only_the_answer_after_think(completion: str, score: float) -> None:
    assert rewards.numeric(completion=completion, answer="#### 5") == score


def test_exact_match_and_format_read_after_think_too() -> None:
    assert rewards.exact_match(completion="<think>Lyon?</think>Paris", answer="Paris") == 1.0
    assert rewards.exact_match(completion="<think>Paris", answer="Paris") == 0.0
    assert rewards.format_reward(completion="<think>#### 5</think> it is 5") == 0.0
    assert rewards.format_reward(completion="<think>it is 5</think> #### 5") == 1.0
    assert rewards.format_reward(completion="<think>#### 5") == 0.0


# ---- GSM8K completions as models write them -----------------------------------------------
# Endings of the shapes the references' models produce for GSM8K (answer 72 unless noted):
# GSM8K's own solutions and verl's prompt ("output the final answer after ####"), Qwen2.5-Math
# and DeepSeek-R1 (\boxed{}), Llama 3's "The final answer is: $\boxed{72}$", chat models'
# Markdown ("**Answer:** 72", "**Final Answer**"), plain "The answer is 72.", currency, LaTeX.
COMPLETIONS = [
    ("Natalia sold 48/2 = 24 clips in May.\n48+24 = 72\n#### 72", 72),
    ("She sold 48 + 24 = 72 clips altogether.\n#### 72", 72),
    ("48 + 24 = 72\n####72", 72),
    ("Adding them: 48 + 24 = 72.\n\nThe answer is 72.", 72),
    ("In total she sold 72 clips. The answer is: 72", 72),
    ("So the total is 72.\n\n**Answer:** 72", 72),
    ("Total: 48 + 24 = 72\n\n**Final Answer:** 72 clips", 72),
    ("**Answer: 72**", 72),
    ("The final answer is: $\\boxed{72}$", 72),
    ("48 + 24 = 72\n\n**Final Answer**\n\\[\n\\boxed{72}\n\\]", 72),
    ("Therefore she sold \\(\\boxed{72}\\) clips in April and May.", 72),
    ("The cost is \\boxed{\\$18}.", 18),
    ("\\boxed{18\\%} of the class", 18),
    ("so \\boxed{72 \\text{ clips}}", 72),
    ("the sum is \\boxed{1{,}234}", 1234),
    ("#### $1,234.00", 1234),
    ("The answer is $18.", 18),
    ("She has \u22125 dollars left.\n#### \u22125", -5),
    ("Each gets \\boxed{\\dfrac{3}{4}} of a pie", Fraction(3, 4)),
    ("I think it is 48, no wait: 48 + 24 gives 72", 72),  # unmarked: the last number
    ("The answer is 72. Let me check: 48 + 24 = 72. Yes.", 72),  # the sentence, not the line
    ("\\boxed{x + 1}", None),  # an expression: no guess
    ("**Answer:** I am not sure.", None),
]


@pytest.mark.parametrize(("completion", "number"), COMPLETIONS)
def test_completions_as_models_write_them(completion: str, number: object) -> None:
    got = extract_number(completion)
    assert got == (None if number is None else Fraction(number)), completion
    if number is not None:
        assert rewards.numeric(completion=completion, answer=f"... #### {number}") == 1.0


def _verl_gsm8k(solution_str: str, method: str) -> str | None:
    """verl utils/reward_score/gsm8k.py extract_solution, as written there."""
    import re

    if method == "strict":
        solution = re.search("#### (\\-?[0-9\\.\\,]+)", solution_str)
        if solution is None:
            return None
        return solution.group(0).split("#### ")[1].replace(",", "").replace("$", "")
    answer = re.findall("(\\-?[0-9\\.\\,]+)", solution_str)
    final = None
    for final in reversed(answer):
        if final not in ["", "."]:
            break
    return final


@pytest.mark.parametrize(("completion", "number"), COMPLETIONS)
def test_where_verls_gsm8k_extraction_applies_it_agrees(completion: str, number: object) -> None:
    # verl's strict form ("#### <digits>") and, for unmarked text, its flexible form (the last
    # number): where either applies, the number is the same as ours.
    strict = _verl_gsm8k(completion, "strict")
    if strict is not None and strict.strip("."):
        assert Fraction(strict.rstrip(".")) == extract_number(completion)
    if marked_answer(completion) is None:
        flexible = _verl_gsm8k(completion, "flexible")
        assert flexible is not None
        assert Fraction(flexible.replace(",", "").rstrip(".")) == extract_number(completion)


def test_bold_and_boxed_answers_score_where_they_scored_zero() -> None:
    """The shapes the issue names: `**Answer:** 72` and `\\boxed{72}` against GSM8K's reference."""
    for completion in ("**Answer:** 72", "\\boxed{72}", "The answer is **72**."):
        assert rewards.numeric(completion=completion, answer=GSM8K_ANSWER) == 1.0
        assert rewards.format_reward(completion=completion) == 1.0
