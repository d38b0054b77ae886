"""The labelling database file: schema, versions, and opening it for writing or read-only.

Tables (``BASE_SCHEMA`` is version 1, ``MIGRATIONS`` bring it to ``SCHEMA_VERSION``):

- ``pairs``        a copy of the pairs file, so the database alone is enough to export
- ``labellers``    one row per person: display ``name``, normalised ``name_key`` (unique),
                   ``token_hash`` (SHA-256 of their invitation token, if invited) and
                   ``invite_expires_at`` (when that link stops working; NULL: never, links
                   made before version 3)
- ``sessions``     signed-in browsers: SHA-256 of the session id (the cookie), labeller,
                   expiry (the link's)
- ``assignments``  (labeller, pair) -> the left/right order shown and the status
                   (open, voted, skipped); ``assigned_at`` is when the lease started
- ``votes``        one row per stored vote; UNIQUE(labeller, pair) and UNIQUE(labeller, request_id);
                   since version 4 also the labeller's ``reason`` ('' for none) and ``ratings``
                   (JSON ``{criterion: score -2..2}``, canonical frame; ``{}`` for none)
- ``resolutions``  (version 4) a lead's final label per pair, apart from the votes: ``score``
                   -2..2 (canonical), ``note``, ``decided_at``; used by ``export --resolve``
- ``request_ids``  every request id a labeller has voted with, kept after an undo, so a
                   replayed request is never stored twice
- ``events``       an append-only log of votes, skips and undos (audit trail)
- ``meta``         schema version and serving settings

Opening rules: a new or empty file becomes a labelling database; a file with tables must
already be one (``meta.schema_version`` and the tables above), else it is refused untouched.
Read-only opening (``stats``, ``export``) uses SQLite's ``mode=ro``: it never switches the
journal mode, creates a table or migrates.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import stat
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from rlhfkit.errors import DataError
from rlhfkit.label.identity import name_key, printable

SCHEMA_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)  # read-only queries use version-1 columns, plus version-4 ones if there
TABLES = frozenset({"meta", "pairs", "labellers", "assignments", "votes", "events"})

BASE_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE pairs (
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
CREATE TABLE labellers (
    labeller_id INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_at  TEXT NOT NULL
);
CREATE TABLE assignments (
    labeller_id INTEGER NOT NULL REFERENCES labellers(labeller_id),
    pair_id     TEXT NOT NULL REFERENCES pairs(pair_id),
    left_side   TEXT NOT NULL CHECK (left_side IN ('a', 'b')),
    status      TEXT NOT NULL CHECK (status IN ('open', 'voted', 'skipped')),
    assigned_at TEXT NOT NULL,              -- when the lease started (shown or shown again)
    decided_at  TEXT,
    decided_seq INTEGER,                    -- per-labeller order of decisions, for undo
    PRIMARY KEY (labeller_id, pair_id)
);
CREATE INDEX assignments_by_pair ON assignments (pair_id, status);
CREATE TABLE votes (
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
CREATE TABLE events (
    event_id    INTEGER PRIMARY KEY,
    at          TEXT NOT NULL,
    labeller_id INTEGER,
    pair_id     TEXT,
    kind        TEXT NOT NULL,              -- vote | skip | undo-vote | undo-skip
    detail      TEXT
);
"""

MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: (
        "ALTER TABLE labellers ADD COLUMN name_key TEXT",
        "ALTER TABLE labellers ADD COLUMN token_hash TEXT",
        "ALTER TABLE labellers ADD COLUMN invited_at TEXT",
        "CREATE TABLE request_ids (labeller_id INTEGER NOT NULL REFERENCES labellers(labeller_id), "
        "request_id TEXT NOT NULL, pair_id TEXT NOT NULL, choice INTEGER NOT NULL, "
        "PRIMARY KEY (labeller_id, request_id))",
        "INSERT INTO request_ids SELECT labeller_id, request_id, pair_id, choice FROM votes",
        # name keys are filled in by _fill_name_keys before the unique indexes are built
        "CREATE UNIQUE INDEX labellers_by_key ON labellers (name_key)",
        "CREATE UNIQUE INDEX labellers_by_token ON labellers (token_hash)",
    ),
    3: (
        "ALTER TABLE labellers ADD COLUMN invite_expires_at TEXT",
        "CREATE TABLE sessions (session_hash TEXT PRIMARY KEY, "
        "labeller_id INTEGER NOT NULL REFERENCES labellers(labeller_id), "
        "created_at TEXT NOT NULL, expires_at TEXT NOT NULL)",
    ),
    4: (
        "ALTER TABLE votes ADD COLUMN reason TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE votes ADD COLUMN ratings TEXT NOT NULL DEFAULT '{}'",
        "CREATE TABLE resolutions (pair_id TEXT PRIMARY KEY REFERENCES pairs(pair_id), "
        "score INTEGER NOT NULL CHECK (score BETWEEN -2 AND 2), note TEXT NOT NULL DEFAULT '', "
        "decided_at TEXT NOT NULL)",
    ),
}


def iso(ts: float) -> str:
    """Unix time -> ISO-8601 UTC with microseconds (sorts lexicographically)."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def stored_version(con: sqlite3.Connection, path: Path) -> int | None:
    """The schema version of a labelling database, None for an empty file; refuses anything else."""
    tables = _tables(con)
    if not tables:
        return None
    row = None
    if TABLES <= tables:
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        found = ", ".join(printable(t) for t in sorted(tables)[:6])  # names a terminal could act on
        raise DataError(f"{path}: not an rlhfkit labelling database (its tables: {found}); choose another --db")
    if not (str(row[0]).isascii() and str(row[0]).isdigit()):  # '³'.isdigit() is True, int('³') fails
        raise DataError(f"{path}: unreadable schema version {row[0]!r}")
    return int(row[0])


def _fill_name_keys(con: sqlite3.Connection) -> None:
    """Give every labeller its key; names that now collide (``alice``/``ALICE``, allowed by
    version 1) keep their votes under the first one's key plus ``#ID``: a retired identity."""
    seen: set[str] = set()
    for lid, name in con.execute("SELECT labeller_id, name FROM labellers ORDER BY labeller_id").fetchall():
        key = name_key(name)
        key = key if key not in seen else f"{key}#{lid}"
        seen.add(key)
        con.execute("UPDATE labellers SET name_key = ? WHERE labeller_id = ?", (key, lid))


def _upgrade(con: sqlite3.Connection, version: int) -> None:
    """Apply the migrations after ``version`` (0 = empty file) in one transaction."""
    con.execute("BEGIN IMMEDIATE")
    try:
        if version == 0:
            for statement in BASE_SCHEMA.split(";"):
                if statement.strip():
                    con.execute(statement)
            con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        for target in range(max(version, 1) + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[target]:
                if statement.startswith("CREATE UNIQUE INDEX labellers_by_key"):
                    _fill_name_keys(con)
                con.execute(statement)
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def prepare_for_writing(con: sqlite3.Connection, path: Path) -> None:
    """Make ``con``'s file a current labelling database in WAL mode (or refuse it untouched)."""
    version = stored_version(con, path)
    if version is not None and version > SCHEMA_VERSION:
        raise DataError(f"{path}: schema version {version}, this rlhfkit reads up to {SCHEMA_VERSION}")
    mode = con.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        raise DataError(f"{path}: could not switch the database to WAL mode (got {mode})")
    if version != SCHEMA_VERSION:
        _upgrade(con, version or 0)


def _checked_version(con: sqlite3.Connection, path: Path) -> int:
    """The schema version of a database opened for reading, or a one-line refusal."""
    version = stored_version(con, path)
    if version is None:
        raise DataError(f"{path}: empty file, not an rlhfkit labelling database")
    if version not in READABLE_VERSIONS:
        raise DataError(f"{path}: schema version {version}, this rlhfkit reads {READABLE_VERSIONS}")
    return version


def _connect_read_only(path: Path, flag: str) -> sqlite3.Connection:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?{flag}", uri=True, isolation_level=None,
                          check_same_thread=False)
    con.execute("PRAGMA busy_timeout = 30000")
    return con


def open_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to an existing labelling database (refuses anything else).

    ``mode=ro`` first. SQLite reads a WAL database through its ``-shm`` file, which it must
    create if it is missing, so in a folder this user cannot write that fails ("attempt to
    write a readonly database"). Then, if there is no ``-wal`` file (every vote is in the
    database file, and nobody can be writing: a writer would need to create one), the file
    is read as ``immutable``; otherwise the message says what to do.
    """
    if path.exists() and not path.is_file():
        raise DataError(f"{path}: not a regular file; the database must be a file")
    if not path.is_file():
        raise DataError(f"{path}: no labelling database (start `rlhfkit label serve` first)")
    wal = path.resolve().with_name(path.resolve().name + "-wal")
    con = None
    try:
        try:
            con = _connect_read_only(path, "mode=ro")
            _checked_version(con, path)
        except sqlite3.OperationalError:
            if con is not None:
                con.close()
            if os.access(wal.parent, os.W_OK):
                raise
            if wal.exists() and wal.stat().st_size > 0:
                raise DataError(f"{path}: cannot read it here: SQLite must create {wal.name[:-4]}-shm next to it to "
                                f"read the votes still in {wal.name}, and this user cannot write that folder; "
                                "copy the database with its -wal file to a folder you can write") from None
            con = _connect_read_only(path, "immutable=1")
            _checked_version(con, path)
    except (sqlite3.Error, DataError) as e:
        if con is not None:
            con.close()
        if isinstance(e, DataError):
            raise
        raise DataError(f"{path}: cannot open as a labelling database ({e})") from None
    return con


def prepare_file(path: Path) -> None:
    """Make sure ``path`` can become the database: an existing regular file, or a new empty one
    that only its owner may read (0600; SQLite gives the -wal and -shm files the same mode).
    Refuses a directory and anything else that is not a regular file (``/dev/null``).

    A new file is created with ``O_EXCL`` and closed again; an existing one is only looked at
    (``stat``), never opened, because closing a descriptor of a file drops every POSIX lock
    this process holds on it, SQLite's included.
    """
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a labelling database")
    if path.is_symlink() and not path.exists():  # SQLite would create the target, mode 0644
        raise DataError(f"{path}: a symlink to a missing file ({os.readlink(path)}); "
                        "remove the link or give the target's path")
    if path.exists():
        if not stat.S_ISREG(path.stat().st_mode):
            raise DataError(f"{path}: not a regular file; the database must be a file")
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOCTTY, 0o600))
    except FileExistsError:
        pass  # made meanwhile: SQLite decides
    except OSError as e:
        raise DataError(f"{path}: cannot create the labelling database ({e.strerror or e})") from None


def hold_for_serving(path: Path) -> int:
    """Take the serving lock of the database file and return the descriptor that holds it.

    One live ``serve`` per database: a second one with other settings or another pairs file
    would silently take over (caps broken, pairs swapped under a labeller). The lock is an
    exclusive ``flock`` on the database file itself: independent of SQLite's own (POSIX)
    locks, shared by every name of the file (symlinks, hard links), and released by the
    kernel when the server ends, even by ``kill -9``. Take it before this process opens the
    database with SQLite, and close the descriptor only after every SQLite connection of this
    process to the file is closed (see ``prepare_file``).
    """
    prepare_file(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY)
    except OSError as e:
        raise DataError(f"{path}: cannot open as a labelling database ({e.strerror or e})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataError(f"{path}: another `rlhfkit label serve` is serving this database; stop it first "
                        "or choose another --db") from None
    return fd


def _write_hint(error: sqlite3.Error) -> str:
    text = str(error).lower()
    if "readonly" in text or "read-only" in text:
        return "; check that you may write the file and its folder"
    if "full" in text:
        return "; free some disk space"
    return ""


@contextmanager
def writes_reported(path: Path) -> Iterator[None]:
    """Turn an SQLite error while writing (read-only file or folder, full disk, I/O error) into
    one line naming the database, for the commands that write (``serve``, ``invite``)."""
    try:
        yield
    except sqlite3.Error as e:
        raise DataError(f"{path}: cannot write to the labelling database ({e}{_write_hint(e)})") from None


class _Connection(sqlite3.Connection):
    """A connection that can be weakly referenced (so the store can close them all)."""


class Database:
    """A labelling database opened for writing: one connection per thread, short transactions.

    Opening one costs ~20 ms, a WAL commit ~3 ms; a thread's connection is closed when the
    thread ends or when ``close()`` is called. Every write goes through ``_tx``: writers in
    this process queue on a lock, SQLite's ``BEGIN IMMEDIATE`` then only arbitrates between
    processes.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._local = threading.local()
        self._generation = 0  # bumped by close(): thread-local connections from before are stale
        self._open: weakref.WeakSet[_Connection] = weakref.WeakSet()
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

    def _init_schema(self) -> None:
        prepare_file(self.path)
        try:
            con = self._connect()
            try:
                prepare_for_writing(con, self.path)
            finally:
                con.close()
        except (sqlite3.Error, OSError) as e:
            hint = _write_hint(e) if isinstance(e, sqlite3.Error) else ""
            raise DataError(f"{self.path}: cannot open as a labelling database ({e}{hint})") from None
