"""Built-in environments: ``arithmetic-tool`` and ``self-correct`` (docs/environments.md).

Both read the problems of ``builtin:arithmetic`` (the ones plain ``rlhfkit grpo`` trains on), or
any prompt records with an ``answer`` ("... #### 12" or a number) or ``answer_value`` field, and
score a final answer exactly as ``reward=arithmetic`` does.
"""

from __future__ import annotations

from rlhfkit.data.arithmetic import INSTRUCTION
from rlhfkit.envs.base import Message, Step, check_messages
from rlhfkit.envs.calculator import CALCULATOR
from rlhfkit.envs.tools import (
    TAG,
    Tool,
    ToolCall,
    call_tool,
    format_call,
    observation_message,
    parse_tool_call,
)
from rlhfkit.errors import UserError
from rlhfkit.rewards.builtins import arithmetic, extract_final_number, reference_value


def _reference(record: dict, env: str) -> dict:
    """The record's answer fields, as ``reward=arithmetic`` takes them; UserError when it has none."""
    if not isinstance(record, dict) or reference_value(record.get("answer"), record.get("answer_value")) is None:
        raise UserError(
            f"env {env!r} needs a numeric 'answer' or 'answer_value' field on every prompt record "
            "(data=builtin:arithmetic has them)"
        )
    return {"answer": [record.get("answer")], "answer_value": [record.get("answer_value")]}


def _exact_match(turn: str, reference: dict) -> float:
    """1.0 when the turn's final number equals the reference, else 0.0 (the `arithmetic` reward)."""
    return arithmetic([""], [turn], **reference)[0]


def _prompt_messages(record: dict, env: str) -> list[Message]:
    """The record's conversation (chat records) or its prompt as one user message."""
    if record.get("messages") is not None:
        return [dict(m) for m in check_messages(record["messages"], f"env {env!r}: record field 'messages'")]
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise UserError(f"env {env!r}: every prompt record needs a non-empty 'prompt' string")
    return [{"role": "user", "content": prompt}]


def _without_instruction(messages: list[Message]) -> list[Message]:
    """The messages with builtin:arithmetic's "Answer with just the number." cut from the end of
    the last user message: it asks for a bare number at once, against the examples' tool call
    (the system message asks for just the number once the answer is known)."""
    out = [dict(m) for m in messages]
    if out and out[-1]["role"] == "user" and isinstance(out[-1].get("content"), str):
        text = out[-1]["content"].rstrip()
        if text.endswith(INSTRUCTION) and text != INSTRUCTION:
            out[-1]["content"] = text[: -len(INSTRUCTION)].rstrip()
    return out


class ArithmeticToolEnv:
    """``arithmetic-tool``: an arithmetic word problem, a calculator tool, exact-match reward.

    reset: a system message that describes the calculator and its call format, worked examples
    (a problem, a calculator call, its result, the answer; :meth:`example_messages`), then the
    problem. SmolLM2-135M-Instruct at T=1 never calls the tool from the description alone; the
    examples make it call in some first turns (docs/environments.md has the measured rates).
    step: a turn that calls a tool gets the tool's output as the next message (reward None, not
    done; info ``{"tool_call": name, "tool_error": bool}``). Any other turn is the final answer:
    reward 1.0 if its final number equals the record's answer, else 0.0, and the episode ends.
    Calling the calculator is never rewarded by itself; only the answer is.
    """

    name = "arithmetic-tool"
    prompts = "builtin:arithmetic"  # the data a run uses when `prompts` is left at its default
    exact_match = True  # the episode reward is 1 or 0 for a right or wrong answer: its mean is an accuracy
    # (problem, expression) of the worked examples; none of them is a builtin:arithmetic problem
    # (the operands of those stay <= 20), so no test answer is shown.
    EXAMPLES = (
        ("Lily has 23 stickers and buys 19 more. How many stickers does Lily have now?", "23+19"),
        ("Ana has 31 marbles and gives 8 to a friend. How many marbles does Ana have now?", "31-8"),
        ("What is 35 minus 17?", "35-17"),
    )

    def __init__(self, tool_format: str = TAG, observation_role: str = "user", tools: tuple[Tool, ...] = (CALCULATOR,)):
        self.tool_format = tool_format
        self.observation_role = observation_role
        self.tools = tuple(tools)
        self._reference: dict | None = None

    def system_prompt(self) -> str:
        example = format_call(CALCULATOR, {"expression": "12*7"}, self.tool_format)
        return (
            f"You can use a calculator: write {example} and the result comes back in the next message. "
            "When you know the answer, reply with just the number."
        )

    def example_messages(self) -> list[Message]:
        """The worked examples as earlier turns of the conversation, in this env's call format and
        observation role: per example a user problem, an assistant call, its result, the answer."""
        messages: list[Message] = []
        for problem, expression in self.EXAMPLES:
            result = call_tool(ToolCall(CALCULATOR.name, expression), (CALCULATOR,)).text
            messages += [
                {"role": "user", "content": problem},
                {"role": "assistant", "content": format_call(CALCULATOR, {"expression": expression}, self.tool_format)},
                observation_message(result, self.observation_role),
                {"role": "assistant", "content": result},
            ]
        return messages

    def reset(self, record: dict) -> list[Message]:
        self._reference = _reference(record, self.name)
        messages = _prompt_messages(record, self.name)
        system = self.system_prompt()
        if messages and messages[0]["role"] == "system":  # keep the data's own system text after ours
            system += "\n\n" + messages.pop(0)["content"]
        return [{"role": "system", "content": system}, *self.example_messages(), *_without_instruction(messages)]

    def step(self, history: list[Message], model_turn: str) -> Step:
        if self._reference is None:
            raise RuntimeError("arithmetic-tool: step() before reset()")
        call = parse_tool_call(model_turn, self.tool_format)
        if call is not None:
            result = call_tool(call, self.tools)
            obs = [observation_message(result.text, self.observation_role)]
            return Step(obs, None, False, {"tool_call": call.name, "tool_error": result.error})
        return Step(None, _exact_match(model_turn, self._reference), True, {})


class SelfCorrectEnv:
    """``self-correct``: the model answers, reads "check your answer", and may revise.

    Two model turns. After the first, the observation is a user message asking the model to check
    its answer (reward None). The second turn is the final answer: reward 1.0 if its final number
    equals the record's answer, else 0.0, and the episode ends. The first answer is not rewarded,
    so the episode's return is the final answer's correctness, on the same scale as single-turn
    ``reward=arithmetic``: keeping a right answer and fixing a wrong one pay the same, and changing
    a right answer into a wrong one loses it. info on the last turn: ``first_correct`` (bool) and
    ``revised`` (the final number differs from the first). Needs ``max_turns`` >= 2.
    """

    name = "self-correct"
    prompts = "builtin:arithmetic"
    exact_match = True
    CHECK = "Check your answer. If it is wrong, reply with the correct number; if it is right, repeat it."

    def __init__(self) -> None:
        self._reference: dict | None = None
        self._first: str | None = None

    def reset(self, record: dict) -> list[Message]:
        self._reference = _reference(record, self.name)
        self._first = None
        return _prompt_messages(record, self.name)

    def step(self, history: list[Message], model_turn: str) -> Step:
        if self._reference is None:
            raise RuntimeError("self-correct: step() before reset()")
        if self._first is None:
            self._first = model_turn
            return Step([{"role": "user", "content": self.CHECK}], None, False, {})
        info = {
            "first_correct": _exact_match(self._first, self._reference) == 1.0,
            "revised": extract_final_number(self._first) != extract_final_number(model_turn),
        }
        return Step(None, _exact_match(model_turn, self._reference), True, info)
