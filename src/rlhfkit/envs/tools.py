"""Tools a model calls during a multi-turn episode, and the formats it calls them in.

A tool is a Python callable with a JSON schema for its arguments (:class:`Tool`). The model's turn
is parsed for a call in one of two formats (docs/environments.md):

- ``tag`` (the default; small enough for a 135M model): ``<NAME>ARGUMENT</NAME>``, e.g.
  ``<calculator>12*7</calculator>``. A tool with one parameter takes the tag's text as that
  parameter; a tool with several takes a JSON object of arguments inside the tag. A closing tag
  missing at the end of the turn is accepted (generation may stop on it).
- ``json``, the format of Hermes/Qwen-style chat templates:
  ``<tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>``; chosen
  by :func:`tool_format` when the tokenizer's chat template writes tool calls this way.

Timeouts, exceptions and malformed calls become observations (``"error: ..."``) the model reads
on its next turn; running a tool never raises. The built-in tools (the calculator, lookup tables)
are in :mod:`rlhfkit.envs.calculator`.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlhfkit.core.imports import first_line
from rlhfkit.errors import UserError

TAG, JSON = "tag", "json"
FORMATS = (TAG, JSON)
MAX_OBSERVATION_CHARS = 1000  # a tool's output is cut here, so one call cannot fill the context
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_TAG_CALL = re.compile(r"<([A-Za-z_][A-Za-z0-9_-]*)>(.*?)(?:</\1>|$)", re.S)
_JSON_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)
_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}  # fmt: skip


class ToolError(Exception):
    """An error a tool reports on purpose; the model sees ``error: <message>``."""


@dataclass(frozen=True)
class Tool:
    """A callable the model may call by name.

    ``parameters`` is a JSON schema of type ``object`` (its ``properties`` are the keyword
    arguments of ``fn``, ``required`` the ones that must be given). ``fn`` returns the text (or a
    number, list or dict, written as JSON) the model reads. ``timeout_s`` bounds its wall time.
    """

    name: str
    description: str
    parameters: dict
    fn: Callable[..., Any]
    timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise UserError(f"tool name {self.name!r}: expected letters, digits, '_' or '-', starting with a letter")
        if not callable(self.fn):
            raise UserError(f"tool {self.name!r}: fn must be callable, got {type(self.fn).__name__}")
        params = self.parameters
        if not isinstance(params, dict) or params.get("type") != "object" or not isinstance(
            params.get("properties", {}), dict
        ):
            raise UserError(
                f"tool {self.name!r}: parameters must be a JSON schema like "
                '{"type": "object", "properties": {...}, "required": [...]}'
            )
        unknown = [r for r in params.get("required", []) if r not in params.get("properties", {})]
        if unknown:
            raise UserError(f"tool {self.name!r}: required parameter {unknown[0]!r} is not in properties")
        if not isinstance(self.timeout_s, (int, float)) or not self.timeout_s > 0:
            raise UserError(f"tool {self.name!r}: timeout_s must be a positive number of seconds")

    @property
    def properties(self) -> dict:
        return self.parameters.get("properties", {})

    def schema(self) -> dict:
        """The function schema that transformers' ``apply_chat_template(tools=[...])`` accepts."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolCall:
    """A call parsed from a model turn. ``arguments`` is a dict (json format) or the tag's text
    (tag format); ``error`` is set for a malformed call, which runs as an error observation."""

    name: str
    arguments: dict | str
    error: str | None = None


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model reads
    error: bool  # the call was malformed, unknown, timed out or raised


# --------------------------------------------------------------------------- parsing and formatting


def parse_tool_call(text: str, fmt: str = TAG) -> ToolCall | None:
    """The first tool call in a model turn, or None when the turn calls no tool (it is an answer)."""
    if fmt == TAG:
        m = _TAG_CALL.search(text)
        return ToolCall(m.group(1), m.group(2).strip()) if m else None
    if fmt != JSON:
        raise UserError(f"tool call format {fmt!r}: expected one of {', '.join(FORMATS)}")
    m = _JSON_CALL.search(text)
    if m is None:
        return None
    try:
        body = json.loads(m.group(1).strip())
    except ValueError as e:
        return ToolCall("", {}, f"malformed tool call: invalid JSON ({first_line(e)})")
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return ToolCall("", {}, 'malformed tool call: expected {"name": ..., "arguments": {...}}')
    args = body.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string, as OpenAI's API does
        try:
            args = json.loads(args)
        except ValueError:
            pass
    if not isinstance(args, dict):
        return ToolCall(body["name"], {}, f"malformed tool call: {body['name']}: arguments must be a JSON object")
    return ToolCall(body["name"], args)


def format_call(tool: Tool, arguments: dict, fmt: str = TAG) -> str:
    """The text of a call in ``fmt``; :func:`parse_tool_call` reads it back (used for examples in prompts)."""
    if fmt == JSON:
        return "<tool_call>" + json.dumps({"name": tool.name, "arguments": arguments}) + "</tool_call>"
    if len(tool.properties) == 1 and len(arguments) == 1:
        (value,) = arguments.values()
        return f"<{tool.name}>{value}</{tool.name}>"
    return f"<{tool.name}>{json.dumps(arguments)}</{tool.name}>"


def describe_tools(tools: Sequence[Tool], fmt: str = TAG) -> str:
    """A short description of the tools and how to call them, for a system message."""
    lines = ["You can use these tools:"]
    for tool in tools:
        params = ", ".join(tool.properties)
        if fmt == JSON:
            lines.append(f"- {tool.name}({params}): {tool.description}")
        elif len(tool.properties) == 1:
            lines.append(f"- {tool.name}: {tool.description} Write <{tool.name}>{params.upper()}</{tool.name}>.")
        else:
            lines.append(f"- {tool.name}: {tool.description} Write <{tool.name}>{{JSON arguments: {params}}}</{tool.name}>.")
    if fmt == JSON:
        lines.append('To call one, write <tool_call>{"name": NAME, "arguments": {...}}</tool_call>.')
    lines.append("The result comes back in the next message.")
    return "\n".join(lines)


# --------------------------------------------------------------------------- running


def run_tool_call(call: ToolCall, tools: Mapping[str, Tool] | Sequence[Tool]) -> str:
    """The observation text for ``call``: the tool's output or ``error: ...``; never raises."""
    return call_tool(call, tools).text


def call_tool(call: ToolCall, tools: Mapping[str, Tool] | Sequence[Tool]) -> ToolResult:
    """Run ``call`` against ``tools``: the observation text and whether it is an error."""
    table = dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
    if call.error:
        return ToolResult(f"error: {call.error}", True)
    tool = table.get(call.name)
    if tool is None:
        names = ", ".join(sorted(table)) or "none"
        return ToolResult(f"error: unknown tool {call.name!r} (available: {names})", True)
    try:
        kwargs = bind_arguments(tool, call.arguments)
        value = _run_with_timeout(tool.fn, kwargs, tool.timeout_s)
    except ToolError as e:
        return ToolResult(_clip(f"error: {e}"), True)
    except TimeoutError:
        return ToolResult(f"error: {tool.name} took longer than {tool.timeout_s:g} s", True)
    except (Exception, SystemExit) as e:  # anything a user tool raises is the model's observation, not a crash
        return ToolResult(_clip(f"error: {tool.name} failed: {type(e).__name__}: {first_line(e)}"), True)
    return ToolResult(_clip(_as_text(value)), False)


def bind_arguments(tool: Tool, arguments: dict | str) -> dict:
    """Keyword arguments for ``tool.fn``, checked against its schema (top level: required, types).

    A tag call's text is the single parameter's value (a number where the schema asks for one),
    or a JSON object when the tool has several parameters. Raises ToolError, which the model sees.
    """
    props = tool.properties
    if isinstance(arguments, str):
        arguments = _tag_arguments(tool, arguments)
    unknown = [k for k in arguments if k not in props]
    if unknown:
        raise ToolError(f"{tool.name}: unknown argument {unknown[0]!r} (expected: {', '.join(props) or 'none'})")
    missing = [k for k in tool.parameters.get("required", []) if k not in arguments]
    if missing:
        raise ToolError(f"{tool.name}: missing argument {missing[0]!r}")
    for key, value in arguments.items():
        kind = props[key].get("type") if isinstance(props[key], dict) else None
        ok = _JSON_TYPES.get(kind) if isinstance(kind, str) else None
        if ok is not None and (not isinstance(value, ok) or (isinstance(value, bool) and kind != "boolean")):
            raise ToolError(f"{tool.name}: argument {key!r} must be {_a(kind)}, got {type(value).__name__}")
    return dict(arguments)


def _tag_arguments(tool: Tool, text: str) -> dict:
    props = tool.properties
    if len(props) == 1:
        (key, schema), = props.items()
        kind = schema.get("type") if isinstance(schema, dict) else None
        if not text and key in tool.parameters.get("required", []):
            raise ToolError(f"{tool.name}: missing argument {key!r} (write <{tool.name}>{key.upper()}</{tool.name}>)")
        if kind in ("integer", "number"):
            try:
                return {key: int(text) if kind == "integer" else float(text)}
            except ValueError:
                raise ToolError(f"{tool.name}: {key!r} must be {_a(kind)}") from None
        return {key: text}
    if not props:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ToolError(f"{tool.name}: write its arguments ({', '.join(props)}) as a JSON object inside the tag")
    return value


def _a(kind: str) -> str:
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def _run_with_timeout(fn: Callable[..., Any], kwargs: dict, timeout_s: float) -> Any:
    """``fn(**kwargs)`` in a worker thread, waiting at most ``timeout_s``.

    A Python thread cannot be killed: a tool that overruns keeps running in the background
    (a daemon thread, so it never blocks exit) and its result is dropped. Tools that may hang
    for good should bound their own work (the calculator bounds its numbers).
    """
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn(**kwargs)
        except BaseException as e:  # SystemExit from a user tool too: it must not end the worker silently
            box["error"] = e

    worker = threading.Thread(target=work, name="rlhfkit-tool", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise TimeoutError
    if "error" in box:
        raise box["error"]
    return box.get("value")


def format_number(value: int | float) -> str:
    """``12`` -> "12", ``3.0`` -> "3", ``2.5`` -> "2.5": integral values read as whole numbers."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_number(value)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _clip(text: str) -> str:
    return text if len(text) <= MAX_OBSERVATION_CHARS else text[:MAX_OBSERVATION_CHARS] + " ... (cut)"


# --------------------------------------------------------------------------- chat templates


def chat_template_text(tokenizer: Any) -> str:
    """The tokenizer's chat template as text ('' without one); of several, the tool-use one."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("tool_use") or template.get("default") or ""
    return template if isinstance(template, str) else ""


def tool_format(tokenizer: Any) -> str:
    """``json`` when the chat template writes tool calls as ``<tool_call>{json}</tool_call>``
    (Hermes/Qwen style), else ``tag`` (SmolLM2's template has no tool format)."""
    return JSON if "<tool_call>" in chat_template_text(tokenizer) else TAG


def observation_role(tokenizer: Any) -> str:
    """``tool`` when the chat template handles the tool role and renders its content, else ``user``.

    A template that never names the role (SmolLM2's) would print ``<|im_start|>tool``, a header
    the model never saw in training, so tool results go in a user message there.
    """
    template = chat_template_text(tokenizer)
    if not re.search(r"""['"]tool['"]""", template):
        return "user"
    probe = "rlhfkit-probe-4711"
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": probe},
    ]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    except Exception:  # templates that reject the role raise their own exception types
        return "user"
    return "tool" if probe in str(rendered) else "user"


def observation_message(text: str, role: str = "user") -> dict:
    """The message that carries a tool's output: role ``tool``, or ``user`` with a ``Tool result:`` prefix."""
    if role == "tool":
        return {"role": "tool", "content": text}
    return {"role": "user", "content": f"Tool result: {text}"}
