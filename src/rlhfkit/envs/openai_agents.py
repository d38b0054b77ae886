"""A built-in agent written as users write theirs: plain OpenAI-client code with a calculator tool.

    rlhfkit grpo agent=python:rlhfkit.envs.openai_agents:calculator_agent

It solves the problems of ``builtin:arithmetic`` (the ones ``env=arithmetic-tool`` uses) with the
``tools`` / ``tool_calls`` of the chat-completions API: the model may call ``calculator``, the
agent runs it and sends the result back as a ``tool`` message, and the episode's reward is 1.0
when the final answer's number equals the record's answer (as ``reward=arithmetic``), else 0.0.
The same worked examples as ``arithmetic-tool`` come first, written as OpenAI tool calls.
Nothing in it knows about rlhfkit's training: it runs the same against any OpenAI-compatible server.
"""

from __future__ import annotations

import json

from rlhfkit.envs.builtin import ArithmeticToolEnv
from rlhfkit.envs.calculator import CALCULATOR, evaluate_arithmetic
from rlhfkit.envs.tools import ToolError, format_number
from rlhfkit.rewards.builtins import arithmetic

MODEL = "policy"  # the name rlhfkit's training server answers to by default (agent_model=)
MAX_TURNS = 4
CALCULATOR_TOOL = {"type": "function", "function": {"name": CALCULATOR.name, "description": CALCULATOR.description,
                                                    "parameters": CALCULATOR.parameters}}
SYSTEM = "You can use a calculator tool. When you know the answer, reply with just the number."


def calculate(arguments: str) -> str:
    """The calculator's reply to a call's JSON arguments (an error message on bad input)."""
    try:
        expression = json.loads(arguments or "{}").get("expression", "")
        return format_number(evaluate_arithmetic(str(expression)))
    except (ValueError, AttributeError, ToolError) as e:
        return f"error: {e}"


def example_messages() -> list[dict]:
    """Per worked example: the problem, a calculator call, its result, the answer."""
    messages: list[dict] = []
    for k, (problem, expression) in enumerate(ArithmeticToolEnv.EXAMPLES):
        call = {"id": f"example_{k}", "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}
        result = calculate(call["function"]["arguments"])
        messages += [{"role": "user", "content": problem}, {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": call["id"], "content": result},
                     {"role": "assistant", "content": result}]
    return messages


def calculator_agent(client, record: dict) -> float:
    """One episode: up to MAX_TURNS replies; 1.0 when the final answer is right, else 0.0."""
    messages = [{"role": "system", "content": SYSTEM}, *example_messages(),
                {"role": "user", "content": record["prompt"]}]
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[CALCULATOR_TOOL], max_tokens=48)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            answer = message.content or ""
            return arithmetic([""], [answer], answer=[record.get("answer")], answer_value=[record.get("answer_value")])[0]
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(call.function.arguments)})
    return 0.0
