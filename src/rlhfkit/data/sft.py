"""Supervised fine-tuning examples: (prompt, response) pairs.

Accepted records: ``{"prompt", "response"}`` (``completion`` is an alias for
``response``), GSM8K's ``{"question", "answer"}``, chat ``{"messages": [...]}``
(with or without a ``prompt`` beside it, as in UltraFeedback) whose last turn is the
assistant's response; then ``prompt`` is the list of earlier messages and
``messages`` is kept whole. Either way, format with
``rlhfkit.data.chat.format_sft_example(tokenizer, ex["prompt"], ex["response"])``.
Plain text ``{"text": ...}`` (TRL's language-modelling format) trains on every token; it is
kept as ``text`` with an empty ``prompt``.

Which tokens the loss covers (`loss_spans`), as TRL's SFTTrainer: prompt/response records the
response (``completion_only_loss``, default true); conversations every token, or with
``assistant_only_loss`` every assistant turn.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from rlhfkit.core.devices import HOST
from rlhfkit.data.chat import IGNORE_INDEX, end_of_turn, tokenize_sft_example, with_bos
from rlhfkit.data.readers import Records, expect_messages, expect_text, message_text, missing_field
from rlhfkit.data.sets import builtin_name, load_split, sample
from rlhfkit.errors import DataError

RESPONSE_FIELDS = ("response", "completion")


class PromptFormat(Protocol):
    """The prompt format every caller's config carries (trainers/options.PromptFormatArgs)."""

    chat_template: bool | None
    system_prompt: str | None


@runtime_checkable
class SFTLossOptions(PromptFormat, Protocol):
    """SFTConfig's choice of trained tokens; a config without it (`rlhfkit evaluate`'s perplexity)
    trains the response only."""

    completion_only_loss: bool
    assistant_only_loss: bool


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

    if record.get("prompt") is None and record.get("text") is not None and not has_response:
        out.update(text=expect_text(record["text"], "text", where), prompt="")
        out["response"] = out["text"]  # no reference response: ROUGE leaves text records out
        return out
    if record.get("prompt") is None:
        raise missing_field(where, record, ("prompt", "messages", "text"))
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


def tokenize_examples(tok, examples: list[dict], cfg: PromptFormat, max_length: int) -> tuple[list[dict], int]:
    """Token ids + labels (prompt = -100) per example; drops examples whose response was cut away.
    `cfg` carries the prompt format (chat_template, system_prompt)."""
    out, dropped = [], 0
    for ex in examples:
        full, spans = loss_spans(tok, ex, cfg)
        if len(spans) == 1 and spans[0][1] == len(full):  # one trained tail: the prompt/response split
            t = tokenize_sft_example(tok, full[: spans[0][0]], full, max_length)
        else:
            t = tokenize_spans(tok, full, spans, max_length)
        if any(x != IGNORE_INDEX for x in t["labels"][1:]):
            out.append(t)
        else:
            dropped += 1
    return out, dropped


def loss_spans(tok, ex: dict, cfg: PromptFormat) -> tuple[str, list[tuple[int, int]]]:
    """(the example's full text, the character spans (start, end) its loss covers). `cfg` carries the
    prompt format and, for SFT, SFTLossOptions (without them: the response only)."""
    from rlhfkit.data.chat import format_example

    if ex.get("text") is not None and ex.get("prompt") == "":  # language modelling: every token after BOS
        start = with_bos(tok, "")
        full = start + ex["text"] + end_of_turn(tok)
        return full, [(len(start), len(full))]
    # ex["prompt"] is a string or, for chat records, the message list before the response
    p_text, full = format_example(tok, ex["prompt"], ex["response"], cfg.chat_template, cfg.system_prompt)
    response = [(len(p_text), len(full))]
    if not ex.get("messages"):
        completion_only = cfg.completion_only_loss if isinstance(cfg, SFTLossOptions) else True
        return full, response if completion_only else [(0, len(full))]
    assistant_only = cfg.assistant_only_loss if isinstance(cfg, SFTLossOptions) else None
    if assistant_only is None:
        return full, response
    if not assistant_only:  # TRL's default for conversations: every token
        return full, [(0, len(full))]
    return full, earlier_turns(tok, ex["prompt"], full, cfg) + response


def earlier_turns(tok, messages: list[dict], full: str, cfg: Any) -> list[tuple[int, int]]:
    """The spans of the assistant turns before the last in `full` (the whole conversation's text):
    each turn's content and, where the format writes one there, its end-of-turn string."""
    from rlhfkit.data.chat import format_example

    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        content = message_text(m["content"], "messages")
        p_i, f_i = format_example(tok, messages[:i], content, cfg.chat_template, cfg.system_prompt)
        if full.startswith(f_i):
            spans.append((len(p_i), len(f_i)))
        elif full.startswith(p_i + content):  # the plain format closes only the last turn with EOS
            spans.append((len(p_i), len(p_i) + len(content)))
    return spans


def tokenize_spans(tok, text: str, spans: list[tuple[int, int]], max_length: int | None) -> dict[str, list[int]]:
    """Token ids and labels (-100 outside `spans`) of `text`, cut at every span boundary and each piece
    encoded on its own (so a label never straddles a boundary); ``max_length`` cuts from the right."""
    cuts = sorted({0, len(text), *(c for span in spans for c in span)})
    ids: list[int] = []
    labels: list[int] = []
    for a, b in zip(cuts, cuts[1:]):
        piece = list(tok(text[a:b], add_special_tokens=False)["input_ids"])
        trained = any(s <= a and b <= e for s, e in spans)
        ids += piece
        labels += piece if trained else [IGNORE_INDEX] * len(piece)
    ids, labels = ids[:max_length], labels[:max_length]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels}


def pack_examples(examples: list[dict], max_length: int) -> list[dict]:
    """Tokenised examples packed into rows of at most `max_length` tokens, first-fit in order of
    decreasing length (TRL's best-fit packing, near enough). A row keeps each example apart: its
    ``position_ids`` restart at 0 for each example (transformers then masks attention between them)
    and the first label of every example is -100 (nothing predicts it from the example before)."""
    rows: list[list[dict]] = []
    room: list[int] = []
    for ex in sorted(examples, key=lambda e: -len(e["input_ids"])):
        n = len(ex["input_ids"])
        i = next((k for k, free in enumerate(room) if free >= n), None)
        if i is None:
            rows.append([])
            room.append(max_length)
            i = len(rows) - 1
        rows[i].append(ex)
        room[i] -= n
    return [{"input_ids": [t for e in row for t in e["input_ids"]],
             "attention_mask": [1] * sum(len(e["input_ids"]) for e in row),
             "labels": [x for e in row for x in [IGNORE_INDEX, *e["labels"][1:]]],
             "position_ids": [p for e in row for p in range(len(e["input_ids"]))]} for row in rows]


def collate(examples: list[dict], pad_id: int, width: int | None = None) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask / labels (-100 on padding). (B, L), L = the longest
    example, or `width` (at least that long: the chunks of one micro-batch share its shape). Packed
    rows (`pack_examples`) also get their position_ids; the padding counts 0, 1, ... as a segment of
    its own. In host memory (HOST): the trainer moves each chunk to its device."""
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
    out = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    if any("position_ids" in e for e in examples):
        pos = torch.arange(L, device=HOST).repeat(B, 1)  # (B, L)
        for i, e in enumerate(examples):
            n = len(e["input_ids"])
            pos[i, :n] = torch.tensor(e["position_ids"], device=HOST)
            pos[i, n:] = torch.arange(L - n, device=HOST)
        out["position_ids"] = pos
    return out


def question_answer(record: dict[str, Any]) -> dict[str, Any]:
    """A GSM8K-style ``{"question", "answer"}`` record as ``{"prompt", "response"}`` (the whole
    worked answer, ``#### N`` line included); any other record unchanged."""
    if record.get("prompt") is not None or record.get("messages") is not None or record.get("question") is None:
        return record
    if record.get("answer") is None or any(record.get(f) is not None for f in RESPONSE_FIELDS):
        return record
    out = {k: v for k, v in record.items() if k not in ("question", "answer")}
    return {**out, "prompt": record["question"], "response": record["answer"]}
