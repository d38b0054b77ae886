"""OpenAI messages -> prompt ids (rollout/chat_ids.py): tool calls in and out, and earlier replies
spliced in as the ids that were sampled."""

from __future__ import annotations

import json

from rlhfkit.rollout.chat_ids import parse_tool_calls, prompt_ids, reply_key

from tiny_lm import build_tokenizer

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]


def test_tool_call_blocks_become_openai_tool_calls():
    text = 'Let me compute.\n<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    content, calls = parse_tool_calls(text)
    assert content == "Let me compute."
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("function", "calculator", {"expression": "2+3"})]
    assert parse_tool_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
    assert parse_tool_calls("just 5") == ("just 5", [])


def test_a_template_without_tools_gets_them_in_the_system_message_and_calls_as_text():
    tok = build_tokenizer()  # ChatML without a `tools` variable
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'}}
    messages = [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "5"}]
    text = tok.decode(prompt_ids(tok, messages, TOOLS))
    assert text.startswith("<|im_start|>system\nYou can call these tools:\n")
    assert '"name": "calculator"' in text
    assert '<|im_start|>assistant\n<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>' in text
    assert text.endswith("<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")


def test_a_template_with_tools_renders_them_itself():
    tok = build_tokenizer()
    tok.chat_template = ("{% for t in tools or [] %}TOOL {{ t['function']['name'] }}\n{% endfor %}"
                         "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    text = tok.decode(prompt_ids(tok, [{"role": "user", "content": "hi"}], TOOLS))
    assert text == "TOOL calculator\nuser: hi\nassistant: "


def test_an_earlier_reply_is_spliced_in_as_its_sampled_ids():
    tok = build_tokenizer()
    first = prompt_ids(tok, [{"role": "user", "content": "hi"}])
    sampled = (300, 301, tok.eos_token_id)  # ids whose text would not re-tokenise to them
    key = reply_key("whatever it decoded to", None)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "whatever it decoded to"},
                {"role": "user", "content": "more"}]
    ids = prompt_ids(tok, messages, known={key: (sampled, tok.eos_token)})
    assert ids[: len(first) + 3] == first + list(sampled)  # the sampled stop token stands for the template's
    assert tok.decode(ids[len(first) + 3 :]) == "\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    unknown = prompt_ids(tok, messages)  # not a reply of this episode: its text, re-tokenised
    assert unknown[: len(first)] == first and unknown[len(first) : len(first) + 3] != list(sampled)
