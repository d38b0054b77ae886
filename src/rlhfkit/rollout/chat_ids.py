"""OpenAI chat messages -> the prompt token ids the model continues, token for token.

A chat request's messages go through the model's chat template as a prompt does (rollout/
multiturn.py `render`). Two things are added for agents:

- Tools. A template that mentions `tools` gets the request's tool schemas and the assistant
  messages' `tool_calls` as they are. Any other template (SmolLM2's) gets the schemas described in
  the system message, and each past tool call written into its assistant message as
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes/Qwen's format): the format the
  model is asked to answer in, and the one `parse_tool_calls` reads back out of its replies.
- Exact ids of earlier replies. An assistant message that is one of the episode's own earlier
  replies (same text and tool calls: `reply_key`) is not re-tokenised: its place in the rendered
  text holds a marker, and the ids the model sampled are spliced in there. Without this a
  re-tokenised reply (BPE may split the same text differently, the template may strip it) would
  make the next prompt differ from what the model saw, and the episode could not be trained as
  one sequence. After a reply that ended with the stop token, the template's own end-of-turn text
  is dropped where it repeats that token (as in rollout/multiturn.py `env_text`).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping

from rlhfkit.rollout.multiturn import render

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
_MARK = "\u2063RLHFKIT-REPLY-{}\u2063"
_MARK_RE = re.compile("\u2063RLHFKIT-REPLY-(\\d+)\u2063")


def message_text(content: object) -> str:
    """A message's content as text: a string, None (""), or a list of content parts (their text)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    raise ValueError(f"message content must be a string, null or a list of parts, got {type(content).__name__}")


def canonical_arguments(arguments: object) -> str:
    """A tool call's arguments (a JSON string or an object) as canonical JSON text."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True)


def call_parts(call: Mapping) -> tuple[str, str]:
    """(name, canonical arguments) of an OpenAI tool call {"function": {"name", "arguments"}}."""
    fn = call.get("function") or {}
    return str(fn.get("name", "")), canonical_arguments(fn.get("arguments", "{}"))


def reply_key(content: object, tool_calls: list | None) -> str:
    """What identifies a reply when an agent sends it back: its stripped text and its tool calls."""
    calls = [call_parts(c) for c in tool_calls or []]
    return json.dumps([message_text(content).strip(), calls])


def tool_call_text(tool_calls: list) -> str:
    """Tool calls written as the model is asked to write them (<tool_call>JSON</tool_call> lines)."""
    return "\n".join("<tool_call>" + json.dumps({"name": n, "arguments": json.loads(a) if a.startswith("{") else a})
                     + "</tool_call>" for n, a in (call_parts(c) for c in tool_calls))


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, OpenAI tool_calls) of a reply: each <tool_call>{"name", "arguments"}</tool_call>
    block that parses becomes a call; the content is the text before the first block (None when
    empty and there are calls). No parsable block: (text, [])."""
    calls = []
    for m in _TOOL_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except ValueError:
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append({"id": "call_" + uuid.uuid4().hex[:16], "type": "function",
                      "function": {"name": obj["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
    if not calls:
        return text, []
    content = text[: text.index("<tool_call>")].strip()
    return content or None, calls


def native_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders tool schemas itself."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def tools_system_text(tools: list) -> str:
    """The tool description a template without tool support gets in its system message."""
    schemas = [t.get("function", t) for t in tools]
    return ("You can call these tools:\n" + "\n".join(json.dumps(s, sort_keys=True) for s in schemas)
            + '\nTo call one, reply with <tool_call>{"name": NAME, "arguments": {...}}</tool_call>; '
            "the result comes back in the next message.")


def plain_messages(messages: list[dict], tools: list | None, native: bool, known: Mapping[str, object]) -> tuple[list[dict], list[str]]:
    """(messages the template renders, the reply keys of the markers put in them, in order).
    Content parts become text; a known reply becomes a marker; tool calls become text unless
    `native`; without native tool support the tool schemas join the system message."""
    out, marked = [], []
    for m in messages:
        role = str(m.get("role", ""))
        calls = m.get("tool_calls") or None
        if role == "assistant" and reply_key(m.get("content"), calls) in known:
            marked.append(reply_key(m.get("content"), calls))
            out.append({"role": "assistant", "content": _MARK.format(len(marked) - 1)})
            continue
        msg = {"role": role, "content": message_text(m.get("content"))}
        if calls and native:
            msg["tool_calls"] = [dict(c) for c in calls]
        elif calls:
            msg["content"] = (msg["content"] + "\n" if msg["content"] else "") + tool_call_text(calls)
        if role == "tool" and m.get("tool_call_id") is not None:
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    if tools and not native:
        text = tools_system_text(tools)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": out[0]["content"] + "\n\n" + text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out, marked


def render_text(tokenizer, messages: list[dict], tools: list | None, fmt=None) -> str:
    """The chat template's text of `messages` ending in the assistant header (tools passed to a
    template that takes them)."""
    if tools and native_tools(tokenizer):
        text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return text[0] if isinstance(text, list) else str(text)
    return render(tokenizer, messages, fmt)


def prompt_ids(tokenizer, messages: list[dict], tools: list | None = None,
               known: Mapping[str, tuple[tuple[int, ...], str]] | None = None, fmt=None) -> list[int]:
    """The ids the model continues for a chat request (module docstring). `known`: reply key ->
    (the ids sampled for that reply, the stop token's text when it ended with one, else "")."""
    known = known or {}
    native = native_tools(tokenizer)
    msgs, marked = plain_messages(messages, tools, native, known)
    text = render_text(tokenizer, msgs, tools, fmt)
    ids: list[int] = []
    pos, after_stop = 0, ""
    for m in _MARK_RE.finditer(text):
        piece = text[pos : m.start()]
        if after_stop and piece.startswith(after_stop):
            piece = piece[len(after_stop):]
        ids += encode(tokenizer, piece)
        reply_ids, after_stop = known[marked[int(m.group(1))]]
        ids += list(reply_ids)
        pos = m.end()
    tail = text[pos:]
    if after_stop and tail.startswith(after_stop):
        tail = tail[len(after_stop):]
    return ids + encode(tokenizer, tail)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
