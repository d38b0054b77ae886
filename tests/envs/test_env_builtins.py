"""The built-in environments on scripted episodes: `arithmetic-tool` and `self-correct`."""

from __future__ import annotations

import pytest

from rlhfkit.data.arithmetic import INSTRUCTION, builtin_split
from rlhfkit.envs import ArithmeticToolEnv, SelfCorrectEnv, Step, as_step, make_env_factory
from rlhfkit.envs.tools import JSON, TAG, parse_tool_call
from rlhfkit.errors import UserError
from rlhfkit.rewards.builtins import arithmetic

RECORD = {"prompt": "Sam has 15 shells and finds 6 more. How many shells does Sam have now?",
          "answer": "15 + 6 = 21\n#### 21", "answer_value": 21}


def play(env, record: dict, turns: list[str]) -> tuple[list[dict], list[Step]]:
    """Run scripted model turns the way the rollout does; the messages and the steps."""
    history = env.reset(record)
    steps = []
    for turn in turns:
        history.append({"role": "assistant", "content": turn})
        step = as_step(env.step(list(history), turn))
        steps.append(step)
        history += step.observation or []
        if step.done:
            break
    return history, steps


def episode_reward(steps: list[Step]) -> float:
    return sum(s.reward for s in steps if s.reward is not None)


def tool_calls(steps: list[Step]) -> int:
    return sum("tool_call" in s.info for s in steps)


# --------------------------------------------------------------------------- arithmetic-tool


def test_right_answer_gets_one():
    _, steps = play(ArithmeticToolEnv(), RECORD, ["21"])
    assert steps == [Step(None, 1.0, True, {})]


def test_tool_call_then_right_answer_gets_one_with_one_tool_call():
    history, steps = play(ArithmeticToolEnv(), RECORD, ["<calculator>15 + 6</calculator>", "The answer is 21."])
    assert [s.reward for s in steps] == [None, 1.0] and [s.done for s in steps] == [False, True]
    assert steps[0].info == {"tool_call": "calculator", "tool_error": False}
    assert episode_reward(steps) == 1.0 and tool_calls(steps) == 1
    assert history[-2] == {"role": "user", "content": "Tool result: 21"}  # before the final answer turn
    assert [m["role"] for m in history[-4:]] == ["user", "assistant", "user", "assistant"]
    assert history[-4] == {"role": "user", "content": RECORD["prompt"]}


@pytest.mark.parametrize("answer", ["20", "twenty-one", "", "The answer is 21.5"])
def test_wrong_answer_gets_zero(answer):
    _, steps = play(ArithmeticToolEnv(), RECORD, [answer])
    assert episode_reward(steps) == 0.0 and steps[-1].done


def test_tool_call_then_wrong_answer_gets_zero():
    _, steps = play(ArithmeticToolEnv(), RECORD, ["<calculator>15 - 6</calculator>", "9"])
    assert episode_reward(steps) == 0.0 and tool_calls(steps) == 1


def test_tool_errors_are_observations_and_the_episode_goes_on():
    history, steps = play(ArithmeticToolEnv(), RECORD,
                          ["<calculator>15 +</calculator>", "<search>shells</search>", "<calculator>15+6</calculator>", "21"])
    assert [s.info.get("tool_error") for s in steps] == [True, True, False, None]
    start = len(ArithmeticToolEnv().reset(RECORD))
    assert history[start + 1]["content"].startswith("Tool result: error: calculator: cannot read")
    assert history[start + 3]["content"] == "Tool result: error: unknown tool 'search' (available: calculator)"
    assert episode_reward(steps) == 1.0 and tool_calls(steps) == 3


def test_final_answer_matches_the_arithmetic_reward():
    """The env's reward is reward=arithmetic's on the same turn, so env and plain GRPO numbers compare."""
    turns = ["21", "#### 21", "21.0", "2 1", "-21", "1,021", "The total is 15 + 6 = 21 shells.", "21 or 22"]
    want = arithmetic([""] * len(turns), turns, answer=[RECORD["answer"]] * len(turns))
    got = [episode_reward(play(ArithmeticToolEnv(), RECORD, [t])[1]) for t in turns]
    assert got == want and 0.0 in got and 1.0 in got


def test_reset_describes_the_calculator_in_the_chosen_format():
    tag_env, json_env = ArithmeticToolEnv(tool_format=TAG), ArithmeticToolEnv(tool_format=JSON, observation_role="tool")
    tag_msgs, json_msgs = tag_env.reset(RECORD), json_env.reset(RECORD)
    assert tag_msgs[0]["role"] == "system" and "<calculator>12*7</calculator>" in tag_msgs[0]["content"]
    assert tag_msgs[-1] == {"role": "user", "content": RECORD["prompt"]}
    example = json_msgs[0]["content"].split("write ", 1)[1].split(" and the result")[0]
    assert parse_tool_call(example, JSON).arguments == {"expression": "12*7"}  # the example is a valid call
    history, steps = play(json_env, RECORD, ['<tool_call>{"name": "calculator", "arguments": {"expression": "15+6"}}'
                                              "</tool_call>", "21"])
    assert history[-2] == {"role": "tool", "content": "21"} and episode_reward(steps) == 1.0


def test_reset_keeps_a_chat_record_and_its_system_text():
    record = {**RECORD, "messages": [{"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": RECORD["prompt"]}]}
    msgs = ArithmeticToolEnv().reset(record)
    assert [m["role"] for m in msgs[:1] + msgs[-1:]] == ["system", "user"] and msgs[0]["content"].endswith("\n\nBe brief.")
    assert "Be brief." not in str(msgs[1:])
    assert record["messages"][0] == {"role": "system", "content": "Be brief."}  # the record is not mutated



@pytest.mark.parametrize("fmt, role", [(TAG, "user"), (JSON, "tool")])
def test_worked_examples_are_episodes_the_env_scores_right(fmt, role):
    """Each worked example is a well-formed call, the calculator's true result and an answer the env
    rewards 1.0; the arithmetic is written out here."""
    env = ArithmeticToolEnv(tool_format=fmt, observation_role=role)
    msgs = env.reset(RECORD)
    examples = msgs[1:-1]
    assert [m["role"] for m in examples] == ["user", "assistant", role, "assistant"] * 3
    want = {"23+19": "42", "31-8": "23", "35-17": "18"}  # 23 + 19 = 42, 31 - 8 = 23, 35 - 17 = 18
    for k in range(0, len(examples), 4):
        problem, call, result, answer = examples[k : k + 4]
        parsed = parse_tool_call(call["content"], fmt)
        expression = parsed.arguments if fmt == TAG else parsed.arguments["expression"]
        assert result["content"].removeprefix("Tool result: ") == answer["content"] == want[expression]
        record = {"prompt": problem["content"], "answer_value": int(want[expression])}
        _, steps = play(ArithmeticToolEnv(tool_format=fmt, observation_role=role), record,
                        [call["content"], answer["content"]])
        assert [s.reward for s in steps] == [None, 1.0] and steps[0].info["tool_error"] is False


def test_worked_examples_are_not_builtin_problems():
    """The examples show their answers, so none may be a problem the run trains or evaluates on."""
    shown = {m["content"] for m in ArithmeticToolEnv().reset(RECORD)[1:-1:4]}  # each example opens with its problem
    prompts = {r["prompt"].removesuffix(" " + INSTRUCTION) for s in ("train", "test") for r in builtin_split(s)}
    assert len(shown) == 3 and not shown & prompts


@pytest.mark.parametrize("prompt, shown", [
    ("What is 2 + 2? " + INSTRUCTION, "What is 2 + 2?"),
    ("What is 2 + 2?\n" + INSTRUCTION + "  ", "What is 2 + 2?"),
    ("What is 2 + 2?", "What is 2 + 2?"),
    (INSTRUCTION + " What is 2 + 2?", INSTRUCTION + " What is 2 + 2?"),  # only at the end
    (INSTRUCTION, INSTRUCTION),  # never emptied
])
def test_the_answer_at_once_instruction_is_cut_from_the_problem(prompt, shown):
    msgs = ArithmeticToolEnv().reset({"prompt": prompt, "answer_value": 4})
    assert msgs[-1] == {"role": "user", "content": shown}


def test_an_env_is_reset_between_episodes():
    env = ArithmeticToolEnv()
    play(env, RECORD, ["21"])
    _, steps = play(env, {"prompt": "What is 2 + 2?", "answer_value": 4}, ["21"])
    assert episode_reward(steps) == 0.0


@pytest.mark.parametrize("env", [ArithmeticToolEnv(), SelfCorrectEnv()], ids=["arithmetic-tool", "self-correct"])
@pytest.mark.parametrize("record, match", [
    ({"prompt": "What is 2 + 2?"}, r"needs a numeric 'answer' or 'answer_value' field"),
    ({"prompt": "What is 2 + 2?", "answer": "four"}, r"needs a numeric 'answer'"),
    ({"prompt": "", "answer_value": 4}, r"needs a non-empty 'prompt' string"),
])
def test_records_without_an_answer_or_prompt(env, record, match):
    with pytest.raises(UserError, match=rf"^env '{env.name}'.*{match}"):
        env.reset(record)


def test_builtin_arithmetic_problems_all_reset_and_score():
    """Every builtin:arithmetic test problem: its own answer_value scores 1.0, one more scores 0.0."""
    make = make_env_factory("arithmetic-tool")
    for record in builtin_split("test"):
        assert episode_reward(play(make(), record, [str(record["answer_value"])])[1]) == 1.0
        assert episode_reward(play(make(), record, [str(record["answer_value"] + 1)])[1]) == 0.0


# --------------------------------------------------------------------------- self-correct


@pytest.mark.parametrize(
    "first, second, reward, first_correct, revised",
    [
        ("21", "21", 1.0, True, False),  # kept a right answer
        ("20", "21", 1.0, False, True),  # fixed a wrong one
        ("21", "20", 0.0, True, True),  # spoilt a right one
        ("20", "20", 0.0, False, False),  # kept a wrong one
    ],
)
def test_self_correct_rewards_the_final_answer_only(first, second, reward, first_correct, revised):
    history, steps = play(SelfCorrectEnv(), RECORD, [first, second])
    assert [s.reward for s in steps] == [None, reward] and [s.done for s in steps] == [False, True]
    assert history[2] == {"role": "user", "content": SelfCorrectEnv.CHECK}
    assert steps[1].info == {"first_correct": first_correct, "revised": revised}
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
