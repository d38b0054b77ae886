"""Read-only questions about a labelling database (used by ``stats`` and ``export``).

The queries touch version-1 columns, and version-4 ones (reasons, ratings, resolutions) only
when the database has them, so a database written by an older rlhfkit can be read without
being migrated. ``ReadOnlyStore`` answers them over a ``mode=ro`` connection;
``LabelStore`` inherits the same methods through ``ReadQueries``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path

from rlhfkit.errors import DataError
from rlhfkit.label.db import open_read_only
from rlhfkit.label.identity import printable
from rlhfkit.label.rationale import MAX_REASON_CHARS, parse_ratings
from rlhfkit.label.records import Resolution, VoteRecord

COUNTS = {
    "pairs": "SELECT COUNT(*) FROM pairs",
    "active_pairs": "SELECT COUNT(*) FROM pairs WHERE active = 1",
    "labellers": "SELECT COUNT(*) FROM labellers",
    "votes": "SELECT COUNT(*) FROM votes",
    "skips": "SELECT COUNT(*) FROM assignments WHERE status = 'skipped'",
    "open": "SELECT COUNT(*) FROM assignments WHERE status = 'open'",
    "undos": "SELECT COUNT(*) FROM events WHERE kind LIKE 'undo-%'",
}
RATIONALE_COUNTS = {  # version 4 (0 in an older database)
    "reasons": "SELECT COUNT(*) FROM votes WHERE reason != ''",
    "rated_votes": "SELECT COUNT(*) FROM votes WHERE ratings != '{}'",
    "resolutions": "SELECT COUNT(*) FROM resolutions",
}


class ReadQueries:
    """Reading methods shared by the read-write and the read-only store."""

    def _read(self) -> AbstractContextManager[sqlite3.Connection]:  # pragma: no cover - overridden
        raise NotImplementedError

    def get_meta(self, key: str) -> str | None:
        with self._read() as con:
            row = con.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _has_rationales(self, con: sqlite3.Connection) -> bool:
        """Whether the database has the version-4 columns and tables (reasons, resolutions)."""
        return con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'resolutions'").fetchone() \
            is not None

    def _vote_rows(self, con: sqlite3.Connection, where: str = "", params: tuple = ()) -> list[VoteRecord]:
        extra = "v.reason, v.ratings" if self._has_rationales(con) else "'', '{}'"
        rows = con.execute(
            "SELECT v.pair_id, l.name, v.score, v.choice, v.left_side, v.shown_at, v.created_at, "
            f"p.prompt, p.response_a, p.response_b, {extra}, v.vote_id FROM votes v "
            f"JOIN labellers l USING (labeller_id) JOIN pairs p USING (pair_id) {where} "
            "ORDER BY p.position, v.pair_id, v.created_at, v.vote_id", params
        ).fetchall()
        out = []
        for r in rows:
            ratings = _check_vote(getattr(self, "path", "database"), r)
            out.append(VoteRecord(*r[:10], reason=r[10], ratings=ratings))
        return out

    def votes(self) -> list[VoteRecord]:
        """Every stored vote with its pair text, reason and ratings, in pair order then time."""
        with self._read() as con:
            return self._vote_rows(con)

    def votes_of(self, name_key: str, limit: int = 200) -> list[VoteRecord]:
        """One labeller's votes (by normalised name key), newest first, at most ``limit``."""
        with self._read() as con:
            rows = self._vote_rows(con, "WHERE l.name_key = ?", (name_key,))
        return sorted(rows, key=lambda v: v.created_at, reverse=True)[:limit]

    def resolutions(self) -> dict[str, Resolution]:
        """The leads' final labels by pair_id (none in a database older than version 4)."""
        with self._read() as con:
            if not self._has_rationales(con):
                return {}
            rows = con.execute(
                "SELECT r.pair_id, r.score, r.note, r.decided_at, p.prompt, p.response_a, p.response_b "
                "FROM resolutions r JOIN pairs p USING (pair_id) ORDER BY p.position, r.pair_id"
            ).fetchall()
        path = getattr(self, "path", "database")
        for r in rows:
            if type(r[1]) is not int or not -2 <= r[1] <= 2 or not isinstance(r[2], str):
                raise DataError(f"{path}: resolution of pair {printable(repr(r[0]))}: score {printable(repr(r[1]))} "
                                "is not one of -2..2 (a damaged or edited database)")
        return {r[0]: Resolution(*r) for r in rows}

    def counts(self) -> dict[str, int]:
        """Table sizes for ``stats``."""
        with self._read() as con:
            out = {k: int(con.execute(sql).fetchone()[0]) for k, sql in COUNTS.items()}
            new = self._has_rationales(con)
            for key, sql in RATIONALE_COUNTS.items():
                out[key] = int(con.execute(sql).fetchone()[0]) if new else 0
        return out

    def labeller_activity(self) -> list[dict[str, object]]:
        """Per labeller: votes, skips, first/last action and median seconds per vote."""
        with self._read() as con:
            names = con.execute("SELECT labeller_id, name FROM labellers ORDER BY name").fetchall()
            out = []
            for lid, name in names:
                st = dict(con.execute(
                    "SELECT status, COUNT(*) FROM assignments WHERE labeller_id = ? GROUP BY status", (lid,)
                ).fetchall())
                times = con.execute(
                    "SELECT shown_at, created_at FROM votes WHERE labeller_id = ? ORDER BY created_at", (lid,)
                ).fetchall()
                out.append({
                    "labeller": name,
                    "votes": st.get("voted", 0),
                    "skips": st.get("skipped", 0),
                    "first": times[0][1] if times else None,
                    "last": times[-1][1] if times else None,
                    "median_seconds": _median([_seconds(s, c) for s, c in times]),
                })
        return out


class ReadOnlyStore(ReadQueries):
    """A labelling database opened read-only: nothing here can change the file's contents."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._con = open_read_only(self.path)

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One consistent snapshot per question (a WAL reader never blocks the server)."""
        self._con.execute("BEGIN")
        try:
            yield self._con
        finally:
            self._con.execute("COMMIT")

    def close(self) -> None:
        self._con.close()


TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"  # db.iso


def _is_time(value: object) -> bool:
    try:
        datetime.strptime(value, TIME_FORMAT)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def _check_vote(path: object, row: sqlite3.Row | tuple) -> tuple[tuple[str, int], ...]:
    """Refuse, in one line, a vote row no rlhfkit could have written (a damaged or edited
    database): it would crash ``stats`` or export a margin outside [0, 1]. Returns its ratings."""
    score, choice, shown_at, created_at, vote_id = row[2], row[3], row[5], row[6], row[-1]
    reason, ratings = row[10], parse_ratings(row[11])
    problem = None
    if type(score) is not int or not -2 <= score <= 2:
        problem = f"score {score!r} is not one of -2..2"
    elif type(choice) is not int or not 1 <= choice <= 5:
        problem = f"choice {choice!r} is not one of 1..5"
    elif not _is_time(created_at) or (shown_at is not None and not _is_time(shown_at)):
        problem = f"time {created_at!r} / {shown_at!r} is not of the form 2026-01-31T12:00:00.000000Z"
    elif not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        problem = f"reason is not text of at most {MAX_REASON_CHARS} characters"
    elif ratings is None:
        problem = f"ratings {str(row[11])[:60]!r} are not {{criterion: -2..2}}"
    if problem is not None:
        raise DataError(f"{path}: vote {vote_id}: {printable(problem)} (a damaged or edited database)")
    return ratings


def _seconds(start: str, end: str) -> float:
    return (datetime.strptime(end, TIME_FORMAT) - datetime.strptime(start, TIME_FORMAT)).total_seconds()


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
