"""Built-in rewards: sentiment, arithmetic (answer parsing), length."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.data.arithmetic import make_problems
from rlhfkit.errors import UserError
from rlhfkit.rewards import arithmetic, extract_final_number, length, make_length_reward, sentiment

# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, expected",
    [
        ("#### 12", 12),
        ("12.", 12),
        ("The answer is 12 apples.", 12),
        ("-3", -3),
        ("It is -3 degrees.", -3),
        ("1,234", 1234),
        ("about 1,234,567 stars", 1234567),
        ("12.0", 12),
        ("12.5", 12.5),
        ("7 + 5 = 12", 12),
        ("5-3", 3),  # a hyphen between digits is not a minus sign
        ("7 + 5 = 12\n#### 12", 12),
        ("#### 12\nbut earlier I said 13", 12),  # the number after #### wins
        ("I think 10, no wait, 11", 11),
        ("$1,234.50", 1234.5),
        ("−4", -4),  # unicode minus
        ("no number here", None),
        ("", None),
        ("#### ", None),
    ],
)
def test_extract_final_number_golden(text, expected):
    assert extract_final_number(text) == expected


def test_arithmetic_reward_accepts_each_answer_form():
    prompts = ["q"] * 5
    completions = ["12", "The answer is 12.", "12.0", "13", "no idea"]
    by_string = arithmetic(prompts, completions, answer=["7 + 5 = 12\n#### 12"] * 5)
    by_number = arithmetic(prompts, completions, answer=[12] * 5)
    by_value = arithmetic(prompts, completions, answer_value=[12] * 5)
    assert by_string == by_number == by_value == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_arithmetic_reward_on_generated_problems():
    problems = make_problems(30, seed=5, kinds=("add", "sub", "add_plain", "sub_plain"))
    prompts = [p["prompt"] for p in problems]
    answers = [p["answer"] for p in problems]
    right = [f"So the answer is {p['answer_value']}." for p in problems]
    wrong = [f"So the answer is {p['answer_value'] + 1}." for p in problems]
    assert arithmetic(prompts, right, answer=answers) == [1.0] * 30
    assert arithmetic(prompts, wrong, answer=answers) == [0.0] * 30


def test_arithmetic_reward_needs_an_answer():
    with pytest.raises(UserError, match="needs an 'answer' or 'answer_value'"):
        arithmetic(["q"], ["12"])
    with pytest.raises(UserError, match="sample 1 has no numeric answer"):
        arithmetic(["q", "q"], ["1", "2"], answer=["#### 1", "unknown"])


# --------------------------------------------------------------------------- sentiment


def test_sentiment_orders_positive_above_negative():
    pos = "I absolutely love this place, the staff were wonderful and the food was great!"
    neg = "Terrible. The food was awful, the staff were rude and I hated every minute."
    neutral = "The shop is on Main Street."
    scores = sentiment(["p"] * 3, [pos, neg, neutral])
    assert scores[0] > 0.5 > -0.5 > scores[1]
    assert scores[1] < scores[2] < scores[0]
    assert scores[2] == 0.0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=80), min_size=1, max_size=4))
def test_sentiment_is_bounded_for_any_text(texts):
    scores = sentiment([""] * len(texts), texts)
    assert len(scores) == len(texts)
    assert all(isinstance(s, float) and -1.0 <= s <= 1.0 for s in scores)


# --------------------------------------------------------------------------- length


def test_length_reward_peaks_at_target_and_is_clipped():
    reward = make_length_reward(10)
    texts = [" ".join(["w"] * n) for n in (10, 5, 15, 0, 100)]
    assert reward([""] * 5, texts) == [0.0, -0.5, -0.5, -1.0, -1.0]
    assert length(["p"], [" ".join(["w"] * 30)]) == [0.0]  # default target: 30 words


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_length_reward_rejects_bad_targets(bad):
    with pytest.raises(UserError, match="positive number of words"):
        make_length_reward(bad)
