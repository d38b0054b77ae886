"""`rlhfkit label stats`: counts, per-labeller activity and inter-labeller agreement."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from rlhfkit.errors import DataError
from rlhfkit.label.agreement import cohen_kappa, counts_table, fleiss_kappa
from rlhfkit.label.export import group_votes
from rlhfkit.label.identity import printable
from rlhfkit.label.queries import ReadQueries
from rlhfkit.label.records import VoteRecord
from rlhfkit.label.scale import SCORE_NAMES

SCORES = (2, 1, 0, -1, -2)
DIRECTIONS = (1, 0, -1)  # A better, same, B better


def _sign(x: int) -> int:
    return (x > 0) - (x < 0)


def agreement(votes: Sequence[VoteRecord]) -> dict[str, object]:
    """Kappa on the 5-point scale and on direction only (A better / same / B better).

    Fleiss' kappa uses every pair with at least two votes. Cohen's kappa is added when exactly
    two labellers rated the shared pairs.
    """
    groups = [g for g in group_votes(votes) if len(g) >= 2]
    out: dict[str, object] = {"pairs_with_2plus_votes": len(groups)}
    scores = [[v.score for v in g] for g in groups]
    out["fleiss_kappa_5pt"] = fleiss_kappa(counts_table(scores, SCORES))
    out["fleiss_kappa_direction"] = fleiss_kappa(counts_table([[_sign(s) for s in g] for g in scores], DIRECTIONS))
    names = sorted({v.labeller for g in groups for v in g})
    if len(names) == 2:
        by = [{v.labeller: v.score for v in g} for g in groups]
        shared = [d for d in by if len(d) == 2]
        r1 = [d[names[0]] for d in shared]
        r2 = [d[names[1]] for d in shared]
        out["cohen_labellers"] = names
        out["cohen_kappa_5pt"] = cohen_kappa(r1, r2)
        out["cohen_kappa_direction"] = cohen_kappa([_sign(x) for x in r1], [_sign(x) for x in r2])
    return out


def criteria_summary(votes: Sequence[VoteRecord]) -> dict[str, dict[str, object]]:
    """Per criterion: how many votes rated it, the mean rating (canonical, + = A better) and the
    share of its non-tie ratings that point the same way as the vote they came with (non-tie votes)."""
    out: dict[str, dict[str, object]] = {}
    for name in sorted({name for v in votes for name, _ in v.ratings}):
        pairs = [(score, v.score) for v in votes for n, score in v.ratings if n == name]
        directed = [(s, vs) for s, vs in pairs if s != 0 and vs != 0]
        out[name] = {
            "ratings": len(pairs),
            "mean_score": sum(s for s, _ in pairs) / len(pairs),
            "agrees_with_vote": (sum(1 for s, vs in directed if _sign(s) == _sign(vs)) / len(directed)
                                 if directed else None),
        }
    return out


def compute_stats(store: ReadQueries) -> dict[str, object]:
    """Everything `label stats` shows, as a JSON-ready dict."""
    votes = store.votes()
    counts = store.counts()
    per_pair = Counter(v.pair_id for v in votes)
    target = store.get_meta("votes_per_pair")
    if target is not None and not (target.isascii() and target.isdigit()):
        raise DataError(f"{getattr(store, 'path', 'database')}: votes_per_pair {printable(repr(target))} is not a "
                        "number (a damaged or edited database)")
    non_tie = [v for v in votes if v.score != 0]
    left_wins = sum(1 for v in non_tie if v.choice <= 2)
    return {
        "counts": counts,
        "votes_per_pair_target": int(target) if target else None,
        "pairs_with_votes": len(per_pair),
        "pairs_complete": sum(1 for n in per_pair.values() if target and n >= int(target)),
        "choices": {SCORE_NAMES[s]: sum(1 for v in votes if v.score == s) for s in SCORES},
        "left_preferred_share": left_wins / len(non_tie) if non_tie else None,
        "labellers": store.labeller_activity(),
        "agreement": agreement(votes),
        "criteria": criteria_summary(votes),
    }


def _fmt(x: object) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "n/a" if math.isnan(x) else f"{x:.3f}"
    return str(x)


def format_stats(stats: dict) -> str:
    """Plain-text report of ``compute_stats``."""
    c = stats["counts"]
    lines = [
        f"pairs: {c['active_pairs']} served ({c['pairs']} in database), {stats['pairs_with_votes']} with votes, "
        f"{stats['pairs_complete']} complete (target {_fmt(stats['votes_per_pair_target'])} votes each)",
        f"votes: {c['votes']}   skips: {c['skips']}   undos: {c['undos']}   open: {c['open']}   "
        f"labellers: {c['labellers']}",
        "",
        "choices (A/B as in the pairs file):",
    ]
    lines += [f"  {name:<24} {n}" for name, n in stats["choices"].items()]
    lines.append(f"  left side preferred in {_fmt(stats['left_preferred_share'])} of non-tie votes (0.5 = no bias)")
    lines += ["", f"  {'labeller':<20} {'votes':>6} {'skips':>6} {'median s':>9}  last vote"]
    for r in stats["labellers"]:
        med = "-" if r["median_seconds"] is None else f"{r['median_seconds']:.1f}"
        name, last = printable(str(r["labeller"])), printable(str(r["last"] or "-"))
        lines.append(f"  {name:<20} {r['votes']:>6} {r['skips']:>6} {med:>9}  {last}")
    a = stats["agreement"]
    lines += [
        "",
        f"agreement over {a['pairs_with_2plus_votes']} pair(s) with 2+ votes:",
        f"  Fleiss' kappa, 5-point scale:   {_fmt(a['fleiss_kappa_5pt'])}",
        f"  Fleiss' kappa, direction only:  {_fmt(a['fleiss_kappa_direction'])}",
    ]
    if "cohen_labellers" in a:
        who = " vs ".join(printable(name) for name in a["cohen_labellers"])
        lines += [
            f"  Cohen's kappa ({who}), 5-point:   {_fmt(a['cohen_kappa_5pt'])}",
            f"  Cohen's kappa ({who}), direction: {_fmt(a['cohen_kappa_direction'])}",
        ]
    lines += [
        "",
        f"reasons given: {c.get('reasons', 0)} of {c['votes']} vote(s)   rated on criteria: "
        f"{c.get('rated_votes', 0)}   final labels set by a lead: {c.get('resolutions', 0)}",
    ]
    if stats.get("criteria"):
        lines.append(f"  {'criterion':<20} {'ratings':>8} {'mean (+ = A)':>13} {'agrees with vote':>17}")
        for name, r in stats["criteria"].items():
            lines.append(f"  {printable(name):<20} {r['ratings']:>8} {r['mean_score']:>13.3f} "
                         f"{_fmt(r['agrees_with_vote']):>17}")
    return "\n".join(lines)
