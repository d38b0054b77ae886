"""The database file: foreign files refused untouched, read-only commands write nothing, migration."""

from __future__ import annotations

import hashlib
import socket
import sqlite3
from pathlib import Path

import pytest

from rlhfkit.cli import main as rlhfkit_main
from rlhfkit.errors import DataError
from rlhfkit.label.db import BASE_SCHEMA, SCHEMA_VERSION
from rlhfkit.label.store import Conflict, LabelStore


def _foreign_db(path: Path) -> str:
    """Somebody else's SQLite file (rollback journal); returns its SHA-256."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    con.execute("INSERT INTO customers (name) VALUES ('Ada')")
    con.commit()
    con.close()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _untouched(path: Path, digest: str) -> None:
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert [r[0] for r in con.execute("SELECT name FROM sqlite_master")] == ["customers"]
    assert not Path(f"{path}-wal").exists()


@pytest.mark.parametrize("command", [["stats"], ["stats", "--json"], ["export", "--out", "OUT"]])
def test_read_only_commands_refuse_a_foreign_database_and_leave_it_alone(tmp_path: Path, command, capsys) -> None:
    foreign = tmp_path / "foreign.db"
    digest = _foreign_db(foreign)
    argv = ["label", *[str(tmp_path / "out.jsonl") if a == "OUT" else a for a in command], "--db", str(foreign)]
    assert rlhfkit_main(argv) == 2
    assert capsys.readouterr().err == (f"rlhfkit: error: {foreign}: not an rlhfkit labelling database "
                                       "(its tables: customers); choose another --db\n")
    _untouched(foreign, digest)
    assert not (tmp_path / "out.jsonl").exists()


def test_serve_and_invite_refuse_a_foreign_database_too(tmp_path: Path, lab, capsys) -> None:
    foreign = tmp_path / "foreign.db"
    digest = _foreign_db(foreign)
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(2))
    with pytest.raises(DataError, match="not an rlhfkit labelling database"):
        LabelStore(foreign)
    assert rlhfkit_main(["label", "invite", "alice", "--db", str(foreign)]) == 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert rlhfkit_main(["label", "serve", "--pairs", str(pairs), "--db", str(foreign), "--port", str(port)]) == 2
    assert capsys.readouterr().err.count("not an rlhfkit labelling database") == 2
    _untouched(foreign, digest)


def _v1_database(path: Path) -> None:
    """A database as rlhfkit's first labelling release wrote it (schema version 1)."""
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode = WAL")
    con.executescript(BASE_SCHEMA)
    con.execute("INSERT INTO meta VALUES ('schema_version', '1'), ('votes_per_pair', '2')")
    t = "2026-01-01T00:00:00.000000Z"
    con.execute("INSERT INTO pairs VALUES ('p1', 0, 'prompt', 'A', 'B', '', '', 1, ?)", (t,))
    con.executemany("INSERT INTO labellers VALUES (?, ?, ?)", [(1, "alice", t), (2, "ALICE", t), (3, "bob", t)])
    for lid, rid, choice in ((1, "req-a-0001", 1), (2, "req-A-0001", 5)):
        con.execute("INSERT INTO assignments VALUES (?, 'p1', 'a', 'voted', ?, ?, 1)", (lid, t, t))
        con.execute("INSERT INTO votes (labeller_id, pair_id, choice, score, left_side, request_id, shown_at, "
                    "created_at) VALUES (?, 'p1', ?, ?, 'a', ?, ?, ?)", (lid, choice, 3 - choice, rid, t, t))
    con.close()


def test_stats_reads_an_old_database_without_migrating_it(tmp_path: Path, capsys) -> None:
    db = tmp_path / "old.sqlite"
    _v1_database(db)
    assert rlhfkit_main(["label", "stats", "--db", str(db), "--json"]) == 0
    assert '"votes": 2' in capsys.readouterr().out
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)
    assert "request_ids" not in {r[0] for r in con.execute("SELECT name FROM sqlite_master")}


def test_an_old_database_is_migrated_keeping_every_vote(tmp_path: Path) -> None:
    db = tmp_path / "old.sqlite"
    _v1_database(db)
    store = LabelStore(db, votes_per_pair=2)
    assert store.get_meta("schema_version") == str(SCHEMA_VERSION)
    assert [(v.labeller, v.choice) for v in store.votes()] == [("alice", 1), ("ALICE", 5)]
    # 'ALICE' was a second person under version 1; the name now means alice, and the old
    # identity keeps its vote under a retired key nobody can sign in as.
    keys = dict(sqlite3.connect(db).execute("SELECT name, name_key FROM labellers").fetchall())
    assert keys == {"alice": "alice", "ALICE": "alice#2", "bob": "bob"}
    assert store.progress("ALICE").voted == 1 and store.progress("ALICE").name == "alice"
    # Request ids of old votes count as used: undo then replay does not store a second vote.
    assert store.undo("alice") == "p1"
    with pytest.raises(Conflict, match="undone"):
        store.submit_vote("alice", "p1", 1, "req-a-0001")
    store.close()


def test_a_newer_database_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "new.sqlite"
    LabelStore(db).close()
    sqlite3.connect(db, isolation_level=None).execute(
        "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(DataError, match=f"schema version {SCHEMA_VERSION + 1}, this rlhfkit reads up to"):
        LabelStore(db)


def test_read_only_store_sees_the_votes_of_a_running_server(tmp_path: Path, lab) -> None:
    from rlhfkit.label.queries import ReadOnlyStore

    server = LabelStore(tmp_path / "db.sqlite")  # the serving process keeps its connections open
    server.import_pairs(lab.make_pairs(2))
    server.register("alice")
    server.submit_vote("alice", server.next_pair("alice").pair_id, 2, "req-0001")
    reader = ReadOnlyStore(server.path)
    assert [(v.labeller, v.choice) for v in reader.votes()] == [("alice", 2)]
    server.submit_vote("alice", server.next_pair("alice").pair_id, 4, "req-0002")
    assert reader.counts()["votes"] == 2  # each question is a fresh snapshot
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader._con.execute("DELETE FROM votes")
    reader.close()
    server.close()


def test_stats_escapes_what_a_supplied_database_holds_in_names(tmp_path: Path, capsys) -> None:
    """Names come from the database, which may be someone else's: a terminal escape sequence in a
    name used to reach the terminal raw (retitle it, clear it, hide text with U+202E)."""
    db = tmp_path / "supplied.sqlite"
    _v1_database(db)
    hostile = {1: "\x1b]0;pwned\x07\x1b[2Jeve", 2: "mal\u202elory"}
    con = sqlite3.connect(db)
    con.executemany("UPDATE labellers SET name = ? WHERE labeller_id = ?", [(n, i) for i, n in hostile.items()])
    con.commit()
    con.close()
    assert rlhfkit_main(["label", "stats", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "\\x1b]0;pwned\\x07\\x1b[2Jeve" in out and "mal\\u202elory" in out
    assert rlhfkit_main(["label", "stats", "--db", str(db), "--json"]) == 0
    assert "\x1b" not in capsys.readouterr().out  # JSON escapes control characters itself


def test_invite_escapes_the_stored_display_name_too(tmp_path: Path, capsys) -> None:
    db = tmp_path / "supplied.sqlite"
    LabelStore(db).register("eve")
    con = sqlite3.connect(db)
    con.execute("UPDATE labellers SET name = ? WHERE name_key = 'eve'", ("\x1b[2Jeve",))
    con.commit()
    con.close()
    for extra in ([], ["--revoke"]):
        assert rlhfkit_main(["label", "invite", "eve", "--db", str(db), *extra]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and out.count("\\x1b[2Jeve") == 2


def test_a_dangling_symlink_at_the_database_path_is_refused(tmp_path: Path, capsys) -> None:
    """SQLite followed the link and created its target with mode 0644 (votes readable by every
    user of the machine); now it is a one-line refusal and nothing is created."""
    link, target = tmp_path / "labels.sqlite", tmp_path / "elsewhere" / "real.sqlite"
    (tmp_path / "elsewhere").mkdir()
    link.symlink_to(target)
    with pytest.raises(DataError, match=r"a symlink to a missing file .*real\.sqlite"):
        LabelStore(link)
    assert rlhfkit_main(["label", "invite", "--db", str(link), "alice"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "symlink to a missing file" in err
    assert not target.exists() and link.is_symlink()


def test_table_names_of_a_foreign_database_are_escaped_in_the_refusal(tmp_path: Path, capsys) -> None:
    """`stats` on someone else's database named its tables raw on stderr: a table named with a
    terminal escape sequence retitled or cleared the terminal."""
    db = tmp_path / "foreign.db"
    con = sqlite3.connect(db)
    con.execute('CREATE TABLE "\x1b]0;pwned\x07\x1b[2Jx\u202e" (a)')
    con.commit()
    con.close()
    assert rlhfkit_main(["label", "stats", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\x07" not in err and "\u202e" not in err
    assert "(its tables: \\x1b]0;pwned\\x07\\x1b[2Jx\\u202e)" in err


@pytest.mark.parametrize(("sql", "message"), [
    ("UPDATE votes SET score = 7", "vote 1: score 7 is not one of -2..2"),
    ("UPDATE votes SET created_at = 'yesterday'", "vote 1: time 'yesterday' / "),
    ("UPDATE votes SET choice = 'x'", "vote 1: choice 'x' is not one of 1..5"),
    ("INSERT INTO meta VALUES ('votes_per_pair', 'abc')", "votes_per_pair 'abc' is not a number"),
    ("UPDATE meta SET value = '\u00b3' WHERE key = 'schema_version'", "unreadable schema version '\u00b3'"),
])
def test_a_crafted_database_is_one_line_not_a_traceback_or_a_wrong_export(tmp_path: Path, lab, capsys, sql,
                                                                            message) -> None:
    """`created_at='yesterday'`, `schema_version='³'` or `votes_per_pair='abc'` made `stats` print a
    traceback, and `export` turned score 7 into `"margin": 2.25`."""
    _, db = lab.voted_db(tmp_path)
    con = sqlite3.connect(db)
    con.execute("PRAGMA ignore_check_constraints = ON")  # a database made by hand need not have them
    con.execute(sql)
    con.commit()
    con.close()
    out = tmp_path / "prefs.jsonl"
    for command in (["stats"], ["export", "--out", str(out)]):
        if command[0] == "export" and "votes_per_pair" in sql:
            continue  # export does not read the target
        assert rlhfkit_main(["label", *command, "--db", str(db)]) == 2, command
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err and message in err, err
    assert not out.exists()
