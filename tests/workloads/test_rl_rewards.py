"""Rewards: the built-ins' answer extraction, and resolving ``module:function`` names."""

from __future__ import annotations

from fractions import Fraction

import pytest

from workloads.rl import rewards
from workloads.rl.rewards import RewardError, Rewards, extract_number, resolve

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
