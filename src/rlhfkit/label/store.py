"""SQLite storage for labelling: WAL mode, one short ``BEGIN IMMEDIATE`` transaction per action.

The schema and how a file is opened live in ``db``; the read-only questions (votes, counts,
activity) in ``queries``. This module holds the rules that change data:

- **Identity**: every method takes a labeller *name* in any spelling; it is matched by its
  normalised key (``identity.name_key``). ``invite`` gives a labeller a secret token that
  expires, ``authenticate`` maps a live token back to the labeller, ``sign_in`` trades it for
  a browser session id of its own (``session_labeller`` maps that back).
- **Leases**: an open assignment holds one of a pair's ``votes_per_pair`` places while it is
  younger than ``lease_seconds``. A labeller holds at most one live lease: handing out a pair
  (or an undo) releases their others, which come back to them later if there is room.
- **The per-pair cap**: places = votes + live leases, never more than ``votes_per_pair``. A
  lease is granted, renewed or re-opened (undo of a skip) only if a place is free, and a vote
  on an expired lease is stored only if one is.
- **Exactly once**: a vote is keyed by (labeller, pair) and by (labeller, request_id); request
  ids stay used after an undo, so a replay can never store a vote twice.

Every write runs inside ``BEGIN IMMEDIATE``, which takes SQLite's write lock up front, so the
read-check-write sequences are serialised across threads and processes (``db.Database``).
``synchronous=FULL`` makes a committed vote survive a crash.
"""

from __future__ import annotations

import math
import random
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rlhfkit.errors import DataError
from rlhfkit.label.db import Database, iso
from rlhfkit.label.identity import clean_name, name_key
from rlhfkit.label.invitations import INVITE_SECONDS, MAX_INVITE_SECONDS, Invitations  # noqa: F401 - re-exported
from rlhfkit.label.pairs import Pair
from rlhfkit.label.queries import ReadQueries
from rlhfkit.label.rationale import CRITERION_RE, clean_reason, ratings_json
from rlhfkit.label.records import (  # noqa: F401 - re-exported: the app and tests import them from here
    Conflict,
    Invalid,
    LabelError,
    NotFound,
    Progress,
    Shown,
    SubmitResult,
    UndoResult,
    VoteRecord,
)
from rlhfkit.label.scale import score_from_choice

RELEASED = iso(0)  # assigned_at of a released lease: older than any cutoff
MAX_VOTES_PER_PAIR = 1000


class LabelStore(Database, ReadQueries, Invitations):
    """All database writes for labelling. Safe to share between threads (see ``db.Database``)."""

    def __init__(
        self,
        path: str | Path,
        votes_per_pair: int = 1,
        lease_seconds: float = 1800.0,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        if not 1 <= votes_per_pair <= MAX_VOTES_PER_PAIR:
            raise ValueError(f"votes_per_pair must be 1..{MAX_VOTES_PER_PAIR}, got {votes_per_pair}")
        if not (math.isfinite(lease_seconds) and 0 < lease_seconds <= 366 * 86400):
            raise ValueError(f"lease_seconds must be a number in (0, 1 year], got {lease_seconds}")
        self.votes_per_pair = votes_per_pair
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.rng = rng or random.SystemRandom()
        super().__init__(path)

    # ---- pairs and settings

    def import_pairs(self, pairs: Sequence[Pair], source: str = "pairs file") -> int:
        """Copy pairs into the database and make exactly these the active (served) set.

        A pair_id already stored with different text is an error: votes on it would otherwise
        silently attach to other responses. Returns the number of new pairs.
        """
        now, added = iso(self.clock()), 0
        with self._tx() as con:
            con.execute("UPDATE pairs SET active = 0")
            for pos, p in enumerate(pairs):
                row = con.execute(
                    "SELECT prompt, response_a, response_b FROM pairs WHERE pair_id = ?", (p.pair_id,)
                ).fetchone()
                if row is None:
                    con.execute(
                        "INSERT INTO pairs VALUES (?, ?, ?, ?, ?, ?, ?, 1, ?)",
                        (p.pair_id, pos, p.prompt, p.response_a, p.response_b, p.model_a, p.model_b, now),
                    )
                    added += 1
                elif tuple(row) != (p.prompt, p.response_a, p.response_b):
                    raise DataError(
                        f"{source}: pair_id {p.pair_id!r} is already in {self.path} with different "
                        "text; give the changed pair a new pair_id or use a new --db"
                    )
                else:
                    con.execute("UPDATE pairs SET active = 1, position = ? WHERE pair_id = ?", (pos, p.pair_id))
        return added

    def set_meta(self, key: str, value: str) -> None:
        """Store a setting (e.g. votes_per_pair, so ``stats`` knows the target)."""
        with self._tx() as con:
            con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # ---- labellers

    @staticmethod
    def _labeller(con: sqlite3.Connection, name: str) -> sqlite3.Row:
        row = con.execute("SELECT labeller_id, name FROM labellers WHERE name_key = ?", (name_key(name),)).fetchone()
        if row is None:
            raise NotFound(f"unknown labeller {name!r}; register the name first")
        return row

    def _labeller_id(self, con: sqlite3.Connection, name: str) -> int:
        return int(self._labeller(con, name)["labeller_id"])

    @staticmethod
    def _create(con: sqlite3.Connection, name: str, now: str) -> None:
        """Insert a labeller under its display name unless one with the same key exists."""
        try:
            display = clean_name(name)
        except ValueError as e:
            raise LabelError(str(e)) from None
        con.execute(
            "INSERT OR IGNORE INTO labellers (name, name_key, created_at) VALUES (?, ?, ?)",
            (display, name_key(display), now),
        )

    def register(self, name: str) -> int:
        """Create the labeller if new (idempotent, any spelling of the name); returns the id."""
        with self._tx() as con:
            self._create(con, name, iso(self.clock()))
            return self._labeller_id(con, name)

    # ---- leases

    def _cutoff(self) -> str:
        return iso(self.clock() - self.lease_seconds)

    def _places_taken(self, con: sqlite3.Connection, pair_id: str, lid: int) -> int:
        """Votes plus live leases on ``pair_id`` held by labellers other than ``lid``."""
        return int(con.execute(
            "SELECT COUNT(*) FROM assignments WHERE pair_id = ? AND labeller_id != ? "
            "AND (status = 'voted' OR (status = 'open' AND assigned_at > ?))",
            (pair_id, lid, self._cutoff()),
        ).fetchone()[0])

    def _has_room(self, con: sqlite3.Connection, pair_id: str, lid: int) -> bool:
        return self._places_taken(con, pair_id, lid) < self.votes_per_pair

    @staticmethod
    def _release_others(con: sqlite3.Connection, lid: int, keep: str) -> None:
        """The lease cap: the labeller keeps one live lease; their other open pairs stay theirs
        (same sides) but hold no place until handed back with room."""
        con.execute(
            "UPDATE assignments SET assigned_at = ? WHERE labeller_id = ? AND status = 'open' AND pair_id != ?",
            (RELEASED, lid, keep),
        )

    _AVAILABLE = """
        FROM pairs p
        WHERE p.active = 1
          AND NOT EXISTS (SELECT 1 FROM assignments a WHERE a.pair_id = p.pair_id AND a.labeller_id = :lid)
          AND (SELECT COUNT(*) FROM assignments a WHERE a.pair_id = p.pair_id
               AND (a.status = 'voted' OR (a.status = 'open' AND a.assigned_at > :cutoff))) < :n
    """

    def _available_params(self, lid: int) -> dict[str, object]:
        return {"lid": lid, "cutoff": self._cutoff(), "n": self.votes_per_pair}

    def _current(self, con: sqlite3.Connection, lid: int) -> sqlite3.Row | None:
        """The labeller's open pair, newest first: kept if its lease is live, renewed if there is
        room, else dropped (it filled up while they were away) in favour of the next one."""
        cutoff = self._cutoff()
        for row in con.execute(
            "SELECT a.pair_id, a.left_side, a.assigned_at FROM assignments a JOIN pairs p USING (pair_id) "
            "WHERE a.labeller_id = ? AND a.status = 'open' AND p.active = 1 "
            "ORDER BY a.assigned_at DESC, p.position", (lid,),
        ).fetchall():
            if row["assigned_at"] > cutoff:
                return row
            if self._has_room(con, row["pair_id"], lid):
                con.execute("UPDATE assignments SET assigned_at = ? WHERE labeller_id = ? AND pair_id = ?",
                            (iso(self.clock()), lid, row["pair_id"]))
                return row
            con.execute("DELETE FROM assignments WHERE labeller_id = ? AND pair_id = ?", (lid, row["pair_id"]))
        return None

    def next_pair(self, name: str) -> Shown | None:
        """The labeller's current pair: their open one, else a new one, else None (all done).

        A new pair is the first (in file order) this labeller has never been assigned and that
        has a free place. The left/right order is drawn at random once and stored, so a reload
        shows the same.
        """
        with self._tx() as con:
            lid = self._labeller_id(con, name)
            row = self._current(con, lid)
            if row is not None:
                pair_id, left_side = row["pair_id"], row["left_side"]
            else:
                found = con.execute(
                    "SELECT p.pair_id " + self._AVAILABLE + " ORDER BY p.position LIMIT 1", self._available_params(lid)
                ).fetchone()
                if found is None:
                    return None
                pair_id, left_side = str(found[0]), self.rng.choice(("a", "b"))
                con.execute(
                    "INSERT INTO assignments (labeller_id, pair_id, left_side, status, assigned_at) "
                    "VALUES (?, ?, ?, 'open', ?)", (lid, pair_id, left_side, iso(self.clock())),
                )
            self._release_others(con, lid, keep=pair_id)
            p = con.execute("SELECT prompt, response_a, response_b FROM pairs WHERE pair_id = ?", (pair_id,)).fetchone()
        left, right = (p["response_a"], p["response_b"]) if left_side == "a" else (p["response_b"], p["response_a"])
        return Shown(pair_id, p["prompt"], left, right)

    # ---- decisions

    def _open_assignment(self, con: sqlite3.Connection, lid: int, name: str, pair_id: str) -> sqlite3.Row:
        """The labeller's open assignment for ``pair_id``, or the precise reason there is none."""
        if con.execute("SELECT 1 FROM pairs WHERE pair_id = ? AND active = 1", (pair_id,)).fetchone() is None:
            raise NotFound(f"unknown pair_id {pair_id!r}")
        a = con.execute(
            "SELECT left_side, status, assigned_at FROM assignments WHERE labeller_id = ? AND pair_id = ?",
            (lid, pair_id),
        ).fetchone()
        if a is None:
            raise Conflict(f"pair {pair_id!r} has not been shown to {name!r}; ask for the next pair first")
        if a["status"] != "open":
            raise Conflict(f"{name!r} has already {a['status']} pair {pair_id!r}; undo it first to change it")
        return a

    @staticmethod
    def _decide(con: sqlite3.Connection, lid: int, pair_id: str, status: str, now: str, detail: str = "") -> None:
        """Close the assignment with the labeller's next decision number and log the event."""
        seq = con.execute("SELECT COALESCE(MAX(decided_seq), 0) + 1 FROM assignments WHERE labeller_id = ?", (lid,))
        con.execute(
            "UPDATE assignments SET status = ?, decided_at = ?, decided_seq = ? WHERE labeller_id = ? AND pair_id = ?",
            (status, now, int(seq.fetchone()[0]), lid, pair_id),
        )
        _event(con, now, lid, pair_id, "vote" if status == "voted" else "skip", detail)

    def _replay(self, con: sqlite3.Connection, lid: int, pair_id: str, choice: int, request_id: str) -> bool:
        """True for a replay of a stored vote; raises if the request id was used otherwise."""
        prev = con.execute("SELECT pair_id, choice FROM request_ids WHERE labeller_id = ? AND request_id = ?",
                           (lid, request_id)).fetchone()
        if prev is None:
            return False
        if (prev["pair_id"], prev["choice"]) != (pair_id, choice):
            raise Conflict(f"request_id {request_id!r} was already used for a different vote")
        if con.execute("SELECT 1 FROM votes WHERE labeller_id = ? AND request_id = ?", (lid, request_id)).fetchone():
            return True
        raise Conflict(f"request_id {request_id!r} was used for a vote that has since been undone; "
                       "send a new request_id to vote again")

    def submit_vote(self, name: str, pair_id: str, choice: int, request_id: str, reason: str = "",
                    ratings: Mapping[str, int] | None = None) -> SubmitResult:
        """Store one vote exactly once (a replay of the same request returns ``stored=False``).

        ``reason``: optional free text (``rationale.clean_reason``); ``ratings``: optional
        {criterion: choice 1..5} in the frame shown, stored canonical like the vote.

        A vote whose lease expired is stored only if the pair still has a free place;
        otherwise the assignment is dropped and Conflict is raised.
        """
        now = iso(self.clock())
        try:
            reason = clean_reason(reason)
        except ValueError as e:
            raise Invalid(f"reason: {e}") from None
        ratings = dict(ratings or {})
        for criterion, rated in ratings.items():
            if not CRITERION_RE.fullmatch(criterion) or type(rated) is not int or not 1 <= rated <= 5:
                raise Invalid(f"ratings: {criterion[:40]!r}: expected a criterion name and a choice 1..5")
        with self._tx() as con:
            lid = self._labeller_id(con, name)
            if self._replay(con, lid, pair_id, choice, request_id):
                return SubmitResult(stored=False, pair_id=pair_id)
            a = self._open_assignment(con, lid, name, pair_id)
            full = con.execute("SELECT COUNT(*) FROM votes WHERE pair_id = ?", (pair_id,)).fetchone()[0] \
                >= self.votes_per_pair  # a live lease from before a restart with a smaller cap
            lost = full or (a["assigned_at"] <= self._cutoff() and not self._has_room(con, pair_id, lid))
            if lost:
                con.execute("DELETE FROM assignments WHERE labeller_id = ? AND pair_id = ?", (lid, pair_id))
            else:
                score = score_from_choice(choice, a["left_side"])
                shown_at = a["assigned_at"] if a["assigned_at"] != RELEASED else now
                canonical = {k: score_from_choice(v, a["left_side"]) for k, v in ratings.items()}
                con.execute(
                    "INSERT INTO votes (labeller_id, pair_id, choice, score, left_side, request_id, shown_at, "
                    "created_at, reason, ratings) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (lid, pair_id, choice, score, a["left_side"], request_id, shown_at, now, reason,
                     ratings_json(canonical)),
                )
                con.execute("INSERT INTO request_ids VALUES (?, ?, ?, ?)", (lid, request_id, pair_id, choice))
                self._decide(con, lid, pair_id, "voted", now, f"choice={choice} score={score}")
        if lost:
            raise Conflict(f"pair {pair_id!r} has got all its votes while you held it (your hold expired or the "
                           "target was lowered); this vote was not stored, take the next pair")
        return SubmitResult(stored=True, pair_id=pair_id)

    def skip(self, name: str, pair_id: str) -> SubmitResult:
        """Skip a pair: this labeller never gets it again (unless undone); others still can."""
        now = iso(self.clock())
        with self._tx() as con:
            lid = self._labeller_id(con, name)
            row = con.execute(
                "SELECT status FROM assignments WHERE labeller_id = ? AND pair_id = ?", (lid, pair_id)
            ).fetchone()
            if row is not None and row["status"] == "skipped":
                return SubmitResult(stored=False, pair_id=pair_id)  # replayed skip
            self._open_assignment(con, lid, name, pair_id)
            self._decide(con, lid, pair_id, "skipped", now)
        return SubmitResult(stored=True, pair_id=pair_id)

    def undo(self, name: str) -> str | None:
        """``undo_last`` reduced to the pair_id (None when there is nothing to undo)."""
        result = self.undo_last(name)
        return None if result is None else result.pair_id

    def undo_last(self, name: str) -> UndoResult | None:
        """Take back the labeller's most recent vote or skip on a pair still being served.

        The vote row is deleted (the events table keeps the history; its request id stays
        used) and the pair becomes the labeller's current one, same sides. An undone skip is
        re-opened only if the pair has a free place; if others filled it meanwhile the skip is
        forgotten instead (``reopened=False``). Decisions on pairs no longer in the pairs
        file are final: their votes are kept and exported.
        """
        now = iso(self.clock())
        with self._tx() as con:
            lid = self._labeller_id(con, name)
            row = con.execute(
                "SELECT a.pair_id, a.status FROM assignments a JOIN pairs p USING (pair_id) "
                "WHERE a.labeller_id = ? AND a.status != 'open' AND p.active = 1 "
                "ORDER BY a.decided_seq DESC LIMIT 1", (lid,),
            ).fetchone()
            if row is None:
                return None
            pair_id, status = row["pair_id"], row["status"]
            if status == "voted":
                con.execute("DELETE FROM votes WHERE labeller_id = ? AND pair_id = ?", (lid, pair_id))
            reopen = status == "voted" or self._has_room(con, pair_id, lid)
            if reopen:
                con.execute(
                    "UPDATE assignments SET status = 'open', decided_at = NULL, decided_seq = NULL, "
                    "assigned_at = ? WHERE labeller_id = ? AND pair_id = ?", (now, lid, pair_id),
                )
                self._release_others(con, lid, keep=pair_id)
            else:
                con.execute("DELETE FROM assignments WHERE labeller_id = ? AND pair_id = ?", (lid, pair_id))
            _event(con, now, lid, pair_id, f"undo-{'vote' if status == 'voted' else 'skip'}",
                   "" if reopen else "pair full: not re-opened")
        return UndoResult(pair_id, reopen)

    # ---- a lead's final labels

    def resolve(self, pair_id: str, score: int, note: str = "") -> None:
        """Store (or replace) the final label of a pair that has votes, apart from the votes."""
        if type(score) is not int or not -2 <= score <= 2:
            raise Invalid(f"score must be -2..2, got {score!r}")
        try:
            note = clean_reason(note)
        except ValueError as e:
            raise Invalid(f"note: {e}") from None
        with self._tx() as con:
            if con.execute("SELECT 1 FROM votes WHERE pair_id = ? LIMIT 1", (pair_id,)).fetchone() is None:
                raise NotFound(f"pair {pair_id!r} has no votes to resolve")
            con.execute("INSERT OR REPLACE INTO resolutions VALUES (?, ?, ?, ?)",
                        (pair_id, score, note, iso(self.clock())))
            _event(con, iso(self.clock()), None, pair_id, "resolve", f"score={score}")

    # ---- reading (plus what ``queries`` provides)

    def progress(self, name: str) -> Progress:
        """Votes, skips and what is left for one labeller."""
        with self._read() as con:
            who = self._labeller(con, name)
            lid = int(who["labeller_id"])
            counts = dict(con.execute(
                "SELECT a.status, COUNT(*) FROM assignments a JOIN pairs p USING (pair_id) "
                "WHERE a.labeller_id = ? AND p.active = 1 GROUP BY a.status", (lid,),
            ).fetchall())
            available = con.execute("SELECT COUNT(*) " + self._AVAILABLE, self._available_params(lid)).fetchone()[0]
        return Progress(voted=counts.get("voted", 0), skipped=counts.get("skipped", 0),
                        remaining=counts.get("open", 0) + int(available), name=str(who["name"]))

    def overall(self) -> dict[str, int]:
        """Votes stored and the target (active pairs x votes_per_pair)."""
        with self._read() as con:
            votes = con.execute("SELECT COUNT(*) FROM votes v JOIN pairs p USING (pair_id) WHERE p.active = 1")
            n_votes = int(votes.fetchone()[0])
            pairs = int(con.execute("SELECT COUNT(*) FROM pairs WHERE active = 1").fetchone()[0])
        return {"votes": n_votes, "target": pairs * self.votes_per_pair, "pairs": pairs}


def _event(con: sqlite3.Connection, at: str, lid: int | None, pair_id: str, kind: str, detail: str = "") -> None:
    con.execute(
        "INSERT INTO events (at, labeller_id, pair_id, kind, detail) VALUES (?, ?, ?, ?, ?)",
        (at, lid, pair_id, kind, detail),
    )
