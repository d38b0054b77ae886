"""Prompt sets for PPO/GRPO/RLOO rollouts and evaluation.

``load_prompts("builtin:reviews")`` -> ``[{"prompt": "Write a short review of ..."}, ...]``.
Extra fields (e.g. ``answer`` for arithmetic) are kept; trainers hand them to
reward functions as per-sample keyword lists (see :func:`info_fields`).
"""

from __future__ import annotations

from typing import Any

from rlhfkit.data.formats import implicit_pair
from rlhfkit.data.readers import Records, expect_messages, expect_text, missing_field
from rlhfkit.data.sets import info_fields, load_split, sample
from rlhfkit.errors import DataError

__all__ = ["load_prompts", "prompt_record", "info_fields", "info_lists"]


def load_prompts(
    spec: str, split: str | None = "train", limit: int | None = None, seed: int = 0
) -> list[dict]:
    """Load prompts from a data spec: ``builtin:NAME``, a Hub id or a local file (data/spec.py).

    Every returned dict has ``prompt`` (a non-empty str). Chat records
    (``messages``) use their last user turn as ``prompt`` and keep
    ``messages`` cut after that turn, so a trainer can format the whole
    conversation with :func:`rlhfkit.data.chat.format_prompt`. ``limit`` takes
    a seeded random subset (same seed, same subset); the whole file is
    validated either way. ``split=None`` returns every split, ``split`` fields kept.
    """
    records = load_split(spec, split)
    checked = Records(
        (prompt_record(rec, records.where(i)) for i, rec in enumerate(records)),
        source=records.source,
        lines=records.lines,
        unit=records.unit,
    )
    return sample(checked, limit, seed)


def prompt_record(record: dict[str, Any], where: str) -> dict[str, Any]:
    """Validate one record and normalise it to have a string ``prompt``.

    Read in this order: ``prompt`` (a string, or TRL's message list), ``messages``, GSM8K's
    ``question`` (its ``answer`` stays for the reward), then a preference pair without a prompt
    field (Anthropic-HH strings or TRL implicit-prompt conversations: the shared beginning).
    """
    out = dict(record)
    value = record.get("prompt")
    if isinstance(value, list):
        # Conversational prompt (a list of messages), as TRL writes it.
        out.pop("prompt")
        return _from_messages(out, expect_messages(value, where, "prompt"), where)
    if value is not None:
        text = expect_text(value, "prompt", where)
        if record.get("messages") is not None:
            # UltraFeedback-style: `messages` may run on past the prompt (the chosen answer);
            # keep the conversation up to the prompt turn, as for a messages-only record.
            out = _from_messages(out, expect_messages(record["messages"], where), where)
        out["prompt"] = text
        return out
    if record.get("messages") is not None:
        return _from_messages(out, expect_messages(record["messages"], where), where)
    if record.get("question") is not None:
        out["prompt"] = expect_text(out.pop("question"), "question", where)
        return out
    pair = implicit_pair(record, where)
    if pair is not None:
        out.update(pair)
        return _from_messages(out, pair["prompt"], where)
    raise missing_field(where, record, ("prompt", "messages"))


def _from_messages(out: dict[str, Any], messages: list[dict[str, str]], where: str) -> dict[str, Any]:
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise DataError(f"{where}: field 'messages' has no user turn to use as the prompt")
    last = users[-1]
    out["prompt"] = expect_text(messages[last]["content"], "messages", where)
    out["messages"] = messages[: last + 1]
    return out


def reward_inputs(records: list[dict], completions: list[str]) -> tuple[list, list]:
    """(prompts, completions) as a reward function receives them, TRL's way: text, or for a
    conversational record (one with `messages`) the conversation up to the prompt and
    ``[{"role": "assistant", "content": completion}]``."""
    prompts = [r["messages"] if r.get("messages") else str(r["prompt"]) for r in records]
    return prompts, [[{"role": "assistant", "content": c}] if r.get("messages") else c
                     for r, c in zip(records, completions)]


def info_columns(records: list[dict]) -> list[str]:
    """The prompt fields a reward function receives as keywords (every field but prompt, split, messages)."""
    return sorted({k for r in records for k in r if k not in ("prompt", "split", "messages")})


def info_lists(records: list[dict]) -> dict[str, list]:
    """Per-sample extra fields (e.g. 'answer') as lists, for reward functions."""
    return {k: [r.get(k) for r in records] for k in info_columns(records)}
