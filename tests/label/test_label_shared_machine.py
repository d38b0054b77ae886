"""`rlhfkit label` on a machine and a network shared with others: one server per database,
databases that cannot be written, private files, the access token kept out of sight."""

from __future__ import annotations

import json
import os
import select
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.cli import main as rlhfkit_main
from rlhfkit.label import cli
from rlhfkit.label.pairs import read_pairs
from rlhfkit.label.store import LabelStore


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "usage:" not in err, err
    return err.strip()


# --------------------------------------------------------------------------- one server per database


def test_a_second_serve_on_a_served_database_is_refused_until_the_first_is_gone(tmp_path: Path, lab, no_server,
                                                                               capsys) -> None:
    """A second `serve` on the same database used to take over silently: with another
    --votes-per-pair a pair got 3 votes against a cap of 1, with another pairs file the first
    server handed out the other file's pairs. kill -9 of the first must not leave it locked."""
    first_pairs = lab.write_pairs_file(tmp_path / "first.jsonl", lab.make_pairs(2))
    other_pairs = lab.write_pairs_file(tmp_path / "other.jsonl", lab.make_pairs(4)[2:])
    db = tmp_path / "votes.sqlite"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    port, other_port = (lab.free_port() for _ in range(2))
    first = subprocess.Popen([sys.executable, "-m", "rlhfkit.cli", "label", "serve", "--pairs", str(first_pairs),
                              "--db", str(db), "--port", str(port)], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert select.select([first.stdout], [], [], 60)[0], "the first server printed nothing in 60 s"
        assert first.stdout.readline().startswith("labelling 2 pair(s)")  # printed once it holds the database
        second = ["label", "serve", "--pairs", str(other_pairs), "--db", str(db), "--port", str(other_port),
                  "--votes-per-pair", "3"]
        assert rlhfkit_main(second) == 2
        assert _error_line(capsys) == (f"rlhfkit: error: {db}: another `rlhfkit label serve` is serving this "
                                       "database; stop it first or choose another --db")
        store = LabelStore(db)
        assert (store.overall(), store.get_meta("votes_per_pair")) == ({"votes": 0, "target": 2, "pairs": 2}, "1")
        store.close()
    finally:
        first.kill()  # SIGKILL: no clean shutdown, the kernel drops the lock
        first.wait(timeout=30)
    with pytest.raises(AssertionError, match="the server was started"):
        rlhfkit_main(second)


# --------------------------------------------------------------------------- databases that cannot be written


ROOT_WITHOUT_OVERRIDE = ["setpriv", "--inh-caps=-dac_override", "--bounding-set=-dac_override"]


def _can_drop_root_override() -> bool:
    if os.geteuid() != 0:
        return True  # not needed
    if shutil.which("setpriv") is None:
        return False
    return subprocess.run([*ROOT_WITHOUT_OVERRIDE, "true"], capture_output=True).returncode == 0


NO_OVERRIDE = pytest.mark.skipif(not _can_drop_root_override(), reason="root, and setpriv cannot drop CAP_DAC_OVERRIDE")


def _as_a_user_who_may_not_write(argv: list[str]) -> subprocess.CompletedProcess:
    """`rlhfkit label ...` as a user held to the files' permission bits: root may write any
    file, so as root the command runs without that capability (setpriv)."""
    prefix = ROOT_WITHOUT_OVERRIDE if os.geteuid() == 0 else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run([*prefix, sys.executable, "-m", "rlhfkit.cli", "label", *argv], capture_output=True,
                          text=True, env=env, timeout=120)


@NO_OVERRIDE
def test_invite_and_serve_on_a_database_they_may_not_write_say_so_in_one_line(tmp_path: Path, lab) -> None:
    """`attempt to write a readonly database` used to end `invite` and `serve` in a traceback."""
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(2))
    db = cli.default_db(pairs)
    LabelStore(db).close()
    before = db.read_bytes()
    db.chmod(0o444)
    for argv in (["invite", "alice", "--db", str(db)],
                 ["serve", "--pairs", str(pairs), "--db", str(db), "--port", str(lab.free_port())]):
        done = _as_a_user_who_may_not_write(argv)
        assert (done.returncode, done.stdout, done.stderr.count("\n")) == (2, "", 1), done.stderr
        assert done.stderr == (f"rlhfkit: error: {db}: cannot write to the labelling database (attempt to write a "
                               "readonly database; check that you may write the file and its folder)\n")
    assert db.read_bytes() == before


@pytest.mark.parametrize("command", ["invite", "serve"])
def test_a_full_disk_is_one_line(tmp_path: Path, lab, no_server, capsys, monkeypatch, command: str) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(LabelStore, "invite" if command == "invite" else "import_pairs", full)
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(2))
    argv = ["invite", "alice", "--pairs", str(pairs)] if command == "invite" else \
        ["serve", "--pairs", str(pairs), "--port", str(lab.free_port())]
    assert rlhfkit_main(["label", *argv]) == 2
    assert _error_line(capsys) == (f"rlhfkit: error: {cli.default_db(pairs)}: cannot write to the labelling "
                                   "database (database or disk is full; free some disk space)")


# --------------------------------------------------------------------------- shared-machine defaults


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> str:
    return oct(path.stat().st_mode & 0o777)


def test_database_side_files_exports_and_pairs_files_are_private(tmp_path: Path, lab, fake_models, umask_022,
                                                                  capsys) -> None:
    """Under umask 022 they were all 0644: every local user could read prompts, answers and names."""
    out = tmp_path / "pairs.jsonl"
    assert rlhfkit_main(["label", "pairs", "--prompts", "builtin:reviews", "--limit", "2", "--out", str(out)]) == 0
    assert rlhfkit_main(["label", "invite", "alice", "--pairs", str(out)]) == 0
    db = cli.default_db(out)
    store = LabelStore(db)  # open, as a server would be: the -wal and -shm files exist
    store.import_pairs(read_pairs(out))
    store.submit_vote("alice", store.next_pair("alice").pair_id, 1, "req-0001")
    prefs = tmp_path / "prefs.jsonl"
    assert rlhfkit_main(["label", "export", "--db", str(db), "--out", str(prefs)]) == 0
    files = [out, db, Path(f"{db}-wal"), Path(f"{db}-shm"), prefs]
    assert {p.name: _mode(p) for p in files} == {p.name: oct(0o600) for p in files}
    store.close()


@pytest.mark.parametrize("command", ["serve", "invite", "stats", "export"])
def test_the_database_must_be_a_regular_file(tmp_path: Path, lab, no_server, capsys, command: str) -> None:
    """`--db /dev/null` was accepted."""
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(1))
    argv = {"serve": ["serve", "--pairs", str(pairs), "--port", str(lab.free_port())], "invite": ["invite", "alice"],
            "stats": ["stats"], "export": ["export", "--out", str(tmp_path / "o.jsonl")]}[command]
    assert rlhfkit_main(["label", *argv, "--db", os.devnull]) == 2
    assert _error_line(capsys) == f"rlhfkit: error: {os.devnull}: not a regular file; the database must be a file"
    assert not Path(f"{os.devnull}-wal").exists() and not (tmp_path / "o.jsonl").exists()


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list:
    """Let `serve` go all the way but hand back the app instead of serving it."""
    from rlhfkit.label import serve

    apps: list = []
    monkeypatch.setattr(serve, "run_server", lambda app, sock, log_level: apps.append(app))
    return apps


def test_a_token_from_the_environment_is_used_and_never_printed(tmp_path: Path, lab, served, monkeypatch,
                                                                capsys) -> None:
    """The banner printed the token, wherever it came from (a banner ends up in logs; an option in `ps`)."""
    from fastapi.testclient import TestClient

    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(1))
    monkeypatch.setenv("RLHFKIT_LABEL_TOKEN", "env-token-123")
    assert rlhfkit_main(["label", "serve", "--pairs", str(pairs), "--port", str(lab.free_port())]) == 0
    out = capsys.readouterr().out
    assert "env-token-123" not in out and "?token=$RLHFKIT_LABEL_TOKEN" in out
    client = TestClient(served[0], base_url="http://127.0.0.1:8000")
    assert client.get("/api/health").status_code == 401
    assert client.get("/api/health", headers={"X-Label-Token": "env-token-123"}).status_code == 200
    monkeypatch.delenv("RLHFKIT_LABEL_TOKEN")
    assert rlhfkit_main(["label", "serve", "--pairs", str(pairs), "--port", str(lab.free_port()),
                         "--token", "option-token-1"]) == 0
    assert "note: --token is visible to every user of this machine (ps)" in capsys.readouterr().out


@pytest.mark.parametrize(("value", "message"), [
    ("", "RLHFKIT_LABEL_TOKEN is empty: give it 8-128 characters of letters, digits and _.~-, or unset "
         "RLHFKIT_LABEL_TOKEN"),
    ("short", "RLHFKIT_LABEL_TOKEN must be 8-128 characters of letters, digits and _.~-")])
def test_a_bad_token_in_the_environment_is_blamed_on_the_environment(tmp_path: Path, lab, no_server, monkeypatch,
                                                                     capsys, value: str, message: str) -> None:
    """An empty RLHFKIT_LABEL_TOKEN was reported as a bad --token, an option never given."""
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(1))
    monkeypatch.setenv("RLHFKIT_LABEL_TOKEN", value)
    assert rlhfkit_main(["label", "serve", "--pairs", str(pairs)]) == 2
    assert _error_line(capsys) == f"rlhfkit: error: {message}"
    assert not cli.default_db(pairs).exists()


@NO_OVERRIDE
def test_stats_and_export_read_a_database_in_a_read_only_folder(tmp_path: Path, lab) -> None:
    """SQLite must create DB-shm to read a WAL database; in a read-only folder that failed with a
    misleading "attempt to write a readonly database". With no -wal file every vote is in the
    database file: it is read as immutable. With one, the message says what to do."""
    pairs, db = lab.voted_db(tmp_path)
    folder, wal_folder = tmp_path / "ro", tmp_path / "ro-wal"
    folder.mkdir()
    shutil.copy(db, folder / db.name)
    wal_folder.mkdir()
    store = LabelStore(db)  # open: the -wal file holds a vote not yet in the database file
    store.register("bob")
    store.submit_vote("bob", store.next_pair("bob").pair_id, 5, "req-0002")
    for name in (db.name, f"{db.name}-wal"):
        shutil.copy(tmp_path / name, wal_folder / name)
    store.close()
    out = tmp_path / "prefs.jsonl"
    try:
        for f in (folder, wal_folder):
            f.chmod(0o555)
        done = _as_a_user_who_may_not_write(["stats", "--db", str(folder / db.name), "--json"])
        assert done.returncode == 0 and json.loads(done.stdout)["counts"]["votes"] == 1, done.stderr
        done = _as_a_user_who_may_not_write(["export", "--db", str(folder / db.name), "--out", str(out)])
        assert done.returncode == 0 and len(lab.read_jsonl(out)) == 1, done.stderr
        done = _as_a_user_who_may_not_write(["stats", "--db", str(wal_folder / db.name)])
        assert done.returncode == 2 and done.stderr == (
            f"rlhfkit: error: {wal_folder / db.name}: cannot read it here: SQLite must create {db.name}-shm next "
            f"to it to read the votes still in {db.name}-wal, and this user cannot write that folder; copy the "
            "database with its -wal file to a folder you can write\n")
        assert sorted(os.listdir(folder)) == [db.name]  # nothing written
    finally:
        for f in (folder, wal_folder):
            f.chmod(0o755)
