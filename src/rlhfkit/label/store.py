"""SQLite storage for labelling: WAL mode, one short ``BEGIN IMMEDIATE`` transaction per action.

Tables (see ``SCHEMA``):

- ``pairs``        a copy of the pairs file, so the database alone is enough to export
- ``labellers``    one row per name
- ``assignments``  (labeller, pair) -> the left/right order shown and the status
                   (open, voted, skipped); its primary key is what makes "never the same pair
                   twice to one labeller" hold, whatever the concurrency
- ``votes``        one row per stored vote: the shown choice, the canonical score, the order
                   shown, the client's request id and timestamps; UNIQUE(labeller, pair) and
                   UNIQUE(labeller, request_id) make a vote impossible to count twice
- ``events``       an append-only log of votes, skips and undos (audit trail)
- ``meta``         schema version and serving settings

Every write runs inside ``BEGIN IMMEDIATE``, which takes SQLite's write lock up front, so the
read-check-write sequences below (the N-labellers cap, idempotent re-submits) are serialised
across threads and processes. ``synchronous=FULL`` makes a committed vote survive a crash.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rlhfkit.errors import DataError
from rlhfkit.label.pairs import Pair
from rlhfkit.label.scale import score_from_choice

SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pairs (
    pair_id    TEXT PRIMARY KEY,
    position   INTEGER NOT NULL,            -- order in the pairs file (serving order)
    prompt     TEXT NOT NULL,
    response_a TEXT NOT NULL,
    response_b TEXT NOT NULL,
    model_a    TEXT NOT NULL DEFAULT '',
    model_b    TEXT NOT NULL DEFAULT '',
    active     INTEGER NOT NULL DEFAULT 1,  -- 1 if in the pairs file being served
    added_at   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS labellers (
    labeller_id INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_at  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS assignments (
    labeller_id INTEGER NOT NULL REFERENCES labellers(labeller_id),
    pair_id     TEXT NOT NULL REFERENCES pairs(pair_id),
    left_side   TEXT NOT NULL CHECK (left_side IN ('a', 'b')),
    status      TEXT NOT NULL CHECK (status IN ('open', 'voted', 'skipped')),
    assigned_at TEXT NOT NULL,              -- when it was (last) shown
    decided_at  TEXT,
    decided_seq INTEGER,                    -- per-labeller order of decisions, for undo
    PRIMARY KEY (labeller_id, pair_id)
);
CREATE INDEX IF NOT EXISTS assignments_by_pair ON assignments (pair_id, status);
CREATE TABLE IF NOT EXISTS votes (
    vote_id     INTEGER PRIMARY KEY,
    labeller_id INTEGER NOT NULL REFERENCES labellers(labeller_id),
    pair_id     TEXT NOT NULL REFERENCES pairs(pair_id),
    choice      INTEGER NOT NULL CHECK (choice BETWEEN 1 AND 5),  -- as shown: 1 = left much better
    score       INTEGER NOT NULL CHECK (score BETWEEN -2 AND 2),  -- +2 = response_a much better
    left_side   TEXT NOT NULL CHECK (left_side IN ('a', 'b')),
    request_id  TEXT NOT NULL,
    shown_at    TEXT NOT NULL,
    created_at  TEXT NOT NULL,
    UNIQUE (labeller_id, pair_id),
    UNIQUE (labeller_id, request_id)
);
CREATE TABLE IF NOT EXISTS events (
    event_id    INTEGER PRIMARY KEY,
    at          TEXT NOT NULL,
    labeller_id INTEGER,
    pair_id     TEXT,
    kind        TEXT NOT NULL,              -- vote | skip | undo-vote | undo-skip
    detail      TEXT
);
"""


# --------------------------------------------------------------------------- errors


class LabelError(Exception):
    """A request the store refuses; ``status`` is the HTTP status the app answers with."""

    status = 400


class NotFound(LabelError):
    """Unknown pair or labeller."""

    status = 404


class Conflict(LabelError):
    """The action clashes with what is stored (already voted, not assigned, reused request id)."""

    status = 409


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Shown:
    """A pair as a labeller sees it: no A/B, no model names, just left and right."""

    pair_id: str
    prompt: str
    left: str
    right: str


@dataclass(frozen=True)
class Progress:
    """A labeller's progress: ``done`` of ``total`` (votes + skips of all they can get)."""

    voted: int
    skipped: int
    remaining: int  # open assignments + pairs still available to this labeller

    @property
    def done(self) -> int:
        return self.voted + self.skipped

    @property
    def total(self) -> int:
        return self.done + self.remaining


@dataclass(frozen=True)
class SubmitResult:
    """Outcome of a vote or skip: ``stored`` False means an idempotent replay (nothing new)."""

    stored: bool
    pair_id: str


@dataclass(frozen=True)
class VoteRecord:
    """One stored vote joined with its pair and labeller (for export and stats)."""

    pair_id: str
    labeller: str
    score: int
    choice: int
    left_side: str
    shown_at: str
    created_at: str
    prompt: str
    response_a: str
    response_b: str


def iso(ts: float) -> str:
    """Unix time -> ISO-8601 UTC with microseconds (sorts lexicographically)."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# --------------------------------------------------------------------------- store


class _Connection(sqlite3.Connection):
    """A connection that can be weakly referenced (so the store can close them all)."""


class LabelStore:
    """All database access for labelling. Safe to share between threads.

    Each thread keeps one connection (opening one costs ~20 ms, a WAL commit ~3 ms); the
    connection is closed when its thread ends or when ``close()`` is called.
    """

    def __init__(
        self,
        path: str | Path,
        votes_per_pair: int = 1,
        lease_seconds: float = 1800.0,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        if votes_per_pair < 1:
            raise ValueError(f"votes_per_pair must be >= 1, got {votes_per_pair}")
        self.path = Path(path)
        self.votes_per_pair = votes_per_pair
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.rng = rng or random.SystemRandom()
        self._local = threading.local()
        self._generation = 0  # bumped by close(): thread-local connections from before are stale
        self._open: weakref.WeakSet[_Connection] = weakref.WeakSet()
        # Writers in this process queue on a lock; SQLite's own busy handler (sleep-and-retry,
        # up to 100 ms per try) then only arbitrates between processes.
        self._write_lock = threading.Lock()
        self._init_schema()

    # ---- plumbing

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(
            self.path, timeout=30.0, isolation_level=None, check_same_thread=False, factory=_Connection
        )
        con.row_factory = sqlite3.Row
        con.execute("PRAGMA foreign_keys = ON")
        con.execute("PRAGMA synchronous = FULL")
        con.execute("PRAGMA busy_timeout = 30000")
        return con

    def _thread_connection(self) -> sqlite3.Connection:
        """This thread's connection, opened on first use and closed when the thread ends."""
        con = getattr(self._local, "con", None)
        if con is None or self._local.generation != self._generation:
            con = self._connect()
            self._local.con, self._local.generation = con, self._generation
            self._open.add(con)
            weakref.finalize(threading.current_thread(), con.close)
        return con

    def close(self) -> None:
        """Close every connection this store opened (call at shutdown)."""
        self._generation += 1
        for con in list(self._open):
            con.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction that holds the database write lock from its first statement."""
        con = self._thread_connection()
        with self._write_lock:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            try:
                con.execute("COMMIT")
            except sqlite3.Error:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A read-only snapshot (WAL readers never block writers)."""
        con = self._thread_connection()
        con.execute("BEGIN")
        try:
            yield con
        finally:
            con.execute("COMMIT")

    def _now(self) -> str:
        return iso(self.clock())

    def _init_schema(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            con = self._connect()
            try:
                mode = con.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode.lower() != "wal":
                    raise DataError(f"{self.path}: could not switch the database to WAL mode (got {mode})")
                con.executescript(SCHEMA)
                row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
                if row is None:
                    con.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                elif int(row[0]) != SCHEMA_VERSION:
                    raise DataError(f"{self.path}: schema version {row[0]}, this rlhfkit reads {SCHEMA_VERSION}")
            finally:
                con.close()
        except sqlite3.Error as e:
            raise DataError(f"{self.path}: cannot open as a labelling database ({e})") from None

    @staticmethod
    def _labeller_id(con: sqlite3.Connection, name: str) -> int:
        row = con.execute("SELECT labeller_id FROM labellers WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"unknown labeller {name!r}; register the name first")
        return int(row[0])

    @staticmethod
    def _event(con: sqlite3.Connection, at: str, lid: int, pair_id: str, kind: str, detail: str = "") -> None:
        con.execute(
            "INSERT INTO events (at, labeller_id, pair_id, kind, detail) VALUES (?, ?, ?, ?, ?)",
            (at, lid, pair_id, kind, detail),
        )

    # ---- pairs and settings

    def import_pairs(self, pairs: Sequence[Pair], source: str = "pairs file") -> int:
        """Copy pairs into the database and make exactly these the active (served) set.

        A pair_id already stored with different text is an error: votes on it would otherwise
        silently attach to other responses. Returns the number of new pairs.
        """
        now = self._now()
        added = 0
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

    def get_meta(self, key: str) -> str | None:
        with self._read() as con:
            row = con.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    # ---- labellers

    def register(self, name: str) -> int:
        """Create the labeller if new (idempotent); returns the labeller id."""
        with self._tx() as con:
            con.execute(
                "INSERT OR IGNORE INTO labellers (name, created_at) VALUES (?, ?)", (name, self._now())
            )
            return self._labeller_id(con, name)

    # ---- serving

    def next_pair(self, name: str) -> Shown | None:
        """The labeller's current pair: an open assignment, else a new one, else None (all done).

        A new pair is one this labeller has never been assigned and that fewer than
        ``votes_per_pair`` others hold (a vote, or an open assignment younger than the lease).
        The left/right order is drawn at random once and stored, so a reload shows the same.
        """
        with self._tx() as con:
            lid = self._labeller_id(con, name)
            row = con.execute(
                "SELECT a.pair_id, a.left_side FROM assignments a JOIN pairs p USING (pair_id) "
                "WHERE a.labeller_id = ? AND a.status = 'open' AND p.active = 1 "
                "ORDER BY a.assigned_at DESC LIMIT 1",
                (lid,),
            ).fetchone()
            if row is None:
                pair_id = self._first_available(con, lid)
                if pair_id is None:
                    return None
                left_side = self.rng.choice(("a", "b"))
                con.execute(
                    "INSERT INTO assignments (labeller_id, pair_id, left_side, status, assigned_at) "
                    "VALUES (?, ?, ?, 'open', ?)",
                    (lid, pair_id, left_side, self._now()),
                )
            else:
                pair_id, left_side = row
            p = con.execute(
                "SELECT prompt, response_a, response_b FROM pairs WHERE pair_id = ?", (pair_id,)
            ).fetchone()
        left, right = (p["response_a"], p["response_b"]) if left_side == "a" else (p["response_b"], p["response_a"])
        return Shown(pair_id, p["prompt"], left, right)

    _AVAILABLE = """
        FROM pairs p
        WHERE p.active = 1
          AND NOT EXISTS (SELECT 1 FROM assignments a WHERE a.pair_id = p.pair_id AND a.labeller_id = :lid)
          AND (SELECT COUNT(*) FROM assignments a WHERE a.pair_id = p.pair_id
               AND (a.status = 'voted' OR (a.status = 'open' AND a.assigned_at > :cutoff))) < :n
    """

    def _available_params(self, lid: int) -> dict[str, object]:
        return {"lid": lid, "cutoff": iso(self.clock() - self.lease_seconds), "n": self.votes_per_pair}

    def _first_available(self, con: sqlite3.Connection, lid: int) -> str | None:
        row = con.execute(
            "SELECT p.pair_id " + self._AVAILABLE + " ORDER BY p.position LIMIT 1", self._available_params(lid)
        ).fetchone()
        return None if row is None else str(row[0])

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

    def _next_seq(self, con: sqlite3.Connection, lid: int) -> int:
        row = con.execute("SELECT COALESCE(MAX(decided_seq), 0) FROM assignments WHERE labeller_id = ?", (lid,))
        return int(row.fetchone()[0]) + 1

    def submit_vote(self, name: str, pair_id: str, choice: int, request_id: str) -> SubmitResult:
        """Store one vote exactly once.

        A replay of the same (labeller, request_id) with the same pair and choice returns
        ``stored=False`` and changes nothing; the same request id with a different vote is a
        conflict. Ordering matters: the replay check comes before the "already voted" check.
        """
        now = self._now()
        with self._tx() as con:
            lid = self._labeller_id(con, name)
            prev = con.execute(
                "SELECT pair_id, choice FROM votes WHERE labeller_id = ? AND request_id = ?", (lid, request_id)
            ).fetchone()
            if prev is not None:
                if (prev["pair_id"], prev["choice"]) == (pair_id, choice):
                    return SubmitResult(stored=False, pair_id=pair_id)
                raise Conflict(f"request_id {request_id!r} was already used for a different vote")
            a = self._open_assignment(con, lid, name, pair_id)
            score = score_from_choice(choice, a["left_side"])
            con.execute(
                "INSERT INTO votes (labeller_id, pair_id, choice, score, left_side, request_id, shown_at, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (lid, pair_id, choice, score, a["left_side"], request_id, a["assigned_at"], now),
            )
            con.execute(
                "UPDATE assignments SET status = 'voted', decided_at = ?, decided_seq = ? "
                "WHERE labeller_id = ? AND pair_id = ?",
                (now, self._next_seq(con, lid), lid, pair_id),
            )
            self._event(con, now, lid, pair_id, "vote", f"choice={choice} score={score}")
        return SubmitResult(stored=True, pair_id=pair_id)

    def skip(self, name: str, pair_id: str) -> SubmitResult:
        """Skip a pair: this labeller never gets it again (unless undone); others still can."""
        now = self._now()
        with self._tx() as con:
            lid = self._labeller_id(con, name)
            row = con.execute(
                "SELECT status FROM assignments WHERE labeller_id = ? AND pair_id = ?", (lid, pair_id)
            ).fetchone()
            if row is not None and row["status"] == "skipped":
                return SubmitResult(stored=False, pair_id=pair_id)  # replayed skip
            self._open_assignment(con, lid, name, pair_id)
            con.execute(
                "UPDATE assignments SET status = 'skipped', decided_at = ?, decided_seq = ? "
                "WHERE labeller_id = ? AND pair_id = ?",
                (now, self._next_seq(con, lid), lid, pair_id),
            )
            self._event(con, now, lid, pair_id, "skip")
        return SubmitResult(stored=True, pair_id=pair_id)

    def undo(self, name: str) -> str | None:
        """Take back the labeller's most recent vote or skip; the pair becomes their current one.

        Returns the pair_id, or None when there is nothing to undo. The vote row is deleted
        (the events table keeps the history) and the assignment reopens with the same order.
        """
        now = self._now()
        with self._tx() as con:
            lid = self._labeller_id(con, name)
            row = con.execute(
                "SELECT pair_id, status FROM assignments WHERE labeller_id = ? AND status != 'open' "
                "ORDER BY decided_seq DESC LIMIT 1",
                (lid,),
            ).fetchone()
            if row is None:
                return None
            pair_id, status = row["pair_id"], row["status"]
            if status == "voted":
                con.execute("DELETE FROM votes WHERE labeller_id = ? AND pair_id = ?", (lid, pair_id))
            con.execute(
                "UPDATE assignments SET status = 'open', decided_at = NULL, decided_seq = NULL, "
                "assigned_at = ? WHERE labeller_id = ? AND pair_id = ?",
                (now, lid, pair_id),
            )
            self._event(con, now, lid, pair_id, "undo-vote" if status == "voted" else "undo-skip")
        return pair_id

    # ---- reading

    def progress(self, name: str) -> Progress:
        """Votes, skips and what is left for one labeller."""
        with self._read() as con:
            lid = self._labeller_id(con, name)
            counts = dict(
                con.execute(
                    "SELECT a.status, COUNT(*) FROM assignments a JOIN pairs p USING (pair_id) "
                    "WHERE a.labeller_id = ? AND p.active = 1 GROUP BY a.status",
                    (lid,),
                ).fetchall()
            )
            available = con.execute("SELECT COUNT(*) " + self._AVAILABLE, self._available_params(lid)).fetchone()[0]
        return Progress(
            voted=counts.get("voted", 0),
            skipped=counts.get("skipped", 0),
            remaining=counts.get("open", 0) + int(available),
        )

    def overall(self) -> dict[str, int]:
        """Votes stored and the target (active pairs x votes_per_pair)."""
        with self._read() as con:
            votes = con.execute(
                "SELECT COUNT(*) FROM votes v JOIN pairs p USING (pair_id) WHERE p.active = 1"
            ).fetchone()[0]
            pairs = con.execute("SELECT COUNT(*) FROM pairs WHERE active = 1").fetchone()[0]
        return {"votes": int(votes), "target": int(pairs) * self.votes_per_pair, "pairs": int(pairs)}

    def votes(self) -> list[VoteRecord]:
        """Every stored vote with its pair text, in pair order then time."""
        with self._read() as con:
            rows = con.execute(
                "SELECT v.pair_id, l.name, v.score, v.choice, v.left_side, v.shown_at, v.created_at, "
                "p.prompt, p.response_a, p.response_b FROM votes v "
                "JOIN labellers l USING (labeller_id) JOIN pairs p USING (pair_id) "
                "ORDER BY p.position, v.pair_id, v.created_at, v.vote_id"
            ).fetchall()
        return [VoteRecord(*r) for r in rows]

    def counts(self) -> dict[str, int]:
        """Table sizes for ``stats``."""
        with self._read() as con:
            q = {
                "pairs": "SELECT COUNT(*) FROM pairs",
                "active_pairs": "SELECT COUNT(*) FROM pairs WHERE active = 1",
                "labellers": "SELECT COUNT(*) FROM labellers",
                "votes": "SELECT COUNT(*) FROM votes",
                "skips": "SELECT COUNT(*) FROM assignments WHERE status = 'skipped'",
                "open": "SELECT COUNT(*) FROM assignments WHERE status = 'open'",
                "undos": "SELECT COUNT(*) FROM events WHERE kind LIKE 'undo-%'",
            }
            return {k: int(con.execute(sql).fetchone()[0]) for k, sql in q.items()}

    def labeller_activity(self) -> list[dict[str, object]]:
        """Per labeller: votes, skips, first/last action and median seconds per vote."""
        with self._read() as con:
            names = con.execute("SELECT labeller_id, name FROM labellers ORDER BY name").fetchall()
            out = []
            for lid, name in names:
                st = dict(
                    con.execute(
                        "SELECT status, COUNT(*) FROM assignments WHERE labeller_id = ? GROUP BY status", (lid,)
                    ).fetchall()
                )
                times = con.execute(
                    "SELECT shown_at, created_at FROM votes WHERE labeller_id = ? ORDER BY created_at", (lid,)
                ).fetchall()
                out.append(
                    {
                        "labeller": name,
                        "votes": st.get("voted", 0),
                        "skips": st.get("skipped", 0),
                        "first": times[0][1] if times else None,
                        "last": times[-1][1] if times else None,
                        "median_seconds": _median([_seconds(s, c) for s, c in times]),
                    }
                )
        return out


def _seconds(start: str, end: str) -> float:
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ"
    return (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
