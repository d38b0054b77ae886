"""Votes -> preference JSONL for ``rlhfkit rm`` and ``rlhfkit dpo``.

Each output line::

    {"prompt": ..., "chosen": ..., "rejected": ..., "strength": 1.0 | 0.5, "margin": float,
     "labellers": ["alice", "bob"], "votes": 2, "pair_id": ...}

Aggregation (``aggregate="mean"``, the default) turns all votes on a pair into one row:

1. each vote has a canonical score s in {-2,-1,0,+1,+2} (+ = response_a better);
2. m = mean(s); m > 0 -> chosen = response_a, m < 0 -> chosen = response_b, m == 0 -> tie;
3. ``strength`` = 1.0 if |m| >= 1.5 (nearest scale point is "significantly") else 0.5;
4. ``margin`` = |m| / 2 * margin_scale (1.0 for a unanimous "significantly", 0.5 for a
   unanimous "slightly"), usable as the Llama-2 style reward-model margin.

``aggregate="none"`` writes one row per vote with the same rules applied to that vote alone.

Ties (m == 0): ``ties="drop"`` leaves them out; ``ties="keep-as-half"`` writes the pair in
both directions, each row with strength 0.5 and margin 0.0 and ``"tie": true``, i.e. half a
win for each side: a Bradley-Terry loss on the two rows pulls the two rewards together.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from rlhfkit.label.files import write_lines_atomic
from rlhfkit.label.records import VoteRecord
from rlhfkit.label.scale import margin_from_mean, strength_from_mean

TIE_MODES = ("drop", "keep-as-half")
AGGREGATES = ("mean", "none")


def group_votes(votes: Iterable[VoteRecord]) -> list[list[VoteRecord]]:
    """Group votes by pair, keeping the input order of pairs."""
    groups: dict[str, list[VoteRecord]] = {}
    for v in votes:
        groups.setdefault(v.pair_id, []).append(v)
    return list(groups.values())


def rows_for_group(group: Sequence[VoteRecord], ties: str = "drop", margin_scale: float = 1.0) -> list[dict]:
    """The preference rows for the votes on one pair (0, 1 or 2 rows)."""
    if ties not in TIE_MODES:
        raise ValueError(f"ties must be one of {TIE_MODES}, got {ties!r}")
    first = group[0]
    mean = sum(v.score for v in group) / len(group)
    common = {
        "prompt": first.prompt,
        "labellers": sorted({v.labeller for v in group}),  # a list: a name may hold a comma
        "votes": len(group),
        "pair_id": first.pair_id,
    }
    if mean == 0:
        if ties == "drop":
            return []
        tie = {"strength": 0.5, "margin": 0.0, "tie": True}
        return [
            {**_ordered(common, first.response_a, first.response_b), **tie},
            {**_ordered(common, first.response_b, first.response_a), **tie},
        ]
    chosen, rejected = (first.response_a, first.response_b) if mean > 0 else (first.response_b, first.response_a)
    row = _ordered(common, chosen, rejected)
    row["strength"] = strength_from_mean(mean)
    row["margin"] = round(margin_from_mean(mean, margin_scale), 6)
    return [row]


def _ordered(common: dict, chosen: str, rejected: str) -> dict:
    """A row with the keys in a readable order: prompt, chosen, rejected, then the rest."""
    return {"prompt": common["prompt"], "chosen": chosen, "rejected": rejected, **common}


def preference_rows(
    votes: Sequence[VoteRecord],
    ties: str = "drop",
    aggregate: str = "mean",
    min_votes: int = 1,
    margin_scale: float = 1.0,
) -> list[dict]:
    """All preference rows for a list of votes (see the module docstring for the rules)."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
    rows: list[dict] = []
    for group in group_votes(votes):
        if len(group) < min_votes:
            continue
        units = [group] if aggregate == "mean" else [[v] for v in group]
        for unit in units:
            rows.extend(rows_for_group(unit, ties=ties, margin_scale=margin_scale))
    return rows


def write_jsonl(rows: Iterable[dict], path: str | os.PathLike[str]) -> int:
    """Write rows atomically (see ``files.write_lines_atomic``); returns the number written.

    Callers check the path first (``files.check_output``): never an input, never silently
    an existing file.
    """
    return write_lines_atomic(Path(path), (json.dumps(row, ensure_ascii=False) for row in rows))
