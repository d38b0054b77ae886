"""Turn prompts and (prompt, response) pairs into model text.

With a chat template (SmolLM2-135M-Instruct has one) the tokenizer's own
template is used; without one, the plain format::

    User: {prompt}

    Assistant: {response}
"""

from __future__ import annotations

from typing import Any

from rlhfkit.errors import ConfigError, DataError

Prompt = str | list[dict[str, Any]]
PLAIN_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}
IGNORE_INDEX = -100  # label value the loss skips (PyTorch's cross-entropy default)


def has_chat_template(tokenizer: Any) -> bool:
    """True if the tokenizer carries a non-empty chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def use_chat_template(tokenizer: Any, setting: bool | None) -> bool:
    """Whether to format with the tokenizer's chat template.

    ``setting`` is the ``chat_template`` option: None uses the template when the tokenizer has
    one; False never does; True requires it and raises ConfigError when the tokenizer has none.
    """
    if setting is None:
        return has_chat_template(tokenizer)
    if setting and not has_chat_template(tokenizer):
        name = getattr(tokenizer, "name_or_path", "") or "the model"
        raise ConfigError(
            f"chat_template=true, but the tokenizer of {name} has no chat template; set chat_template=false "
            "(or leave it unset) to use the plain 'User: ...\\n\\nAssistant: ' format"
        )
    return bool(setting)


def to_messages(prompt: Prompt, system: str | None = None) -> list[dict[str, Any]]:
    """A prompt as a message list; ``system`` replaces a leading system turn if there is one."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in prompt
    ):
        messages = [dict(m) for m in prompt]
    else:
        raise DataError(
            f"a prompt must be a string or a list of {{'role', 'content'}} messages, got {type(prompt).__name__}"
        )
    if system is not None:
        if messages and messages[0]["role"] == "system":
            messages = messages[1:]
        messages.insert(0, {"role": "system", "content": system})
    return messages


def format_prompt(tokenizer: Any, prompt: Prompt, system: str | None = None) -> str:
    """The text a model should continue to answer ``prompt``.

    Uses ``tokenizer.apply_chat_template(..., add_generation_prompt=True,
    tokenize=False)`` when the tokenizer has a chat template; otherwise
    ``"User: {prompt}\\n\\nAssistant: "`` (multi-turn: alternating blocks).
    """
    messages = to_messages(prompt, system)
    if not has_chat_template(tokenizer):
        return with_bos(tokenizer, plain_format(messages))
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as e:  # jinja2 TemplateError from raise_exception(), bad roles, ...
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(f"the tokenizer's chat template rejected the conversation: {first}") from None
    if isinstance(text, list):  # some versions return a batch of one
        text = text[0]
    return str(text)


def plain_format(messages: list[dict[str, Any]]) -> str:
    """The template-free format: ``Role: content`` blocks, then ``Assistant: ``."""
    blocks = [f"{PLAIN_ROLES.get(m['role'], str(m['role']).capitalize())}: {m['content']}" for m in messages]
    return "\n\n".join(blocks + ["Assistant: "])


def adds_bos(tokenizer: Any) -> bool:
    """The tokenizer prepends a BOS token to plain text (Llama, Mistral, Gemma, OPT's ``</s>``)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None or not isinstance(getattr(tokenizer, "bos_token", None), str):
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == bos


def with_bos(tokenizer: Any, text: str) -> str:
    """Plain-format text with the BOS string in front when the tokenizer adds one to plain text.

    Every text is encoded with ``add_special_tokens=False`` (a chat template writes its own
    special tokens, and HF's apply_chat_template adds none), so without this a plain-format prompt
    would reach a model trained with a BOS in front (Gemma, OPT, Llama and Mistral base models)
    without it."""
    if adds_bos(tokenizer) and not text.startswith(tokenizer.bos_token):
        return tokenizer.bos_token + text
    return text


def end_of_turn(tokenizer: Any) -> str:
    """What closes an assistant turn: the tokenizer's EOS string (SmolLM2: ``<|im_end|>``), or ""."""
    eos = getattr(tokenizer, "eos_token", None)
    return eos if isinstance(eos, str) else ""


def format_sft_example(
    tokenizer: Any, prompt: Prompt, response: str, system: str | None = None
) -> tuple[str, str]:
    """``(prompt_text, full_text)`` with ``full_text = prompt_text + response + end_of_turn``.

    The EOS string is appended with or without a chat template, so the model
    learns to stop. ``full_text`` always starts with ``prompt_text``, so a label
    mask can cover exactly the response (see :func:`tokenize_sft_example`).
    """
    prompt_text = format_prompt(tokenizer, prompt, system)
    return prompt_text, prompt_text + response + end_of_turn(tokenizer)


def tokenize_sft_example(
    tokenizer: Any, prompt_text: str, full_text: str, max_length: int | None = None
) -> dict[str, list[int]]:
    """Token ids and labels (prompt tokens = -100) for one SFT example.

    If tokenising ``full_text`` merges tokens across the prompt/response
    boundary (BPE after a trailing space), the two parts are tokenised apart
    so the mask still covers exactly the response. ``max_length`` cuts from the right.
    """
    if not full_text.startswith(prompt_text):
        raise ValueError("full_text must start with prompt_text")

    def encode(text: str) -> list[int]:
        # Chat templates already add their special tokens; adding BOS again would double it.
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    prompt_ids = encode(prompt_text)
    full_ids = encode(full_text)
    if full_ids[: len(prompt_ids)] != prompt_ids:
        full_ids = prompt_ids + encode(full_text[len(prompt_text) :])
    labels = [IGNORE_INDEX] * len(prompt_ids) + full_ids[len(prompt_ids) :]
    if max_length is not None:
        full_ids, labels = full_ids[:max_length], labels[:max_length]
    return {"input_ids": full_ids, "attention_mask": [1] * len(full_ids), "labels": labels}


def format_prompts(tokenizer: Any, prompts: list, args: Any) -> list[str]:
    """Prompt texts (strings or message lists) as the model sees them. `args` carries the
    prompt-format options (trainers/options.py PromptFormatArgs: chat_template, system_prompt)."""
    if not use_chat_template(tokenizer, args.chat_template):
        return [with_bos(tokenizer, plain_format(to_messages(p, args.system_prompt))) for p in prompts]
    return [format_prompt(tokenizer, p, system=args.system_prompt) for p in prompts]


def text_of(item: Any) -> str:
    """The text of a prompt or completion: a string as is; a message list (conversational data,
    ``[{"role": "assistant", "content": ...}]``) as its last message's content."""
    if isinstance(item, (list, tuple)) and item and isinstance(item[-1], dict):
        return str(item[-1].get("content", ""))
    return item if isinstance(item, str) else str(item)


def format_example(tokenizer, prompt, response: str, chat_template: bool | None = None,
                   system: str | None = None) -> tuple[str, str]:
    """``(prompt_text, full_text)`` for one (prompt, response) pair, shared by SFT, the reward
    model, its scorer and eval so that all of them see the same text.

    ``chat_template`` as in `use_chat_template` (None: the tokenizer's
    template when it has one, True: required). With the template:
    `format_sft_example`; otherwise the plain format
    ``User: {prompt}\\n\\nAssistant: {response}`` (plus the EOS string, if any), after the BOS
    string when the tokenizer adds one to plain text (`with_bos`).
    """
    if use_chat_template(tokenizer, chat_template):
        return format_sft_example(tokenizer, prompt, response, system)
    prompt_text = with_bos(tokenizer, plain_format(to_messages(prompt, system)))
    return prompt_text, prompt_text + response + end_of_turn(tokenizer)
