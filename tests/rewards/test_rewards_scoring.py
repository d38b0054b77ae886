"""score_batch: accepted return types and errors that name the failing sample."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlhfkit.errors import UserError
from rlhfkit.rewards import RewardError, get_reward, score_batch

PROMPTS = ["What is 1 + 1?", "Say hi.", "Tell me a story\nabout a fox."]
COMPLETIONS = ["2", "hi", "Once upon a time"]


def const(values):
    def reward(prompts, completions, **info):
        return values

    return reward


@pytest.mark.parametrize(
    "values",
    [
        [1, 2.5, True],
        (1.0, 2.5, 1.0),
        np.array([1.0, 2.5, 1.0], dtype=np.float32),
        np.array([[1.0], [2.5], [1.0]]),
    ],
)
def test_accepted_return_types(values):
    out = score_batch(const(values), PROMPTS, COMPLETIONS, {})
    assert out == [1.0, 2.5, 1.0]
    assert all(type(x) is float for x in out)


def test_torch_tensor_results():
    torch = pytest.importorskip("torch")
    out = score_batch(const(torch.tensor([0.5, -1.0, 2.0], requires_grad=True)), PROMPTS, COMPLETIONS, None)
    assert out == [0.5, -1.0, 2.0]


def test_info_is_passed_as_keyword_lists():
    seen = {}

    def reward(prompts, completions, **info):
        seen.update(info)
        return [0.0] * len(prompts)

    score_batch(reward, PROMPTS, COMPLETIONS, {"answer": ["2", None, None]})
    assert seen == {"answer": ["2", None, None]}


@pytest.mark.parametrize(
    "values, match",
    [
        (
            [1.0, float("nan"), 0.0],
            r"reward 'reward' gave nan for sample 1 \(prompt='Say hi\.', completion='hi'\)",
        ),
        ([1.0, 0.0, math.inf], r"gave inf for sample 2 \(prompt='Tell me a story\\nabout a fox\.'"),
        ([1.0, "0.5", 0.0], r"gave '0\.5' for sample 1"),
        ([1.0, None, 0.0], r"gave None for sample 1"),
    ],
)
def test_bad_values_name_the_sample(values, match):
    with pytest.raises(RewardError, match=match) as err:
        score_batch(const(values), PROMPTS, COMPLETIONS, {})
    assert "\n" not in str(err.value)


def test_wrong_length_or_type():
    with pytest.raises(RewardError, match=r"returned 2 values for 3 samples"):
        score_batch(const([1.0, 2.0]), PROMPTS, COMPLETIONS, {})
    with pytest.raises(RewardError, match=r"returned float; expected a list of 3 numbers"):
        score_batch(const(1.0), PROMPTS, COMPLETIONS, {})
    with pytest.raises(RewardError, match=r"got 3 prompts but 2 completions"):
        score_batch(const([1.0] * 3), PROMPTS, COMPLETIONS[:2], {})
    with pytest.raises(RewardError, match=r"info field 'answer' has 1 values for 3 samples"):
        score_batch(const([1.0] * 3), PROMPTS, COMPLETIONS, {"answer": ["2"]})


def test_exception_is_traced_to_the_sample_that_raises():
    def picky(prompts, completions, **info):
        return [1.0 / len(c) for c in completions]  # ZeroDivisionError on an empty completion

    completions = ["fine", "", "also fine"]
    with pytest.raises(RewardError) as err:
        score_batch(picky, PROMPTS, completions, {"answer": ["a", "b", "c"]})
    msg = str(err.value)
    assert msg.startswith("reward 'picky' failed on sample 1 (prompt='Say hi.', completion='')")
    assert msg.endswith("ZeroDivisionError: float division by zero")
    assert isinstance(err.value, UserError)


def test_failure_that_only_happens_on_the_whole_batch():
    def batch_only(prompts, completions, **info):
        if len(prompts) > 1:
            raise RuntimeError("out of memory\nmore details")
        return [0.0]

    with pytest.raises(
        RewardError,
        match=r"^reward 'batch_only' failed on a batch of 3 samples: RuntimeError: out of memory$",
    ):
        score_batch(batch_only, PROMPTS, COMPLETIONS, {})


def test_user_errors_from_the_reward_pass_through_unchanged():
    with pytest.raises(UserError, match="needs an 'answer' or 'answer_value'") as err:
        score_batch(get_reward("arithmetic"), PROMPTS, COMPLETIONS, {})
    assert not isinstance(err.value, RewardError)


def test_name_comes_from_the_spec_and_long_text_is_cut():
    long_prompt = "x" * 500

    def nan_reward(prompts, completions, **info):
        return [float("nan")]

    fn = get_reward(nan_reward)
    with pytest.raises(RewardError, match=r"reward 'custom' gave nan") as err:
        score_batch(fn, [long_prompt], ["y"], {}, name="custom")
    assert len(str(err.value)) < 200


def test_a_reward_that_fails_on_every_sample_blames_none_of_them():
    """A reward broken for any input (a missing import, a bad signature inside) raises on each sample
    alone too: that is not "sample 0"'s fault."""
    def broken(prompts, completions, **info):
        raise KeyError("model_path")

    with pytest.raises(RewardError) as err:
        score_batch(broken, PROMPTS, COMPLETIONS, {})
    assert str(err.value) == ("reward 'broken' failed on each of the 3 samples, alone and as a batch (not on "
                              "particular samples): KeyError: 'model_path'")


def test_a_reward_needing_a_missing_column_names_it():
    """A TRL-style reward that has **kwargs but needs a column the data lacks is told which column,
    not to add **kwargs."""
    from rlhfkit.rewards import RewardError
    from rlhfkit.rewards.scoring import check_reward_call

    def exact(completions, answer, **kwargs):
        return [0.0 for _ in completions]

    check_reward_call(exact, ["answer", "question"])  # fine
    with pytest.raises(RewardError) as e:
        check_reward_call(exact, ["question"], "exact")
    assert str(e.value) == ("reward 'exact' needs the column 'answer', which the data lacks (its columns: question): "
                            "add it to the data, map one with ?columns=answer:COLUMN on the data spec, or give the "
                            "parameter a default")

    def positional(prompts, completions, label):  # rlhfkit's positional convention, no **kwargs
        return [0.0 for _ in completions]

    with pytest.raises(RewardError, match=r"needs the column 'label'"):
        check_reward_call(positional, [], "positional")

    def strict(completions, answer):  # no **kwargs: an extra column is what is wrong
        return [0.0 for _ in completions]

    with pytest.raises(RewardError, match=r"add \*\*kwargs"):
        check_reward_call(strict, ["answer", "question"], "strict")
