"""Resolve a data spec (``builtin:NAME``, a Hub id or a local path, see data/spec.py) to
records of one split.

Built-in sets ship in ``rlhfkit/data/builtin/`` (``arithmetic`` is generated)
and have disjoint ``train`` and ``test`` splits. Hub datasets use their own splits
(data/hub.py). Local files are used whole unless their records carry a ``split``
field, in which case only the requested split is kept.
"""

from __future__ import annotations

import difflib
import random
from importlib import resources
from typing import Any

from rlhfkit.data import arithmetic
from rlhfkit.data.formats import cut_prompts, keep_columns, rename_columns
from rlhfkit.data.readers import Records, dataset_records, printable, read_records
from rlhfkit.data.spec import parse_spec
from rlhfkit.errors import ConfigError, DataError

BUILTIN_PREFIX = "builtin:"
BUILTIN_FILES = {
    "reviews": "reviews.jsonl",
    "stories": "stories.jsonl",
    "instructions": "instructions.jsonl",
    "python-tasks": "python_tasks.jsonl",  # written by scripts/make_python_tasks.py (reward=code's tasks)
}
BUILTIN_NAMES = ("reviews", "stories", "arithmetic", "instructions", "python-tasks")
SPLITS = ("train", "test")


def builtin_path(name: str) -> str:
    """Filesystem path of a shipped built-in data file (e.g. ``reviews``)."""
    return str(resources.files("rlhfkit.data") / "builtin" / BUILTIN_FILES[name])


def builtin_name(spec: str) -> str | None:
    """``"reviews"`` for ``"builtin:reviews"``; None for a path. Unknown names raise DataError."""
    if not isinstance(spec, str) or not spec.startswith(BUILTIN_PREFIX):  # a path, or data given in Python
        return None
    name = spec[len(BUILTIN_PREFIX) :].strip()
    if name not in BUILTIN_NAMES:
        close = difflib.get_close_matches(name, BUILTIN_NAMES, n=1)
        hint = f" (did you mean 'builtin:{close[0]}'?)" if close else ""
        choices = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_NAMES)
        raise DataError(f"unknown built-in data set {spec!r}{hint}; expected one of: {choices}")
    return name


def load_split(spec: str, split: str | None = "train") -> Records:
    """Records of ``spec`` for ``split`` (None: every record), with locations for errors.

    The ``split`` field is dropped from records it was used to select. In Python ``spec`` may also
    be a ``datasets.Dataset`` / ``DatasetDict`` or a list of record dicts.
    """
    if not isinstance(spec, str):
        return _select_split(in_memory_records(spec, split), split, "<in-memory data>")
    if MIX in spec:
        return mixture(spec, split)
    parsed = parse_spec(spec)
    name = builtin_name(spec)
    if name is not None:
        if split is not None and split not in SPLITS:
            raise DataError(f"{spec}: unknown split {split!r} (expected one of: {', '.join(SPLITS)})")
        if name == "arithmetic":
            if split is not None:
                return Records(arithmetic.builtin_split(split), source=spec, unit="problem")
            # Every split at once: tag rows like the shipped files do.
            rows = [{**p, "split": s} for s in SPLITS for p in arithmetic.builtin_split(s)]
            return Records(rows, source=spec, unit="problem")
        records = read_records(builtin_path(name))
        records.source = spec
    elif parsed.kind == "hub":
        from rlhfkit.data.hub import read_hub

        records = read_hub(parsed, split)
    else:
        records = read_records(parsed.name, split=parsed.split or split)
        if parsed.take is not None:
            records = records.subset(range(min(parsed.take, len(records))))
    if parsed.keep:  # TRL keeps the columns of the split it loaded: choose the split first
        records = keep_columns(_select_split(records, parsed.split or split, spec), parsed.keep)
    records = cut_prompts(rename_columns(records, parsed.columns), parsed.words)
    return _select_split(records, parsed.split or split, spec)


MIX = " + "  # several data specs read as one: TRL's dataset mixture (core/trl_data.py writes it)


class MixedRecords(Records):
    """Records of several sources, each record keeping its own location for error messages."""

    def __init__(self, parts: list[tuple[Records, int]], source: str) -> None:
        super().__init__((part[i] for part, i in parts), source=source)
        self.origins = parts

    def where(self, index: int) -> str:
        part, i = self.origins[index]
        return part.where(i)

    def subset(self, indices) -> MixedRecords:
        return MixedRecords([self.origins[i] for i in indices], self.source)


def mixture(spec: str, split: str | None) -> Records:
    """``A + B`` (TRL's ``datasets:`` mixture): the records of `split` of each part, in order. Parts
    with ``fraction=F`` keep TRL's shares (trl/scripts/utils.py get_dataset): weights w = F / sum(F),
    the largest total T with no part oversampled (min over parts of len / w), and the first
    round(w x T) records of each part."""
    parts, fractions = [], []
    for text in spec.split(MIX):
        text, fraction = _fraction_option(text.strip())
        parts.append(load_split(text, split))
        fractions.append(fraction)
    if any(f is not None for f in fractions):
        if any(f is None for f in fractions):
            raise DataError(f"{spec}: fraction must be set for every dataset of the mixture or for none")
        weights = [f / sum(fractions) for f in fractions]
        total = min(len(p) / w for p, w in zip(parts, weights) if w > 0)
        parts = [p.subset(range(round(w * total))) for p, w in zip(parts, weights)]
    return MixedRecords([(p, i) for p in parts for i in range(len(p))], spec)


def _fraction_option(text: str) -> tuple[str, float | None]:
    """(the spec without its ``fraction=F`` option, F or None)."""
    source, _, query = text.partition("?")
    kept, fraction = [], None
    for item in filter(None, query.split("&")):
        key, _, value = item.partition("=")
        if key.strip() != "fraction":
            kept.append(item)
            continue
        try:
            fraction = float(value)
        except ValueError:
            fraction = -1.0
        if not fraction >= 0:
            raise DataError(f"{text}: fraction expects a number >= 0, got {value!r}")
    return (f"{source}?{'&'.join(kept)}" if kept else source), fraction


def in_memory_records(data: Any, split: str | None) -> Records:
    """Records of data given in Python: a datasets.Dataset or DatasetDict, or a list of dicts."""
    if isinstance(data, (list, tuple)) and all(isinstance(r, dict) for r in data):
        return Records([dict(r) for r in data], source="<records>", unit="record")
    if hasattr(data, "column_names"):
        return dataset_records(data, f"<{type(data).__name__}>", split)
    raise DataError(f"data: expected a spec string, a datasets.Dataset or a list of dicts, got {type(data).__name__}")


def _select_split(records: Records, split: str | None, spec: str) -> Records:
    if split is None or not any("split" in r for r in records):
        return records
    keep = [i for i, r in enumerate(records) if r.get("split") == split]
    if not keep:
        found = sorted({printable(str(r.get("split"))) for r in records})
        raise DataError(f"{records.source}: no records with split {split!r} (found: {', '.join(found)})")
    out = records.subset(keep)
    for i, rec in enumerate(out):
        out[i] = {k: v for k, v in rec.items() if k != "split"}
    return out


def sample(records: Records, limit: int | None, seed: int) -> Records:
    """All records (order kept) if ``limit`` is None, else a seeded random subset of ``limit``."""
    if limit is None:
        return records
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigError(f"limit must be a positive integer or None, got {limit!r}")
    if limit >= len(records):
        return records
    # Random rather than first-N: built-in files are grouped by topic.
    chosen = sorted(random.Random(seed).sample(range(len(records)), limit))
    return records.subset(chosen)


def info_fields(
    records: list[dict[str, Any]], exclude: tuple[str, ...] = ("prompt", "messages")
) -> dict[str, list]:
    """Per-sample lists of every extra field, for ``reward_fn(prompts, completions, **info)``.

    A record lacking a field that others have contributes ``None``.
    """
    keys: dict[str, None] = {}
    for rec in records:
        keys.update(dict.fromkeys(k for k in rec if k not in exclude))
    return {k: [rec.get(k) for rec in records] for k in keys}
