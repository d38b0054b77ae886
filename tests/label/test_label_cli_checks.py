"""`rlhfkit label` refuses bad numbers, paths and files with one line and exit 2, writing nothing."""

from __future__ import annotations

import errno
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rlhfkit.cli import main as rlhfkit_main
from rlhfkit.label import cli
from rlhfkit.label.store import LabelStore


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "usage:" not in err, err
    return err.strip()


# --------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--lease-minutes", "nan", "--lease-minutes must be a number from 1 to 10080, got nan"),
        ("--lease-minutes", "inf", "--lease-minutes must be a number from 1 to 10080, got inf"),
        ("--lease-minutes", "1e15", "--lease-minutes must be a number from 1 to 10080, got 1000000000000000.0"),
        ("--lease-minutes", "-1", "--lease-minutes must be a number from 1 to 10080, got -1.0"),
        ("--lease-minutes", "0", "--lease-minutes must be a number from 1 to 10080, got 0.0"),
        ("--votes-per-pair", "0", "--votes-per-pair must be a number from 1 to 1000, got 0"),
        ("--votes-per-pair", "9223372036854775808", "--votes-per-pair must be a number from 1 to 1000, got 9223372036854775808"),
        ("--port", "70000", "--port must be a number from 1 to 65535, got 70000"),
    ],
)
def test_serve_refuses_unusable_numbers(tmp_path: Path, lab, no_server, capsys, option, value, message) -> None:
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(2))
    assert rlhfkit_main(["label", "serve", "--pairs", str(pairs), option, value]) == 2
    assert _error_line(capsys) == f"rlhfkit: error: {message}"
    assert not cli.default_db(pairs).exists()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--temperature", "0", "--temperature must be a number above 0 and at most 100, got 0.0"),
        ("--temperature", "-1", "--temperature must be a number above 0 and at most 100, got -1.0"),
        ("--temperature", "nan", "--temperature must be a number above 0 and at most 100, got nan"),
        ("--temperature", "inf", "--temperature must be a number above 0 and at most 100, got inf"),
        ("--max-new-tokens", "0", "--max-new-tokens must be a number from 1 to 32768, got 0"),
        ("--limit", "-1", "--limit must be a number from 0 to 1e+09, got -1"),
        ("--seed", "-5", "--seed must be a number from 0 to 4.29497e+09, got -5"),
    ],
)
def test_pairs_refuses_unusable_numbers(tmp_path: Path, fake_models, capsys, option, value, message) -> None:
    out = tmp_path / "pairs.jsonl"
    assert rlhfkit_main(["label", "pairs", "--prompts", "builtin:reviews", "--out", str(out), option, value]) == 2
    assert _error_line(capsys) == f"rlhfkit: error: {message}"
    assert not out.exists() and fake_models == []  # nothing sampled, nothing written


def test_pairs_writes_no_empty_file(tmp_path: Path, monkeypatch, fake_models, capsys) -> None:
    """Greedy-like sampling gives two identical responses per prompt: every pair is dropped."""
    monkeypatch.setattr(sys.modules["rlhfkit.rollout.texts"], "sample_texts",
                        lambda model, prompts, n, **kw: [["same"] * n for _ in prompts])
    out = tmp_path / "pairs.jsonl"
    assert rlhfkit_main(["label", "pairs", "--prompts", "builtin:reviews", "--limit", "3", "--out", str(out)]) == 2
    err = capsys.readouterr().err.splitlines()  # a progress line, then the error
    assert err[-1] == (f"rlhfkit: error: no pairs: the two responses were identical for all 3 prompt(s); "
                       f"{out} not written (use a higher --temperature or two models)")
    assert not out.exists()


@pytest.mark.parametrize(("option", "value"), [("--min-votes", "0"), ("--margin-scale", "nan"),
                                               ("--margin-scale", "0"), ("--margin-scale", "inf")])
def test_export_refuses_unusable_numbers(tmp_path: Path, lab, capsys, option, value) -> None:
    db = tmp_path / "db.sqlite"
    LabelStore(db).close()
    assert rlhfkit_main(["label", "export", "--db", str(db), "--out", str(tmp_path / "o.jsonl"), option, value]) == 2
    assert _error_line(capsys).startswith(f"rlhfkit: error: {option} must be a number")


# --------------------------------------------------------------------------- export --out


@pytest.mark.parametrize("target", ["db", "pairs", "db-wal", "link-to-db"])
def test_export_never_overwrites_its_inputs(tmp_path: Path, lab, capsys, target: str) -> None:
    pairs, db = lab.voted_db(tmp_path)
    (tmp_path / "link").symlink_to(db)
    out = {"db": db, "pairs": pairs, "db-wal": Path(f"{db}-wal"), "link-to-db": tmp_path / "link"}[target]
    Path(f"{db}-wal").touch()
    before = {p: p.read_bytes() for p in (db, pairs)}
    for extra in ([], ["--force"]):
        assert rlhfkit_main(["label", "export", "--pairs", str(pairs), "--out", str(out), *extra]) == 2
        line = _error_line(capsys)
        assert line.startswith(f"rlhfkit: error: --out {out} is the ") and "choose another file" in line
    assert {p: p.read_bytes() for p in (db, pairs)} == before
    assert [v.choice for v in LabelStore(db).votes()] == [1]  # every vote still there


@pytest.mark.parametrize("suffix", ["-wal", "-shm", "-journal"])
def test_export_through_a_symlinked_database_refuses_the_side_files_sqlite_really_uses(
        tmp_path: Path, lab, capsys, suffix: str) -> None:
    """`--db link.sqlite` (-> real.sqlite): SQLite keeps real.sqlite-wal, not link.sqlite-wal. The
    guard used to build the names from the path as given, so `--out real.sqlite-wal --force` was
    accepted and replaced the live write-ahead log (all acknowledged votes gone after a kill -9)."""
    _, db = lab.voted_db(tmp_path)
    link = tmp_path / "link.sqlite"
    link.symlink_to(db)
    out = Path(f"{db}{suffix}")  # need not exist yet: the server creates it while it runs
    assert rlhfkit_main(["label", "export", "--db", str(link), "--out", str(out), "--force"]) == 2
    assert _error_line(capsys) == (f"rlhfkit: error: --out {out} is the labelling database ({out}); "
                                   "writing it would destroy it, choose another file")
    assert not out.exists() and [v.choice for v in LabelStore(link).votes()] == [1]


@pytest.mark.parametrize("suffix", ["", "-wal", "-journal"])
def test_pairs_never_overwrites_an_sqlite_database_or_its_side_files(tmp_path: Path, fake_models, capsys,
                                                                    suffix: str) -> None:
    """`label pairs --out pairs.labels.sqlite --force` used to replace the labelling database."""
    db = tmp_path / "pairs.labels.sqlite"
    LabelStore(db).close()
    before = db.read_bytes()
    out = Path(f"{db}{suffix}")
    assert rlhfkit_main(["label", "pairs", "--prompts", "builtin:reviews", "--out", str(out), "--force"]) == 2
    role = "an SQLite database" if not suffix else f"a file of the SQLite database {db}"
    assert _error_line(capsys) == (f"rlhfkit: error: --out {out} is {role}; writing it would destroy it, "
                                   "even with --force: choose another file")
    assert db.read_bytes() == before and not Path(f"{db}-wal").exists() and fake_models == []


@pytest.mark.parametrize(("out", "message"), [("", "--out: empty path; give a file name"),
                                              ("DIR", "--out DIR: is a directory; give a file name"),
                                              ("FILE/x.jsonl", "--out FILE/x.jsonl: FILE is not a directory")])
def test_export_bad_paths_are_one_line_and_leave_no_temporary(tmp_path: Path, lab, capsys, out, message) -> None:
    pairs, _ = lab.voted_db(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    names = {"DIR": str(tmp_path / "dir"), "FILE": str(tmp_path / "file")}
    for key, value in names.items():
        out, message = out.replace(key, value), message.replace(key, value)
    before = sorted(os.listdir(tmp_path))
    assert rlhfkit_main(["label", "export", "--pairs", str(pairs), "--out", out]) == 2
    assert _error_line(capsys) == f"rlhfkit: error: {message}"
    assert sorted(os.listdir(tmp_path)) == before and os.listdir(tmp_path / "dir") == []


def test_export_needs_force_and_never_follows_a_planted_temporary_symlink(tmp_path: Path, lab, capsys) -> None:
    pairs, _ = lab.voted_db(tmp_path)
    out, victim = tmp_path / "prefs.jsonl", tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "prefs.jsonl.tmp").symlink_to(victim)  # the old fixed temporary name
    assert rlhfkit_main(["label", "export", "--pairs", str(pairs), "--out", str(out)]) == 0
    assert victim.read_text() == "precious\n" and len(lab.read_jsonl(out)) == 1
    assert oct(out.stat().st_mode & 0o777) == oct(0o600)  # private: prompts, answers, names
    assert rlhfkit_main(["label", "export", "--pairs", str(pairs), "--out", str(out)]) == 2
    assert _error_line(capsys) == f"rlhfkit: error: {out} exists; pass --force to overwrite it"
    out.unlink()
    out.symlink_to(victim)  # --force replaces a symlink at --out itself, never its target
    assert rlhfkit_main(["label", "export", "--pairs", str(pairs), "--out", str(out), "--force"]) == 0
    assert victim.read_text() == "precious\n" and not out.is_symlink() and len(lab.read_jsonl(out)) == 1
    leftovers = [n for n in os.listdir(tmp_path) if n.endswith(".tmp") and n != "prefs.jsonl.tmp"]
    assert leftovers == []


def test_pairs_out_cannot_be_the_prompts_file(tmp_path: Path, fake_models, capsys) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Review 1:\n")
    assert rlhfkit_main(["label", "pairs", "--prompts", str(prompts), "--out", str(prompts), "--force"]) == 2
    assert "is the prompts file" in _error_line(capsys) and prompts.read_text() == "Review 1:\n"


# --------------------------------------------------------------------------- serve: files and address


@pytest.mark.parametrize(
    ("raw", "message"),
    [(b'{"pair_id": "a", "prompt": "p", "response_a": "x\xff", "response_b": "y"}\n', "not UTF-8 (byte 0xff"),
     (b'{"pair_id": "a", "prompt": "p", "response_a": "\\ud800", "response_b": "y"}\n', "lone surrogate"),
     # used to end in a traceback (RecursionError, ValueError), exit code 1
     (b"[" * 100_000 + b"\n", "invalid JSON (nested too deeply)"),
     (b'{"pair_id": "a", "n": ' + b"7" * 5000 + b"}\n",
      "invalid JSON (Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits)")],
)
def test_serve_with_bad_bytes_in_the_pairs_file_writes_nothing(tmp_path: Path, lab, no_server, capsys, raw, message):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_bytes(lab.make_pairs(1)[0].to_json().encode() + b"\n" + raw)
    assert rlhfkit_main(["label", "serve", "--pairs", str(pairs)]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"rlhfkit: error: {pairs}:2: ") and message in line
    assert not cli.default_db(pairs).exists()


def test_serve_checks_its_address_before_touching_the_database(tmp_path: Path, lab, no_server, capsys) -> None:
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(2))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert rlhfkit_main(["label", "serve", "--pairs", str(pairs), "--port", str(port)]) == 2
    assert not cli.default_db(pairs).exists()  # it used to import the pairs first
    assert _error_line(capsys) == f"rlhfkit: error: --port {port}: already in use on 127.0.0.1; choose another --port"


def test_bind_errors_blame_what_is_wrong() -> None:
    from rlhfkit.label.serve import bind_error

    wrong_host = bind_error("10.9.8.7", 8000, OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"))
    assert wrong_host.startswith("--host 10.9.8.7: not an address of this machine") and "--port" not in wrong_host
    assert bind_error("nohost", 8000, socket.gaierror(-2, "Name or service not known")).startswith("--host nohost:")
    assert bind_error("127.0.0.1", 80, OSError(errno.EACCES, "Permission denied")).startswith("--port 80: not allowed")


# --------------------------------------------------------------------------- output and command line


def test_stats_into_a_closed_pipe_ends_quietly(tmp_path: Path, lab) -> None:
    """`rlhfkit label stats | head`: the reader leaves early; no BrokenPipe traceback."""
    pairs, db = lab.voted_db(tmp_path)
    con = sqlite3.connect(db)  # 3000 labellers: a report (~200 KB) that outgrows any pipe buffer
    con.executemany("INSERT INTO labellers (name, created_at) VALUES (?, '2026-01-01')",
                    [(f"labeller {i:04d}",) for i in range(3000)])
    con.commit()
    con.close()
    cmd = [sys.executable, "-m", "rlhfkit.cli", "label", "stats", "--db", str(db)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # like `head -1`
    err = proc.stderr.read().decode()
    assert first.startswith(b"pairs: 2 served") and err == ""
    assert proc.wait(timeout=60) == 141  # 128 + SIGPIPE, as a shell reports a reader that left early


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["serve"], "the following arguments are required: --pairs (see `rlhfkit label serve --help`)"),
     (["stats", "--db", "a", "--pairs", "b"], "argument --pairs: not allowed with argument --db"),
     (["nope"], "argument COMMAND: invalid choice: 'nope'"),
     (["serve", "--pairs", "p", "--port", "abc"], "argument --port: invalid int value: 'abc'")],
)
def test_argument_errors_are_one_line(capsys, argv: list[str], message: str) -> None:
    assert rlhfkit_main(["label", *argv]) == 2
    line = _error_line(capsys)
    assert line.startswith("rlhfkit: error: command line: ") and message in line
    assert line.count("rlhfkit") == 2  # the prefix once, then the --help hint (no "rlhfkit label:" repeated)
