"""Tools of multi-turn environments: the calculator, the two call formats, and every way a call
can go wrong turning into an observation (rlhfkit.envs.tools)."""

from __future__ import annotations

import re
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.envs.calculator import CALCULATOR, calculator, evaluate_arithmetic, make_lookup_tool
from rlhfkit.envs.tools import (
    JSON,
    TAG,
    Tool,
    ToolCall,
    ToolError,
    call_tool,
    describe_tools,
    format_call,
    observation_message,
    observation_role,
    parse_tool_call,
    run_tool_call,
    tool_format,
)
from rlhfkit.errors import UserError

# --------------------------------------------------------------------------- calculator


@pytest.mark.parametrize(
    "expression, value",
    [
        ("12*7", 84),
        ("15 + 6", 21),
        ("20 - 7 - 3", 10),  # left to right: (20 - 7) - 3
        ("2 + 3 * 4", 14),  # * before +
        ("(2 + 3) * 4", 20),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("-7 // 2", -4),  # floor, as Python
        ("-3 % 5", 2),  # sign of the divisor, as Python
        ("2 ** 10", 1024),
        ("2 ** 3 ** 2", 512),  # right-associative: 2 ** 9
        ("-2 ** 2", -4),  # unary minus binds looser than **
        ("(-2) ** 2", 4),
        ("+5", 5),
        ("2 ** -2", 0.25),
        ("1.5 * 4", 6.0),
        ("6 × 7", 42),
        ("84 ÷ 12", 7.0),
        ("10 ** 300", 10**300),  # the largest magnitude allowed
    ],
)
def test_calculator_golden_values(expression, value):
    got = evaluate_arithmetic(expression)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    "expression, text",
    [("12*7", "84"), ("12/4", "3"), ("7/2", "3.5"), ("2**-2", "0.25"), ("-0.5*4", "-2")],
)
def test_calculator_writes_integral_results_as_whole_numbers(expression, text):
    assert calculator(expression) == text


@pytest.mark.parametrize(
    "expression, match",
    [
        ("x + 1", r"found the name 'x'"),
        ("__import__('os').system('true')", r"found a function call"),
        ("abs(-3)", r"found a function call"),
        ("(1).real", r"found an attribute"),
        ("'ab' * 3", r"found 'ab'"),
        ("True + 1", r"found True"),
        ("1j * 2", r"found 1j"),
        ("[1, 2]", r"found a List"),
        ("lambda: 1", r"found a Lambda"),
        ("1 if 1 else 2", r"found a IfExp"),
        ("2 ^ 3", r"operator \^; use \*\* for powers"),
        ("1 << 3", r"operator <<"),
        ("~1", r"operator ~"),
        ("1 < 2", r"found a Compare"),
        ("1 +", r"cannot read"),
        ("", r"empty expression"),
        ("1+" * 150 + "1", r"longer than 200 characters"),
        ("1 / 0", r"division by zero"),
        ("1 // 0", r"division by zero"),
        ("5 % 0", r"division by zero"),
        ("0 ** -1", r"division by zero"),
        ("9 ** 9 ** 9", r"too large"),
        ("10 ** 301", r"too large"),
        ("2 ** 1e300", r"too large"),
        ("0.5 ** -5000", r"too large"),
        ("10 ** 300 * 10", r"too large"),
        ("1e400", r"too large"),
        ("(-8) ** 0.5", r"not a real number"),
    ],
)
def test_calculator_refuses(expression, match):
    with pytest.raises(ToolError, match=match):
        evaluate_arithmetic(expression)


def test_huge_power_is_refused_without_computing_it():
    # 9**9**9 has ~370 million digits; refusing it must not start computing it. Run in a thread so a
    # regression shows as a failed join rather than a hung test run (no timing is asserted).
    out: list[str] = []
    worker = threading.Thread(target=lambda: out.append(run_tool_call(ToolCall("calculator", "9**9**9"), [CALCULATOR])),
                              daemon=True)
    worker.start()
    worker.join(60)
    assert out and out[0].startswith("error: calculator: result too large")


def _expressions():
    """(text) of random small-integer expressions; powers only to a literal 0..3 so Python stays fast."""
    leaf = st.integers(-20, 20).map(lambda n: f"({n})" if n < 0 else str(n))

    def extend(inner):
        binary = st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "//", "%"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        )
        power = st.tuples(inner, st.integers(0, 3)).map(lambda t: f"({t[0]} ** {t[1]})")
        unary = inner.map(lambda e: f"-{e}")
        return binary | power | unary

    return st.recursive(leaf, extend, max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(_expressions())
def test_calculator_agrees_with_python(expression):
    try:
        want = eval(expression, {"__builtins__": {}})  # noqa: S307 - the oracle, on generated arithmetic only
    except ZeroDivisionError:
        with pytest.raises(ToolError, match="division by zero"):
            evaluate_arithmetic(expression)
        return
    except OverflowError:
        with pytest.raises(ToolError):
            evaluate_arithmetic(expression)
        return
    if isinstance(want, complex) or abs(want) > 1e300:
        with pytest.raises(ToolError):
            evaluate_arithmetic(expression)
        return
    got = evaluate_arithmetic(expression)
    assert type(got) is type(want)
    assert got == want or abs(got - want) <= 1e-12 * max(1.0, abs(want))


# --------------------------------------------------------------------------- formats


@pytest.mark.parametrize(
    "text, name, arguments",
    [
        ("<calculator>12*7</calculator>", "calculator", "12*7"),
        ("Let me compute. <calculator> 15 + 6 </calculator> then answer", "calculator", "15 + 6"),
        ("<calculator>3+4", "calculator", "3+4"),  # generation stopped before the closing tag
        ("<calculator>1+1</calculator><calculator>2+2</calculator>", "calculator", "1+1"),  # the first call
        ('<lookup>{"key": "a"}</lookup>', "lookup", '{"key": "a"}'),
        ("<search>cats</search>", "search", "cats"),  # unknown tools parse; running them reports it
    ],
)
def test_tag_format_parses(text, name, arguments):
    assert parse_tool_call(text, TAG) == ToolCall(name, arguments)


@pytest.mark.parametrize(
    "text, name, arguments",
    [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>',
         "calculator", {"expression": "12*7"}),
        ('ok\n<tool_call>\n{"name": "lookup", "arguments": {"key": "a"}}\n</tool_call>', "lookup", {"key": "a"}),
        ('<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"b\\"}"}', "lookup", {"key": "b"}),  # string args
        ('<tool_call>{"name": "now"}</tool_call>', "now", {}),
    ],
)
def test_json_format_parses(text, name, arguments):
    assert parse_tool_call(text, JSON) == ToolCall(name, arguments)


@pytest.mark.parametrize("text", ["The answer is 21.", "21", "", "3 < 4 and 5 > 2"])
def test_plain_answers_are_not_calls(text):
    assert parse_tool_call(text, TAG) is None
    assert parse_tool_call(text, JSON) is None


def test_a_tag_call_is_not_a_json_call_and_back():
    assert parse_tool_call("<calculator>1+1</calculator>", JSON) is None
    tagged = parse_tool_call('<tool_call>{"name": "calculator"}</tool_call>', TAG)
    assert tagged is not None and tagged.name == "tool_call"  # and running it says "unknown tool"


@pytest.mark.parametrize("fmt", [TAG, JSON])
@pytest.mark.parametrize("arguments", [{"expression": "12*7"}, {"expression": "(1 + 2) / 3"}])
def test_format_call_round_trips_through_the_parser(fmt, arguments):
    call = parse_tool_call(format_call(CALCULATOR, arguments, fmt), fmt)
    assert call is not None and call.name == "calculator"
    assert call_tool(call, [CALCULATOR]) == call_tool(ToolCall("calculator", arguments), [CALCULATOR])


def test_unknown_format_is_a_user_error():
    with pytest.raises(UserError, match="tool call format 'xml'"):
        parse_tool_call("<a>b</a>", "xml")


def test_describe_tools_names_every_tool_and_the_call_syntax():
    lookup = make_lookup_tool({"a": 1})
    tag = describe_tools([CALCULATOR, lookup], TAG)
    assert "<calculator>EXPRESSION</calculator>" in tag and "<lookup>KEY</lookup>" in tag
    json_text = describe_tools([CALCULATOR, lookup], JSON)
    assert "calculator(expression)" in json_text and "lookup(key)" in json_text and "<tool_call>" in json_text


# --------------------------------------------------------------------------- running: errors become observations


def _slow(seconds: float) -> str:
    time.sleep(seconds)
    return "done"


def _raises(x: str) -> str:
    raise ValueError(f"bad input {x}\nsecond line")


PAIR = Tool("pair", "Joins two words.", {"type": "object", "properties": {"a": {"type": "string"},
            "b": {"type": "integer"}}, "required": ["a", "b"]}, lambda a, b: f"{a}-{b}")
SLOW = Tool("slow", "Sleeps.", {"type": "object", "properties": {"seconds": {"type": "number"}}}, _slow, timeout_s=0.2)
NAP = Tool("nap", "Sleeps.", {"type": "object", "properties": {"seconds": {"type": "number"}}}, _slow, timeout_s=60)
RAISES = Tool("raises", "Raises.", {"type": "object", "properties": {"x": {"type": "string"}}}, _raises)
LOOKUP = make_lookup_tool({"capital of France": "Paris", "answer": 42})
TOOLS = [CALCULATOR, PAIR, SLOW, NAP, RAISES, LOOKUP]


@pytest.mark.parametrize(
    "call, text",
    [
        (ToolCall("calculator", "12*7"), "84"),
        (ToolCall("calculator", {"expression": "2**10"}), "1024"),
        (ToolCall("lookup", "capital of France"), "Paris"),
        (ToolCall("lookup", {"key": "answer"}), "42"),  # a number is written as text
        (ToolCall("pair", '{"a": "x", "b": 3}'), "x-3"),  # several parameters: JSON inside the tag
        (ToolCall("pair", {"a": "x", "b": 3}), "x-3"),
        (ToolCall("nap", "0"), "done"),  # a tag's text is converted to the schema's number
    ],
)
def test_calls_that_work(call, text):
    assert call_tool(call, TOOLS).text == text and not call_tool(call, TOOLS).error


@pytest.mark.parametrize(
    "call, match",
    [
        (parse_tool_call("<tool_call>{name: calculator}</tool_call>", JSON), r"^error: malformed tool call: invalid JSON"),
        (parse_tool_call("<tool_call>[1, 2]</tool_call>", JSON), r'^error: malformed tool call: expected \{"name"'),
        (parse_tool_call('<tool_call>{"name": "pair", "arguments": [1]}</tool_call>', JSON),
         r"^error: malformed tool call: pair: arguments must be a JSON object"),
        (ToolCall("search", "cats"), r"^error: unknown tool 'search' \(available: calculator, lookup, nap, pair, raises, slow\)"),
        (ToolCall("pair", {"a": "x"}), r"^error: pair: missing argument 'b'"),
        (ToolCall("pair", {"a": "x", "b": 3, "c": 1}), r"^error: pair: unknown argument 'c' \(expected: a, b\)"),
        (ToolCall("pair", {"a": "x", "b": "3"}), r"^error: pair: argument 'b' must be an integer, got str"),
        (ToolCall("pair", {"a": "x", "b": True}), r"^error: pair: argument 'b' must be an integer, got bool"),
        (ToolCall("pair", "x 3"), r"^error: pair: write its arguments \(a, b\) as a JSON object"),
        (ToolCall("calculator", ""), r"^error: calculator: missing argument 'expression'"),
        (ToolCall("calculator", "1/0"), r"^error: calculator: division by zero"),
        (ToolCall("slow", "soon"), r"^error: slow: 'seconds' must be a number"),
        (ToolCall("lookup", "capital of Spain"), r"^error: lookup: no entry for 'capital of Spain'"),
        (ToolCall("raises", "q"), r"^error: raises failed: ValueError: bad input q$"),  # first line only
        (ToolCall("slow", {"seconds": 30}), r"^error: slow took longer than 0.2 s$"),
    ],
)
def test_failures_become_error_observations(call, match):
    result = call_tool(call, TOOLS)
    assert result.error and re.search(match, result.text), result.text
    assert run_tool_call(call, TOOLS) == result.text


def test_tool_that_exits_or_returns_odd_values():
    exits = Tool("exits", "Exits.", {"type": "object", "properties": {}}, lambda: exit(3))
    odd = Tool("odd", "Returns a set.", {"type": "object", "properties": {}}, lambda: {1})
    huge = Tool("huge", "Returns a lot.", {"type": "object", "properties": {}}, lambda: "x" * 5000)
    assert call_tool(ToolCall("exits", {}), [exits]).text == "error: exits failed: SystemExit: 3"
    assert call_tool(ToolCall("odd", ""), [odd]).text == "{1}"
    text = call_tool(ToolCall("huge", {}), [huge]).text
    assert text == "x" * 1000 + " ... (cut)"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"name": "two words"}, r"tool name 'two words'"),
        ({"fn": 3}, r"fn must be callable"),
        ({"parameters": {"type": "string"}}, r"parameters must be a JSON schema"),
        ({"parameters": {"type": "object", "properties": {}, "required": ["x"]}}, r"'x' is not in properties"),
        ({"timeout_s": 0}, r"timeout_s must be a positive number"),
    ],
)
def test_bad_tool_definitions_are_user_errors(kwargs, match):
    spec = {"name": "t", "description": "", "parameters": {"type": "object", "properties": {}}, "fn": lambda: 1}
    with pytest.raises(UserError, match=match):
        Tool(**{**spec, **kwargs})


def test_schema_is_what_apply_chat_template_takes(tiny_tokenizer):
    schema = CALCULATOR.schema()
    assert schema == {"type": "function", "function": {"name": "calculator", "description": CALCULATOR.description,
                                                       "parameters": CALCULATOR.parameters}}
    tiny_tokenizer.chat_template = "{% for t in tools %}{{ t.function.name }}:{{ t.function.parameters.required[0] }}{% endfor %}"
    assert tiny_tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tools=[schema],
                                              tokenize=False) == "calculator:expression"


# --------------------------------------------------------------------------- chat templates

# A small template in the Hermes/Qwen manner, written for this test: tools listed in the system
# turn, calls as <tool_call> JSON, tool results in a user turn wrapped in <tool_response>.
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}"
    "</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# A template that names the tool role only to reject it.
STRICT_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tool role') }}{% endif %}"
    "{{ m.content }}{% endfor %}"
)


def test_template_without_tool_format_uses_tags_and_user_messages(tiny_tokenizer):
    assert tool_format(tiny_tokenizer) == TAG and observation_role(tiny_tokenizer) == "user"
    tiny_tokenizer.chat_template = None
    assert tool_format(tiny_tokenizer) == TAG and observation_role(tiny_tokenizer) == "user"


def test_hermes_style_template_uses_json_and_the_tool_role(tiny_tokenizer):
    tiny_tokenizer.chat_template = TOOL_TEMPLATE
    assert tool_format(tiny_tokenizer) == JSON and observation_role(tiny_tokenizer) == "tool"
    tiny_tokenizer.chat_template = {"default": "{{ messages[0].content }}", "tool_use": TOOL_TEMPLATE}
    assert tool_format(tiny_tokenizer) == JSON  # the tool-use template of several


def test_template_that_rejects_the_tool_role_gets_user_messages(tiny_tokenizer):
    tiny_tokenizer.chat_template = STRICT_TEMPLATE
    assert observation_role(tiny_tokenizer) == "user"


def test_observation_messages():
    assert observation_message("84", "tool") == {"role": "tool", "content": "84"}
    assert observation_message("84", "user") == {"role": "user", "content": "Tool result: 84"}


@pytest.mark.slow
def test_default_model_template_renders_the_tag_format_episode():
    """SmolLM2's template has no tool format and never names the tool role: tag calls, results as user turns."""
    from rlhfkit.models.loading import DEFAULT_MODEL, load_tokenizer

    tok = load_tokenizer(DEFAULT_MODEL)
    assert tool_format(tok) == TAG and observation_role(tok) == "user"
    messages = [
        {"role": "user", "content": "What is 12 times 7?"},
        {"role": "assistant", "content": "<calculator>12*7</calculator>"},
        observation_message(run_tool_call(ToolCall("calculator", "12*7"), [CALCULATOR]), "user"),
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.endswith(
        "<|im_start|>assistant\n<calculator>12*7</calculator><|im_end|>\n"
        "<|im_start|>user\nTool result: 84<|im_end|>\n<|im_start|>assistant\n"
    )
