"""Supervised fine-tuning examples: (prompt, response) pairs.

Accepted records: ``{"prompt", "response"}`` (``completion`` is an alias for
``response``), GSM8K's ``{"question", "answer"}``, or chat ``{"messages": [...]}``
(with or without a ``prompt`` beside it, as in UltraFeedback) whose last turn is the
assistant's response; then ``prompt`` is the list of earlier messages and
``messages`` is kept whole. Either way, format with
``rlhfkit.data.chat.format_sft_example(tokenizer, ex["prompt"], ex["response"])``.
"""

from __future__ import annotations

from typing import Any

import torch

from rlhfkit.data.chat import IGNORE_INDEX, tokenize_sft_example
from rlhfkit.data.readers import Records, expect_messages, expect_text, message_text, missing_field
from rlhfkit.data.sets import builtin_name, load_split, sample
from rlhfkit.errors import DataError
from rlhfkit.runtime.devices import HOST

RESPONSE_FIELDS = ("response", "completion")


def load_sft_examples(
    spec: str, split: str | None = "train", limit: int | None = None, seed: int = 0
) -> list[dict]:
    """Load SFT examples from ``builtin:instructions``, ``builtin:arithmetic`` or a local file.

    Each dict has ``prompt`` (str, or a list of chat messages) and ``response``
    (non-empty str); other fields are kept. ``limit``/``seed`` as in
    :func:`rlhfkit.data.prompts.load_prompts`.
    """
    name = builtin_name(spec) if isinstance(spec, str) else None
    if name in ("reviews", "stories"):
        raise DataError(
            f"{spec} has prompts only; SFT needs responses (try builtin:instructions or a file "
            "with 'prompt' and 'response' fields)"
        )
    records = load_split(spec, split)
    if name == "arithmetic":
        # The prompt asks for just the number, so the target is just the number.
        records = Records(
            ({**r, "response": str(r["answer_value"])} for r in records),
            source=records.source,
            unit=records.unit,
        )
    checked = Records(
        (sft_record(rec, records.where(i)) for i, rec in enumerate(records)),
        source=records.source,
        lines=records.lines,
        unit=records.unit,
    )
    return sample(checked, limit, seed)


def sft_record(record: dict[str, Any], where: str) -> dict[str, Any]:
    """Validate one record and normalise it to ``prompt`` + ``response``."""
    record = question_answer(record)
    out = dict(record)
    has_response = any(record.get(f) is not None for f in RESPONSE_FIELDS)
    if record.get("messages") is not None and not has_response:
        return _from_messages(out, expect_messages(record["messages"], where), where)

    if record.get("prompt") is None:
        raise missing_field(where, record, ("prompt", "messages"))
    prompt = record["prompt"]
    out["prompt"] = (
        expect_messages(prompt, where, "prompt")
        if isinstance(prompt, list)
        else expect_text(prompt, "prompt", where)
    )
    field = next((f for f in RESPONSE_FIELDS if record.get(f) is not None), None)
    if field is None:
        raise missing_field(where, record, (*RESPONSE_FIELDS, "messages"))
    out.pop("completion", None)
    out["response"] = response_text(record[field], field, where)
    return out


def response_text(value: Any, field: str, where: str) -> str:
    """A response given as a string, or as a message list (TRL style): the last assistant turn."""
    if isinstance(value, list):
        messages = expect_messages(value, where, field)
        if messages[-1]["role"] != "assistant":
            raise DataError(f"{where}: field {field!r}: the last message must be the assistant's")
        value = messages[-1]["content"]
    return expect_text(value, field, where)


def _from_messages(out: dict[str, Any], messages: list[dict[str, str]], where: str) -> dict[str, Any]:
    if messages[-1]["role"] != "assistant":
        raise DataError(
            f"{where}: field 'messages' must end with an assistant turn (the response), "
            f"got a {messages[-1]['role']!r} turn"
        )
    if not any(m["role"] == "user" for m in messages[:-1]):
        raise DataError(f"{where}: field 'messages' has no user turn before the assistant's response")
    out["prompt"] = messages[:-1]
    out["response"] = expect_text(message_text(messages[-1]["content"], where), "messages", where)
    out["messages"] = messages
    return out


def tokenize_examples(tok, examples: list[dict], cfg: Any, max_length: int) -> tuple[list[dict], int]:
    """Token ids + labels (prompt = -100) per example; drops examples whose response was cut away.
    `cfg` carries the prompt format (chat_template, system_prompt)."""
    from rlhfkit.models.reward_model import format_example

    out, dropped = [], 0
    for ex in examples:
        # ex["prompt"] is a string or, for chat records, the message list before the response
        p_text, full = format_example(tok, ex["prompt"], ex["response"], cfg.chat_template, cfg.system_prompt)
        t = tokenize_sft_example(tok, p_text, full, max_length)
        if any(x != IGNORE_INDEX for x in t["labels"][1:]):
            out.append(t)
        else:
            dropped += 1
    return out, dropped


def collate(examples: list[dict], pad_id: int, width: int | None = None) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask / labels (-100 on padding). (B, L), L = the longest
    example, or `width` (at least that long: the chunks of one micro-batch share its shape). In host
    memory (HOST): the trainer moves each chunk to its device."""
    L = max(len(e["input_ids"]) for e in examples) if width is None else width
    B = len(examples)
    ids = torch.full((B, L), pad_id, dtype=torch.long, device=HOST)
    mask = torch.zeros((B, L), dtype=torch.long, device=HOST)
    labels = torch.full((B, L), IGNORE_INDEX, dtype=torch.long, device=HOST)
    for i, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[i, :n] = torch.tensor(e["input_ids"], device=HOST)
        mask[i, :n] = 1
        labels[i, :n] = torch.tensor(e["labels"], device=HOST)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def question_answer(record: dict[str, Any]) -> dict[str, Any]:
    """A GSM8K-style ``{"question", "answer"}`` record as ``{"prompt", "response"}`` (the whole
    worked answer, ``#### N`` line included); any other record unchanged."""
    if record.get("prompt") is not None or record.get("messages") is not None or record.get("question") is None:
        return record
    if record.get("answer") is None or any(record.get(f) is not None for f in RESPONSE_FIELDS):
        return record
    out = {k: v for k, v in record.items() if k not in ("question", "answer")}
    return {**out, "prompt": record["question"], "response": record["answer"]}
