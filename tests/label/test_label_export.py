"""Export: aggregation of votes into preference rows, ties, and the `rm`/`dpo` reader."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rlhfkit.label.export import preference_rows, write_jsonl
from rlhfkit.label.store import LabelStore, VoteRecord


def v(pair: str, labeller: str, score: int) -> VoteRecord:
    """A vote on pair `pair` (response_a = 'A-text', response_b = 'B-text')."""
    return VoteRecord(pair, labeller, score, 3 - score, "a", "t0", "t1", f"prompt {pair}", f"A-{pair}", f"B-{pair}")


VOTES = [
    v("p1", "alice", 2), v("p1", "bob", 1),    # mean +1.5 -> A, significantly, margin 0.75
    v("p2", "alice", -1), v("p2", "bob", -1),  # mean -1   -> B, slightly, margin 0.5
    v("p3", "alice", 2), v("p3", "bob", -2),   # mean 0    -> tie
    v("p4", "carol", -2),                      # one vote  -> B, significantly, margin 1.0
]


def test_mean_aggregation_golden() -> None:
    rows = preference_rows(VOTES)
    assert rows == [
        {"prompt": "prompt p1", "chosen": "A-p1", "rejected": "B-p1", "labellers": ["alice", "bob"], "votes": 2,
         "pair_id": "p1", "strength": 1.0, "margin": 0.75},
        {"prompt": "prompt p2", "chosen": "B-p2", "rejected": "A-p2", "labellers": ["alice", "bob"], "votes": 2,
         "pair_id": "p2", "strength": 0.5, "margin": 0.5},
        {"prompt": "prompt p4", "chosen": "B-p4", "rejected": "A-p4", "labellers": ["carol"], "votes": 1,
         "pair_id": "p4", "strength": 1.0, "margin": 1.0},
    ]


def test_ties_keep_as_half_writes_both_directions() -> None:
    rows = [r for r in preference_rows(VOTES, ties="keep-as-half") if r["pair_id"] == "p3"]
    assert [(r["chosen"], r["rejected"], r["strength"], r["margin"], r["tie"]) for r in rows] == [
        ("A-p3", "B-p3", 0.5, 0.0, True), ("B-p3", "A-p3", 0.5, 0.0, True)]


def test_min_votes_per_vote_mode_and_margin_scale() -> None:
    assert [r["pair_id"] for r in preference_rows(VOTES, min_votes=2)] == ["p1", "p2"]
    per_vote = preference_rows(VOTES, aggregate="none")
    # p3's two opposite votes are no tie vote by vote: each becomes its own row.
    assert [(r["pair_id"], *r["labellers"], r["votes"], r["strength"]) for r in per_vote] == [
        ("p1", "alice", 1, 1.0), ("p1", "bob", 1, 0.5), ("p2", "alice", 1, 0.5), ("p2", "bob", 1, 0.5),
        ("p3", "alice", 1, 1.0), ("p3", "bob", 1, 1.0), ("p4", "carol", 1, 1.0)]
    assert preference_rows(VOTES, margin_scale=3.0)[0]["margin"] == pytest.approx(2.25)
    with pytest.raises(ValueError):
        preference_rows(VOTES, ties="coin-flip")


def test_export_is_readable_by_load_preferences(tmp_path: Path, lab) -> None:
    prefs = pytest.importorskip("rlhfkit.data.prefs")
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=1)
    store.import_pairs(lab.make_pairs(3))
    store.register("alice")
    for choice in (1, 3, 4):
        shown = store.next_pair("alice")
        store.submit_vote("alice", shown.pair_id, choice, f"req-{choice}")
    out = tmp_path / "prefs.jsonl"
    assert write_jsonl(preference_rows(store.votes(), ties="keep-as-half"), out) == 4
    loaded = prefs.load_preferences(str(out))
    assert len(loaded) == 4
    assert {r["strength"] for r in loaded} == {1.0, 0.5}
    assert all({"prompt", "chosen", "rejected", "margin"} <= set(r) for r in loaded)
    store.close()


scores = st.lists(st.integers(min_value=-2, max_value=2), min_size=1, max_size=7)


@given(scores, st.randoms(use_true_random=False))
def test_mean_aggregation_properties(pair_scores: list[int], rnd) -> None:
    """Direction follows the sign of the mean; margin/strength are in range; vote order is irrelevant."""
    votes = [v("p", f"l{i}", s) for i, s in enumerate(pair_scores)]
    rows = preference_rows(votes)
    shuffled = votes[:]
    rnd.shuffle(shuffled)
    assert preference_rows(shuffled) == rows
    total = sum(pair_scores)
    if total == 0:
        assert rows == []
        return
    [row] = rows
    assert row["chosen"] == ("A-p" if total > 0 else "B-p")
    assert 0 < row["margin"] <= 1.0 and row["strength"] in (0.5, 1.0)
    assert (row["strength"] == 1.0) == (abs(total) / len(pair_scores) >= 1.5)


def test_labeller_names_with_commas_stay_apart() -> None:
    """Names were joined with commas: "a,b" alone and "a" with "b" both read "a,b"."""
    one = preference_rows([v("p1", "a,b", 2)])[0]["labellers"]
    two = preference_rows([v("p1", "a", 2), v("p1", "b", 2)])[0]["labellers"]
    assert (one, two) == (["a,b"], ["a", "b"])
