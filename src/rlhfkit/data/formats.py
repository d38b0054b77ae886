"""Record formats people already have, mapped onto rlhfkit's fields.

- column mapping from a data spec (``?columns=prompt:question``) and prompt openers (``?words=N``);
- preference pairs without a prompt field, whose chosen and rejected share the prompt:
  Anthropic-HH strings (``"\\n\\nHuman: ...\\n\\nAssistant: ..."``) and TRL's implicit-prompt
  conversations (message lists); the shared beginning becomes the prompt (a message list);
- GSM8K-style ``question`` / ``answer`` records (read by prompts.py and sft.py).

docs/data-formats.md shows one example per format.
"""

from __future__ import annotations

import re
from typing import Any

from rlhfkit.data.readers import Records, expect_messages, missing_field
from rlhfkit.errors import DataError

HH_TURN = re.compile(r"\n\n(Human|Assistant):")
HH_ROLES = {"Human": "user", "Assistant": "assistant"}
ASSISTANT_MARK = "\n\nAssistant:"


# --------------------------------------------------------------------------- spec options


def rename_columns(records: Records, columns: tuple[tuple[str, str], ...]) -> Records:
    """Each record with field TO read from column FROM (the FROM column renamed), for every
    (TO, FROM) pair. A record without FROM gives a DataError naming the columns it has."""
    if not columns:
        return records
    sources = {src for _, src in columns}
    out = []
    for i, rec in enumerate(records):
        row = {k: v for k, v in rec.items() if k not in sources}
        for to, src in columns:
            if src not in rec:
                raise missing_field(f"{records.where(i)}: columns={to}:{src}", rec, (src,))
            row[to] = rec[src]
        out.append(row)
    return Records(out, source=records.source, lines=records.lines, unit=records.unit)


def keep_columns(records: Records, names: tuple[str, ...]) -> Records:
    """Each record with only the columns ``names`` (TRL's ``columns`` of a ``datasets:`` entry, its
    ``select_columns``). A record without one of them gives a DataError naming the columns it has."""
    out = []
    for i, rec in enumerate(records):
        absent = [n for n in names if n not in rec]
        if absent:
            raise missing_field(f"{records.where(i)}: keep={','.join(names)}", rec, (absent[0],))
        out.append({n: rec[n] for n in names})
    return Records(out, source=records.source, lines=records.lines, unit=records.unit)


def cut_prompts(records: Records, words: int | None) -> Records:
    """String prompts cut to their first ``words`` words (IMDB-style reviews: the opening a
    policy continues); other fields untouched."""
    if words is None:
        return records
    out = [{**r, "prompt": opener(r["prompt"], words)} if isinstance(r.get("prompt"), str) else r for r in records]
    return Records(out, source=records.source, lines=records.lines, unit=records.unit)


def opener(text: str, words: int) -> str:
    """The first ``words`` words of ``text``, HTML line breaks (IMDB's ``<br />``) as spaces."""
    return " ".join(re.sub(r"<br\s*/?>", " ", text).split()[:words])


# --------------------------------------------------------------------------- implicit prompts


def implicit_pair(record: dict[str, Any], where: str) -> dict[str, Any] | None:
    """``{"prompt": messages, "chosen": str, "rejected": str}`` for a pair without a prompt field
    whose chosen and rejected are HH strings or message lists with a shared beginning; None when
    the record is not such a pair (the caller then reports the missing prompt)."""
    chosen, rejected = record.get("chosen"), record.get("rejected")
    if isinstance(chosen, str) and isinstance(rejected, str) and ASSISTANT_MARK in chosen:
        return split_hh(chosen, rejected, where)
    if isinstance(chosen, list) and isinstance(rejected, list):
        return split_conversations(expect_messages(chosen, where, "chosen"),
                                   expect_messages(rejected, where, "rejected"), where)
    return None


def split_hh(chosen: str, rejected: str, where: str) -> dict[str, Any]:
    """Anthropic-HH pair: the prompt is the shared text up to its last ``\\n\\nAssistant:``.

    ``"\\n\\nHuman: Hi\\n\\nAssistant: Hello!"`` / ``"...Assistant: Go away."`` ->
    prompt ``[{"role": "user", "content": "Hi"}]``, chosen ``"Hello!"``, rejected ``"Go away."``.
    """
    shared = _common_prefix(chosen, rejected)
    cut = shared.rfind(ASSISTANT_MARK)
    if cut < 0:
        raise DataError(f"{where}: 'chosen' and 'rejected' share no '\\n\\nHuman: ...\\n\\nAssistant:' "
                        "beginning to use as the prompt")
    start = cut + len(ASSISTANT_MARK)
    out = {"prompt": hh_messages(chosen[:cut], where),
           "chosen": chosen[start:].strip(), "rejected": rejected[start:].strip()}
    for side in ("chosen", "rejected"):
        if not out[side]:
            raise DataError(f"{where}: field {side!r} has no response after the shared prompt")
    return out


def hh_messages(text: str, where: str) -> list[dict[str, str]]:
    """``"\\n\\nHuman: a\\n\\nAssistant: b\\n\\nHuman: c"`` -> user a, assistant b, user c."""
    text = text if text.startswith("\n\n") else "\n\n" + text.lstrip()
    parts = HH_TURN.split(text)  # ['', 'Human', ' a', 'Assistant', ' b', ...]
    if parts[0].strip() or len(parts) < 3:
        raise DataError(f"{where}: an Anthropic-HH conversation must start with '\\n\\nHuman:', "
                        f"got {text[:40]!r}")
    messages = [{"role": HH_ROLES[role], "content": body.strip()} for role, body in zip(parts[1::2], parts[2::2])]
    if messages[-1]["role"] != "user":
        raise DataError(f"{where}: the shared prompt must end with a Human turn")
    return messages


def split_conversations(chosen: list[dict], rejected: list[dict], where: str) -> dict[str, Any]:
    """TRL implicit-prompt pair: the shared leading messages are the prompt; each side's last
    message (an assistant turn after it) is its response."""
    n = 0
    while n < min(len(chosen), len(rejected)) - 1 and chosen[n] == rejected[n]:
        n += 1
    prompt = chosen[:n]
    if not prompt or prompt[-1]["role"] != "user":
        raise DataError(f"{where}: 'chosen' and 'rejected' must share their messages up to a user turn "
                        "(the prompt)")
    out: dict[str, Any] = {"prompt": prompt}
    for side, messages in (("chosen", chosen), ("rejected", rejected)):
        rest = messages[n:]
        if len(rest) != 1 or rest[0]["role"] != "assistant":
            raise DataError(f"{where}: field {side!r} must add exactly one assistant turn after the shared "
                            f"prompt, got {len(rest)} message(s) ending with a {rest[-1]['role']!r} turn")
        out[side] = rest[0]["content"]
    return out


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
