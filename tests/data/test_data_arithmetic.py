"""The arithmetic problem generator and the builtin:arithmetic splits."""

from __future__ import annotations

import re

import pytest

from rlhfkit.data.arithmetic import KINDS, OBJECTS, builtin_split, make_problems, problem_key
from rlhfkit.errors import ConfigError


def recompute(problem: dict) -> int:
    """The answer worked out independently from the prompt text."""
    text = problem["prompt"]
    nums = [int(n) for n in re.findall(r"\d+", text)]
    assert len(nums) == 2, text
    a, b = nums
    if text.startswith("Subtract"):  # "Subtract b from a."
        a, b = b, a
    subtract = problem["kind"].startswith("sub")
    assert (a, b) == tuple(problem["operands"])
    return a - b if subtract else a + b


def test_answers_are_correct_for_every_kind():
    problems = make_problems(400, seed=3, kinds=KINDS)
    assert {p["kind"] for p in problems} == set(KINDS)
    for p in problems:
        value = recompute(p)
        assert p["answer_value"] == value
        assert p["answer"].endswith(f"\n#### {value}")
        assert p["prompt"].endswith("Answer with just the number.")


def test_deterministic_and_seed_dependent():
    assert make_problems(50, seed=7) == make_problems(50, seed=7)
    assert make_problems(50, seed=7) != make_problems(50, seed=8)


def test_operand_range_and_non_negative_results():
    problems = make_problems(500, seed=0, max_operand=5, kinds=("add", "sub"))
    assert all(1 <= x <= 5 for p in problems for x in p["operands"])
    assert all(p["answer_value"] >= 0 for p in problems)
    assert {p["kind"] for p in problems} == {"add", "sub"}


def test_word_problems_use_the_singular_for_one():
    problems = make_problems(2000, seed=1, max_operand=2, kinds=("add", "sub"))
    ones = [p for p in problems if p["operands"][0] == 1]
    assert ones
    for p in ones:
        assert any(f" 1 {singular}" in p["prompt"] for singular, _ in OBJECTS), p["prompt"]
        assert not any(f" 1 {plural}" in p["prompt"] for _, plural in OBJECTS), p["prompt"]


def test_plain_kind_reads_like_a_sum():
    p = make_problems(1, seed=0, kinds=("add_plain",))[0]
    assert re.fullmatch(
        r"(What is \d+ (\+|plus) \d+\?|Add \d+ and \d+\.) Answer with just the number\.", p["prompt"]
    )


def test_unique_and_exclude_keys():
    problems = make_problems(50, seed=0, max_operand=10, unique=True)
    keys = [problem_key(p) for p in problems]
    assert len(set(keys)) == 50
    more = make_problems(50, seed=1, max_operand=10, exclude_keys=set(keys))
    assert not {problem_key(p) for p in more} & set(keys)


def test_impossible_requests_raise_config_errors():
    with pytest.raises(ConfigError, match="could only make"):
        make_problems(5, seed=0, max_operand=1, kinds=("add",), unique=True)  # only 1 + 1 exists
    with pytest.raises(ConfigError, match="unknown arithmetic kind 'mul'"):
        make_problems(5, seed=0, kinds=("mul",))
    with pytest.raises(ConfigError, match="max_operand"):
        make_problems(5, seed=0, max_operand=0)


def test_builtin_splits_share_no_question_even_reworded():
    train, test = builtin_split("train"), builtin_split("test")
    assert (len(train), len(test)) == (2000, 200)
    assert not {problem_key(p) for p in train} & {problem_key(p) for p in test}
    assert all(x <= 20 for p in train + test for x in p["operands"])
    assert builtin_split("test") == test
