"""`label export --out`: only a regular file or a new name, never a device, FIFO, socket or a
path in /dev or /proc (as root, `--out /dev/stdout --force` used to replace the system's
/dev/stdout symlink with a regular file); `--out -` writes to standard output.

Every case that could block on old code (opening a FIFO or a pipe for reading) runs in a child
process with a time limit; /dev paths are only ever checked for refusal, without --force.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlhfkit.cli import main as rlhfkit_main

ONE_LINE_LIMIT_S = 60  # a refusal takes well under a second; old code blocked forever


def _export(db: Path, out: str, *extra: str) -> subprocess.CompletedProcess:
    """`rlhfkit label export` in a child process; stdout is a pipe, stdin /dev/null."""
    cmd = [sys.executable, "-m", "rlhfkit.cli", "label", "export", "--db", str(db), "--out", out, *extra]
    try:
        return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=ONE_LINE_LIMIT_S, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"export --out {out} {' '.join(extra)} blocked for {ONE_LINE_LIMIT_S} s")


def _refused(proc: subprocess.CompletedProcess, out: str, why: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"rlhfkit: error: --out {out} {why}; give a regular file or a new name\n"
    assert proc.stdout == ""


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder with a short path (a Unix socket's name is limited to ~100 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="rk-out-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("force", [False, True])
def test_a_fifo_or_a_link_to_one_is_refused_without_blocking(short_dir: Path, lab, force: bool) -> None:
    _, db = lab.voted_db(short_dir)
    fifo, link = short_dir / "prefs.fifo", short_dir / "link"
    os.mkfifo(fifo)
    link.symlink_to(fifo)
    extra = ["--force"] if force else []
    for out in (fifo, link):
        _refused(_export(db, str(out), *extra), str(out), "is a FIFO")
    assert fifo.exists() and link.is_symlink() and os.readlink(link) == str(fifo)


def test_a_socket_and_a_link_to_a_character_device_are_refused_even_with_force(short_dir: Path, lab) -> None:
    _, db = lab.voted_db(short_dir)
    sock_path, dev_link = short_dir / "s.sock", short_dir / "null-link"
    dev_link.symlink_to("/dev/null")  # old code replaced the link (as root: /dev/null itself)
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock_path))
        _refused(_export(db, str(sock_path), "--force"), str(sock_path), "is a socket")
    _refused(_export(db, str(dev_link), "--force"), str(dev_link), "is in /dev")
    assert dev_link.is_symlink() and os.readlink(dev_link) == "/dev/null"


@pytest.mark.parametrize(("out", "why"), [("/dev/stdout", "is in /dev"), ("/dev/null", "is in /dev"),
                                          ("/proc/self/fd/1", "is in /proc")])
def test_paths_in_dev_and_proc_are_refused(tmp_path: Path, lab, out: str, why: str) -> None:
    _, db = lab.voted_db(tmp_path)
    _refused(_export(db, out), out, why)  # never with --force: a bug must not replace a real node


def test_dash_writes_the_rows_to_standard_output(tmp_path: Path, lab, capsys, monkeypatch) -> None:
    pairs, _ = lab.voted_db(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert rlhfkit_main(["label", "export", "--pairs", str(pairs), "--out", "-"]) == 0
    captured = capsys.readouterr()
    rows = [json.loads(line) for line in captured.out.splitlines()]
    assert [(r["pair_id"], r["labellers"], r["votes"]) for r in rows] == [("p000", ["alice"], 1)]
    assert captured.err == "wrote 1 preference row(s) from 1 vote(s) to standard output\n"
    assert not (tmp_path / "-").exists()


def test_dash_into_a_pipe_does_not_block(tmp_path: Path, lab) -> None:
    _, db = lab.voted_db(tmp_path)
    proc = _export(db, "-")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["pair_id"] for line in proc.stdout.splitlines()] == ["p000"]


def test_regular_files_and_new_names_still_work(tmp_path: Path, lab, capsys) -> None:
    pairs, _ = lab.voted_db(tmp_path)
    out = tmp_path / "new" / "prefs.jsonl"
    assert rlhfkit_main(["label", "export", "--pairs", str(pairs), "--out", str(out)]) == 0
    assert rlhfkit_main(["label", "export", "--pairs", str(pairs), "--out", str(out), "--force"]) == 0
    assert len(lab.read_jsonl(out)) == 1 and out.stat().st_mode & 0o777 == 0o600


def test_a_pairs_file_is_never_overwritten_even_when_not_named_as_one(tmp_path: Path, lab, capsys) -> None:
    """`export --db DB --out PAIRS.jsonl --force` replaced the pairs file being served (only a
    `--pairs` given on the same command line was recognised); now its records give it away."""
    pairs, db = lab.voted_db(tmp_path)
    before = pairs.read_bytes()
    assert rlhfkit_main(["label", "export", "--db", str(db), "--out", str(pairs), "--force"]) == 2
    assert capsys.readouterr().err == (f"rlhfkit: error: --out {pairs} is a pairs file (it holds response_a/"
                                       "response_b); writing it would destroy it, even with --force: "
                                       "choose another file\n")
    assert pairs.read_bytes() == before
    prefs = tmp_path / "prefs.jsonl"  # an earlier export may be replaced as before
    assert rlhfkit_main(["label", "export", "--db", str(db), "--out", str(prefs)]) == 0
    assert rlhfkit_main(["label", "export", "--db", str(db), "--out", str(prefs), "--force"]) == 0
