"""A lead's view: the pairs where labellers disagree, and each labeller's own history.

Pure functions over ``VoteRecord`` lists (the store reads them); the app turns them into JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rlhfkit.label.export import group_votes
from rlhfkit.label.records import Resolution, VoteRecord
from rlhfkit.label.scale import CHOICE_LABELS

MAX_LISTED = 500  # pairs in one answer of the lead's view


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def disagrees(group: Sequence[VoteRecord]) -> bool:
    """True when a pair's votes point in different directions (A better / same / B better)."""
    return len({_sign(v.score) for v in group}) > 1


def disagreements(votes: Sequence[VoteRecord], resolved: Mapping[str, Resolution],
                  limit: int = MAX_LISTED) -> list[dict]:
    """The disputed pairs, in pair order: texts as A/B, every vote with its reason and ratings
    (canonical scores, + = A better), and the lead's final label if set."""
    out = []
    for group in group_votes(votes):
        if not disagrees(group):
            continue
        first, r = group[0], resolved.get(group[0].pair_id)
        out.append({
            "pair_id": first.pair_id,
            "prompt": first.prompt,
            "response_a": first.response_a,
            "response_b": first.response_b,
            "votes": [{"labeller": v.labeller, "score": v.score, "reason": v.reason, "ratings": dict(v.ratings)}
                      for v in group],
            "resolution": None if r is None else {"score": r.score, "note": r.note, "decided_at": r.decided_at},
        })
        if len(out) >= limit:
            break
    return out


def history(votes: Sequence[VoteRecord]) -> list[dict]:
    """A labeller's own votes as they saw them (left/right frame), newest first as given."""
    return [{"pair_id": v.pair_id, "prompt": v.prompt, "choice": v.choice, "choice_label": CHOICE_LABELS[v.choice],
             "reason": v.reason, "at": v.created_at} for v in votes]
