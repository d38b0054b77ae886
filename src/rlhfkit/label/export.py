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

Reasons and criteria: when any vote carries a reason or a per-criterion rating, every row
also has ``"reasons"`` (a list of ``{"labeller", "reason"}``, the non-empty ones) and
``"criteria"`` (``{name: {"mean": float, "n": int}}``: the mean rating on the -2..+2 scale,
oriented like the row, + = ``chosen`` better on that criterion). TRL's trainers read
``prompt``/``chosen``/``rejected`` and leave the other columns alone.

Resolutions (``resolutions=``, ``export --resolve``): a pair with a lead's final label gives
one row from that label alone (strength and margin as for a single vote, ``"resolved": true``,
``labellers`` and ``votes`` still those of the votes), whatever ``aggregate`` and ``min_votes``.

Ties (m == 0): ``ties="drop"`` leaves them out; ``ties="keep-as-half"`` writes the pair in
both directions, each row with strength 0.5 and margin 0.0 and ``"tie": true``, i.e. half a
win for each side: a Bradley-Terry loss on the two rows pulls the two rewards together.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from rlhfkit.label.files import write_lines_atomic
from rlhfkit.label.records import Resolution, VoteRecord
from rlhfkit.label.scale import margin_from_mean, strength_from_mean

TIE_MODES = ("drop", "keep-as-half")
AGGREGATES = ("mean", "none")


def group_votes(votes: Iterable[VoteRecord]) -> list[list[VoteRecord]]:
    """Group votes by pair, keeping the input order of pairs."""
    groups: dict[str, list[VoteRecord]] = {}
    for v in votes:
        groups.setdefault(v.pair_id, []).append(v)
    return list(groups.values())


def rows_for_group(group: Sequence[VoteRecord], ties: str = "drop", margin_scale: float = 1.0,
                   extras: bool = False) -> list[dict]:
    """The preference rows for the votes on one pair (0, 1 or 2 rows); ``extras``: add the
    ``reasons`` and ``criteria`` columns."""
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
            {**_ordered(common, first.response_a, first.response_b), **tie, **_extras(group, 1, extras)},
            {**_ordered(common, first.response_b, first.response_a), **tie, **_extras(group, -1, extras)},
        ]
    chosen, rejected = (first.response_a, first.response_b) if mean > 0 else (first.response_b, first.response_a)
    row = _ordered(common, chosen, rejected)
    row["strength"] = strength_from_mean(mean)
    row["margin"] = round(margin_from_mean(mean, margin_scale), 6)
    row.update(_extras(group, 1 if mean > 0 else -1, extras))
    return [row]


def _extras(group: Sequence[VoteRecord], orientation: int, on: bool) -> dict:
    """The reasons and the mean rating per criterion (``orientation`` +1: chosen is A, -1: B)."""
    if not on:
        return {}
    by_criterion: dict[str, list[int]] = {}
    for v in group:
        for name, score in v.ratings:
            by_criterion.setdefault(name, []).append(score)
    return {
        "reasons": [{"labeller": v.labeller, "reason": v.reason} for v in group if v.reason],
        "criteria": {name: {"mean": round(orientation * sum(xs) / len(xs), 6), "n": len(xs)}
                     for name, xs in sorted(by_criterion.items())},
    }


def _ordered(common: dict, chosen: str, rejected: str) -> dict:
    """A row with the keys in a readable order: prompt, chosen, rejected, then the rest."""
    return {"prompt": common["prompt"], "chosen": chosen, "rejected": rejected, **common}


def _resolved_rows(group: Sequence[VoteRecord], r: Resolution, ties: str, margin_scale: float,
                   extras: bool) -> list[dict]:
    """The rows of a pair from the lead's label: one vote's rules, the voters' names and reasons."""
    lead = replace(group[0], score=r.score, labeller="", reason="", ratings=())
    rows = rows_for_group([lead], ties=ties, margin_scale=margin_scale)
    for row in rows:
        orientation = 1 if row["chosen"] == r.response_a and row["rejected"] == r.response_b else -1
        row.update({"labellers": sorted({v.labeller for v in group}), "votes": len(group), "resolved": True,
                    **_extras(group, orientation, extras)})
    return rows


def preference_rows(
    votes: Sequence[VoteRecord],
    ties: str = "drop",
    aggregate: str = "mean",
    min_votes: int = 1,
    margin_scale: float = 1.0,
    resolutions: Mapping[str, Resolution] | None = None,
) -> list[dict]:
    """All preference rows for a list of votes (see the module docstring for the rules)."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
    extras = any(v.reason or v.ratings for v in votes)
    resolutions = resolutions or {}
    rows: list[dict] = []
    for group in group_votes(votes):
        if group[0].pair_id in resolutions:
            rows.extend(_resolved_rows(group, resolutions[group[0].pair_id], ties, margin_scale, extras))
            continue
        if len(group) < min_votes:
            continue
        units = [group] if aggregate == "mean" else [[v] for v in group]
        for unit in units:
            rows.extend(rows_for_group(unit, ties=ties, margin_scale=margin_scale, extras=extras))
    return rows


def write_jsonl(rows: Iterable[dict], path: str | os.PathLike[str]) -> int:
    """Write rows atomically (see ``files.write_lines_atomic``); returns the number written.

    Callers check the path first (``files.check_output``): never an input, never silently
    an existing file.
    """
    return write_lines_atomic(Path(path), (json.dumps(row, ensure_ascii=False) for row in rows))
