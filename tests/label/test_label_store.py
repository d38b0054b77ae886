"""Storage rules: assignment, the N-labellers cap, never twice, idempotency, undo, restart."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from rlhfkit.errors import DataError
from rlhfkit.label.pairs import Pair
from rlhfkit.label.scale import score_from_choice
from rlhfkit.label.store import Conflict, LabelStore, NotFound


def _vote(store: LabelStore, name: str, choice: int = 1, rid: str | None = None) -> str:
    shown = store.next_pair(name)
    assert shown is not None
    store.submit_vote(name, shown.pair_id, choice, rid or f"{name}-{shown.pair_id}")
    return shown.pair_id


def test_wal_mode_and_schema(store: LabelStore) -> None:
    con = sqlite3.connect(store.path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"pairs", "labellers", "assignments", "votes", "events", "meta"} <= tables


def test_pair_shown_is_stable_and_order_is_stored(store: LabelStore, lab) -> None:
    store.register("alice")
    first = store.next_pair("alice")
    assert first is not None and first.pair_id == "p000"
    assert store.next_pair("alice") == first  # a reload shows the same pair, same sides
    assert {first.left, first.right} == {"alpha answer 0", "beta answer 0"}


def test_left_right_order_is_random_and_scores_are_canonical(tmp_path: Path, lab) -> None:
    store = LabelStore(tmp_path / "db.sqlite", rng=random.Random(0))
    store.import_pairs(lab.make_pairs(40))
    store.register("alice")
    left_texts = {}
    for _ in range(40):
        shown = store.next_pair("alice")
        left_texts[shown.pair_id] = shown.left
        store.submit_vote("alice", shown.pair_id, 1, "r-" + shown.pair_id)  # "left significantly better"
    for vote in store.votes():
        # Whatever was on the left must be what is recorded as better.
        left_is_a = left_texts[vote.pair_id] == vote.response_a
        assert vote.score == (2 if left_is_a else -2)
        assert vote.left_side == ("a" if left_is_a else "b")
        assert vote.score == score_from_choice(1, vote.left_side)
    sides = [v.left_side for v in store.votes()]
    assert 8 <= sides.count("a") <= 32  # both orders occur (seeded, so deterministic)


def test_each_pair_goes_to_n_labellers_and_never_twice_to_one(store: LabelStore) -> None:
    for name in ("alice", "bob", "carol"):
        store.register(name)
    assert store.next_pair("alice").pair_id == "p000"
    assert store.next_pair("bob").pair_id == "p000"  # votes_per_pair = 2
    assert store.next_pair("carol").pair_id == "p001"  # p000 is held by two already
    seen = []
    while (shown := store.next_pair("alice")) is not None:
        seen.append(shown.pair_id)
        if len(seen) % 2:
            store.submit_vote("alice", shown.pair_id, 3, "r" + shown.pair_id)
        else:
            store.skip("alice", shown.pair_id)
    assert seen == ["p000", "p001", "p002", "p003", "p004"]  # each once, skipped ones never again
    p = store.progress("alice")
    assert (p.voted, p.skipped, p.remaining, p.done, p.total) == (3, 2, 0, 5, 5)


def test_skipped_pair_goes_to_someone_else(tmp_path: Path, lab) -> None:
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=1)
    store.import_pairs(lab.make_pairs(2))
    store.register("alice")
    store.register("bob")
    store.skip("alice", store.next_pair("alice").pair_id)
    assert store.next_pair("bob").pair_id == "p000"


def test_vote_errors(store: LabelStore) -> None:
    store.register("alice")
    with pytest.raises(NotFound, match="unknown labeller"):
        store.next_pair("mallory")
    with pytest.raises(NotFound, match="unknown pair_id"):
        store.submit_vote("alice", "nope", 1, "r1")
    with pytest.raises(Conflict, match="has not been shown"):
        store.submit_vote("alice", "p003", 1, "r1")
    pid = store.next_pair("alice").pair_id
    assert store.submit_vote("alice", pid, 2, "r1").stored
    assert not store.submit_vote("alice", pid, 2, "r1").stored  # idempotent replay
    with pytest.raises(Conflict, match="already used for a different vote"):
        store.submit_vote("alice", pid, 4, "r1")
    with pytest.raises(Conflict, match="already voted"):
        store.submit_vote("alice", pid, 4, "r2")
    assert len(store.votes()) == 1


def test_undo_vote_and_skip_in_reverse_order(store: LabelStore) -> None:
    store.register("alice")
    first = store.next_pair("alice")
    store.submit_vote("alice", first.pair_id, 1, "r1")
    second = store.next_pair("alice")
    store.skip("alice", second.pair_id)
    third = store.next_pair("alice")
    assert store.undo("alice") == second.pair_id  # the skip
    assert store.next_pair("alice") == second  # back, same sides
    assert store.undo("alice") == first.pair_id  # the vote
    assert store.votes() == []
    assert store.next_pair("alice") == first
    store.submit_vote("alice", first.pair_id, 5, "r3")
    assert [v.choice for v in store.votes()] == [5]
    assert store.next_pair("alice") in (second, third)
    assert store.undo("alice") == first.pair_id
    assert store.undo("alice") is None
    kinds = [r[0] for r in sqlite3.connect(store.path).execute("SELECT kind FROM events ORDER BY event_id")]
    assert kinds == ["vote", "skip", "undo-skip", "undo-vote", "vote", "undo-vote"]


def test_stale_open_assignment_expires_after_the_lease(tmp_path: Path, lab) -> None:
    now = [1_000_000.0]
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=1, lease_seconds=600, clock=lambda: now[0])
    store.import_pairs(lab.make_pairs(2))
    for name in ("alice", "bob", "carol"):
        store.register(name)
    assert store.next_pair("alice").pair_id == "p000"  # alice walks away
    assert store.next_pair("bob").pair_id == "p001"
    assert store.next_pair("carol") is None  # both pairs are held
    now[0] += 601
    assert store.next_pair("carol").pair_id == "p000"  # alice's lease ran out


def test_restart_keeps_everything(tmp_path: Path, lab) -> None:
    path = tmp_path / "db.sqlite"
    store = LabelStore(path)
    store.import_pairs(lab.make_pairs(3))
    store.register("alice")
    _vote(store, "alice", 2)
    open_pair = store.next_pair("alice")
    del store
    again = LabelStore(path)
    assert again.import_pairs(lab.make_pairs(3)) == 0
    assert [(v.labeller, v.choice) for v in again.votes()] == [("alice", 2)]
    assert again.next_pair("alice") == open_pair


def test_import_rejects_changed_text_and_deactivates_removed_pairs(store: LabelStore, lab) -> None:
    changed = [Pair("p000", "Prompt number 0?", "edited", "beta answer 0")]
    with pytest.raises(DataError, match="p000.*different text"):
        store.import_pairs(changed, source="new.jsonl")
    assert store.import_pairs(lab.make_pairs(2)) == 0
    store.register("alice")
    served = []
    while (shown := store.next_pair("alice")) is not None:
        served.append(shown.pair_id)
        store.skip("alice", shown.pair_id)
    assert served == ["p000", "p001"]
    with pytest.raises(NotFound):
        store.skip("alice", "p004")  # still in the database, but not served


def test_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "x.sqlite"
    bad.write_text("hello, I am not SQLite" * 100)
    with pytest.raises(DataError, match="cannot open as a labelling database"):
        LabelStore(bad)


# --------------------------------------------------------------------------- the per-pair cap and leases


def _votes_on(store: LabelStore, pair_id: str) -> int:
    return sum(v.pair_id == pair_id for v in store.votes())


def test_undo_of_a_skip_after_the_pair_filled_up_does_not_exceed_the_target(tmp_path: Path, lab) -> None:
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=1)
    store.import_pairs(lab.make_pairs(3))
    for name in ("alice", "bob"):
        store.register(name)
    store.skip("alice", store.next_pair("alice").pair_id)  # alice skips p000 ...
    assert store.next_pair("alice").pair_id == "p001"
    assert store.next_pair("bob").pair_id == "p000"  # ... so bob gets it and votes: 1 of 1
    store.submit_vote("bob", "p000", 2, "bob-0001")
    assert store.undo("alice") == "p000"  # the skip is taken back, but p000 has no room for her
    with pytest.raises(Conflict, match="has not been shown"):
        store.submit_vote("alice", "p000", 1, "alice-0001")
    assert _votes_on(store, "p000") == 1
    assert store.next_pair("alice").pair_id == "p001"  # her current pair again, not p000
    assert store.undo("alice") is None  # the skip is gone from her history


def test_undo_of_a_skip_reopens_the_pair_when_there_is_room(tmp_path: Path, lab) -> None:
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=1)
    store.import_pairs(lab.make_pairs(2))
    store.register("alice")
    shown = store.next_pair("alice")
    store.skip("alice", shown.pair_id)
    result = store.undo_last("alice")
    assert result is not None and (result.pair_id, result.reopened) == (shown.pair_id, True)
    assert store.next_pair("alice") == shown


def test_undo_of_a_vote_on_a_pair_removed_from_the_file_keeps_the_vote(store: LabelStore, lab) -> None:
    store.register("alice")
    first = _vote(store, "alice", 1)  # p000, stays in the file
    last = _vote(store, "alice", 5)  # p001, removed below
    store.import_pairs([p for p in lab.make_pairs(5) if p.pair_id != last])
    assert store.undo("alice") == first  # the decision on the removed pair is final
    assert [(v.pair_id, v.choice) for v in store.votes()] == [(last, 5)]


def test_a_replayed_request_id_after_undo_is_not_stored_again(store: LabelStore) -> None:
    store.register("alice")
    shown = store.next_pair("alice")
    assert store.submit_vote("alice", shown.pair_id, 2, "req-0001").stored
    assert store.undo("alice") == shown.pair_id
    with pytest.raises(Conflict, match="has since been undone"):
        store.submit_vote("alice", shown.pair_id, 2, "req-0001")  # the late retry of the first submit
    assert store.votes() == []
    assert store.submit_vote("alice", shown.pair_id, 2, "req-0002").stored  # a new request is a new vote


def test_a_labeller_holds_one_live_lease_undo_releases_the_other(tmp_path: Path, lab) -> None:
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=1)
    store.import_pairs(lab.make_pairs(4))
    for name in ("alice", "carol"):
        store.register(name)
    _vote(store, "alice")
    _vote(store, "alice")
    current = store.next_pair("alice")
    assert current.pair_id == "p002"
    assert store.undo("alice") == "p001"  # p001 is back on her screen ...
    assert store.next_pair("carol").pair_id == "p002"  # ... and p002 is free for others
    con = sqlite3.connect(store.path)
    live = con.execute("SELECT COUNT(*) FROM assignments a JOIN labellers l USING (labeller_id) "
                       "WHERE l.name = 'alice' AND a.status = 'open' AND a.assigned_at > '1970-01-02'").fetchone()
    assert live == (1,)
    store.submit_vote("alice", "p001", 3, "alice-again")
    assert store.next_pair("alice").pair_id == "p003"  # p002 is carol's now: alice's old hold is dropped


def test_votes_and_renewals_on_an_expired_lease_respect_the_cap(tmp_path: Path, lab) -> None:
    now = [1_000_000.0]
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=1, lease_seconds=600, clock=lambda: now[0])
    store.import_pairs(lab.make_pairs(3))
    for name in ("alice", "bob", "carol"):
        store.register(name)
    assert store.next_pair("alice").pair_id == "p000"
    assert store.next_pair("bob").pair_id == "p001"
    now[0] += 601  # both leases expire
    assert store.next_pair("alice").pair_id == "p000"  # renewed: nobody else took it
    assert store.next_pair("carol").pair_id == "p001"  # bob's expired lease is taken over
    store.submit_vote("carol", "p001", 1, "carol-0001")
    with pytest.raises(Conflict, match="has got all its votes while you held it"):
        store.submit_vote("bob", "p001", 5, "bob-0001")
    assert _votes_on(store, "p001") == 1
    assert store.next_pair("bob").pair_id == "p002"  # the lost pair is gone from bob's screen
    now[0] += 601
    assert store.submit_vote("bob", "p002", 4, "bob-0002").stored  # expired but still free: kept
    assert [(v.labeller, v.pair_id) for v in store.votes()] == [("carol", "p001"), ("bob", "p002")]


@pytest.mark.parametrize("lease", [float("nan"), float("inf"), -1.0, 0.0, 1e15])
def test_store_refuses_a_lease_that_would_break_the_cap(tmp_path: Path, lease: float) -> None:
    with pytest.raises(ValueError, match="lease_seconds"):
        LabelStore(tmp_path / "db.sqlite", lease_seconds=lease)
    assert not (tmp_path / "db.sqlite").exists()


def test_a_lowered_target_caps_votes_on_leases_taken_before_the_restart(tmp_path: Path) -> None:
    """Three labellers held live leases on one pair under `--votes-per-pair 3`; after a restart
    with `--votes-per-pair 1` all three votes used to be stored (three votes, cap one)."""
    path = tmp_path / "db.sqlite"
    store = LabelStore(path, votes_per_pair=3)
    store.import_pairs([Pair("only", "Prompt?", "alpha", "beta")])
    names = ["alice", "bob", "carol"]
    for name in names:
        store.register(name)
        assert store.next_pair(name).pair_id == "only"
    store.close()
    store = LabelStore(path, votes_per_pair=1)
    outcomes = []
    for i, name in enumerate(names):
        try:
            outcomes.append(store.submit_vote(name, "only", 1, f"req-{i:04d}").stored)
        except Conflict:
            outcomes.append("conflict")
    assert outcomes == [True, "conflict", "conflict"]
    assert [v.labeller for v in store.votes()] == ["alice"]
    store.close()
