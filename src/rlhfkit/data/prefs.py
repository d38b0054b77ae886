"""Preference pairs for reward models and DPO: prompt, chosen, rejected.

Accepted records: ``{"prompt", "chosen", "rejected"}`` (without ``prompt``: Anthropic-HH strings
or TRL implicit-prompt conversations, whose shared beginning is the prompt) with optional
``margin`` / ``strength`` (finite floats; numeric strings from CSV are fine) and
``scores`` (a list of numbers or an object of numbers, passed through). A chat
prompt (``prompt`` as a message list, TRL style) gives ``prompt`` = its last user
turn and ``messages`` = the list; chosen/rejected may be message lists whose
last assistant turn is the response.
"""

from __future__ import annotations

import json
from typing import Any

from rlhfkit.data.prompts import prompt_record
from rlhfkit.data.readers import Records, expect_float, missing_field
from rlhfkit.data.sets import builtin_name, load_split, sample
from rlhfkit.data.sft import response_text
from rlhfkit.errors import DataError

OPTIONAL_FLOATS = ("margin", "strength")
BUILTIN_PREFS = {"prefs_reviews": "prefs_reviews.jsonl"}  # builtin:NAME -> file in rlhfkit/data/builtin


def resolve_prefs(spec: str) -> str:
    """File path of a preference spec; `builtin:prefs_reviews` is shipped in rlhfkit/data/builtin."""
    name = spec[len("builtin:"):].strip() if isinstance(spec, str) and spec.startswith("builtin:") else None
    if name in BUILTIN_PREFS:
        from importlib import resources

        return str(resources.files("rlhfkit.data") / "builtin" / BUILTIN_PREFS[name])
    return spec


def load_pairs(spec: str, eval_split: str = "test") -> tuple[list[dict], list[dict]]:
    """(training pairs, held-out pairs). Held out = records whose split is `eval_split` (none if no split field)."""
    path = resolve_prefs(spec)
    if not any("split" in r for r in load_split(path, None)):
        return load_preferences(path), []
    train = load_preferences(path, split="train")  # Records: they name file:line in messages
    try:
        held_out = load_preferences(path, split=eval_split)
    except DataError:
        held_out = []
    return train, held_out


def load_preferences(
    spec: str, split: str | None = None, limit: int | None = None, seed: int = 0
) -> list[dict]:
    """Load and validate preference pairs from a local file.

    ``split`` keeps only records with that ``split`` field (None: all records).
    Raises DataError (file:line) for missing fields, empty or identical
    chosen/rejected, or non-numeric margin/strength/scores.
    """
    if isinstance(spec, str) and builtin_name(spec) is not None:
        raise DataError(
            f"{spec} has no preference pairs; build some with `rlhfkit prefs make` "
            "or pass a file with 'prompt', 'chosen' and 'rejected' fields"
        )
    records = load_split(spec, split)
    checked = Records(
        (preference_record(rec, records.where(i)) for i, rec in enumerate(records)),
        source=records.source,
        lines=records.lines,
        unit=records.unit,
    )
    return sample(checked, limit, seed)


def preference_record(record: dict[str, Any], where: str) -> dict[str, Any]:
    """Validate one preference record; returns a normalised copy."""
    out = prompt_record(record, where)  # without a prompt field: the shared beginning of chosen/rejected
    for field in ("chosen", "rejected"):
        if out.get(field) is None:
            raise missing_field(where, record, (field,))
        out[field] = response_text(out[field], field, where)
    if out["chosen"].strip() == out["rejected"].strip():
        raise DataError(
            f"{where}: 'chosen' and 'rejected' are identical (a pair needs two different responses)"
        )
    for field in OPTIONAL_FLOATS:
        if _blank(record.get(field)):
            out.pop(field, None)
        else:
            out[field] = expect_float(record[field], field, where)
    if _blank(record.get("scores")):
        out.pop("scores", None)
    else:
        out["scores"] = _scores(record["scores"], where)
    return out


def _scores(value: Any, where: str) -> list[float] | dict[str, float]:
    if isinstance(value, str):  # CSV cells hold JSON text
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise DataError(
                f"{where}: field 'scores' must be a list or object of numbers, got {value[:40]!r}"
            ) from None
    if isinstance(value, list):
        return [expect_float(v, "scores", where) for v in value]
    if isinstance(value, dict):
        return {str(k): expect_float(v, "scores", where) for k, v in value.items()}
    raise DataError(
        f"{where}: field 'scores' must be a list or object of numbers, got {type(value).__name__}"
    )


def _blank(value: Any) -> bool:
    """Absent, null, or an empty CSV cell."""
    return value is None or (isinstance(value, str) and not value.strip())
