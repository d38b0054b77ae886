"""`rlhfkit label ...` commands: pairs (with a fake sampler), serve, export, stats, restart."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from rlhfkit.cli import main as rlhfkit_main
from rlhfkit.errors import UserError
from rlhfkit.label import cli
from rlhfkit.label.pairs import read_pairs
from rlhfkit.label.store import LabelStore


def test_every_option_has_help() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, subparser in sub.choices.items():
        for action in subparser._actions:
            assert action.help, f"label {name} {action.option_strings} has no --help text"


def test_pairs_one_model(tmp_path: Path, fake_models: list, capsys) -> None:
    out = tmp_path / "pairs.jsonl"
    assert rlhfkit_main(["label", "pairs", "--prompts", "builtin:reviews", "--limit", "3", "--out", str(out),
                         "--max-new-tokens", "16", "--seed", "7"]) == 0
    pairs = read_pairs(out)
    assert len(pairs) == 3 and {p.model_a for p in pairs} == {"smollm2-135m-instruct"}
    assert fake_models == [("load", "builtin:reviews", "train", 3, 7),
                           ("sample", "smollm2-135m-instruct", 2, 16, 1.0, 7)]
    assert "wrote 3 pair(s)" in capsys.readouterr().out


def test_pairs_two_models_and_overwrite_guard(tmp_path: Path, fake_models: list, capsys) -> None:
    out = tmp_path / "pairs.jsonl"
    args = ["label", "pairs", "--prompts", "p.jsonl", "--model-a", "m1", "--model-b", "m2", "--out", str(out)]
    assert rlhfkit_main(args) == 0
    pair = read_pairs(out)[0]
    assert (pair.model_a, pair.model_b) == ("m1", "m2") and pair.response_b.startswith("m2 says 0")
    assert rlhfkit_main(args) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert rlhfkit_main(args + ["--force"]) == 0


def test_serve_rejects_bad_pairs_file_with_file_and_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"pair_id": "a", "prompt": "p", "response_a": "x", "response_b": "y"}\n{"pair_id": "a"}\n')
    assert rlhfkit_main(["label", "serve", "--pairs", str(bad)]) == 2
    assert f"{bad}:2: missing field(s) prompt" in capsys.readouterr().err


def test_serve_beyond_localhost_requires_invitations(tmp_path: Path, lab, monkeypatch, capsys) -> None:
    """Binding 0.0.0.0 serves in invite mode: no name-only access, only personal links
    (it used to hand everyone one shared token, under which any name could undo any vote)."""
    from fastapi.testclient import TestClient

    from rlhfkit.label import serve

    served = {}
    monkeypatch.setattr(serve, "listen", lambda host, port: socket.socket())  # never bind beyond loopback here
    monkeypatch.setattr(serve, "run_server", lambda app, sock, log_level: served.update(app=app))
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(2))
    assert cli.main(["serve", "--pairs", str(pairs), "--host", "0.0.0.0", "--port", "8123"]) == 0
    printed = capsys.readouterr().out
    assert "labellers sign in with their own link: rlhfkit label invite NAME" in printed
    client = TestClient(served["app"])
    assert client.get("/api/session").json() == {"auth": "invite", "labeller": None}
    r = client.post("/api/labellers", json={"labeller": "alice"})
    assert r.status_code == 401
    assert (tmp_path / "pairs.labels.sqlite").is_file()
    assert cli.main(["invite", "alice", "--pairs", str(pairs)]) == 0
    token = capsys.readouterr().out.strip().rsplit("invite=", 1)[1]
    r = client.post("/api/labellers", json={}, headers={"X-Labeller-Token": token})
    assert r.status_code == 200 and r.json()["labeller"] == "alice"
    # Name-only access beyond loopback is refused outright.
    with pytest.raises(UserError, match="--auth open is for loopback only"):
        cli.main(["serve", "--pairs", str(pairs), "--host", "0.0.0.0", "--auth", "open"])


def test_serve_validates_options(tmp_path: Path, lab, capsys) -> None:
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(2))
    assert rlhfkit_main(["label", "serve", "--pairs", str(pairs), "--token", "short"]) == 2
    assert "--token must be" in capsys.readouterr().err
    assert rlhfkit_main(["label", "serve", "--pairs", str(pairs), "--votes-per-pair", "0"]) == 2
    assert rlhfkit_main(["label", "serve", "--pairs", str(pairs), "--port", "70000"]) == 2


def _labelled_db(tmp_path: Path, lab) -> Path:
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(3))
    store = LabelStore(cli.default_db(pairs), votes_per_pair=2)
    store.import_pairs(read_pairs(pairs))
    store.set_meta("votes_per_pair", "2")
    for name, choices in (("alice", (1, 2, 3)), ("bob", (1, 4, 3))):
        store.register(name)
        for i, choice in enumerate(choices):
            shown = store.next_pair(name)
            store.submit_vote(name, shown.pair_id, choice, f"{name}-{i:04d}")
    store.close()
    return pairs


def test_export_and_stats_commands(tmp_path: Path, lab, capsys) -> None:
    pairs = _labelled_db(tmp_path, lab)
    out = tmp_path / "prefs.jsonl"
    assert rlhfkit_main(["label", "export", "--pairs", str(pairs), "--out", str(out)]) == 0
    rows = lab.read_jsonl(out)
    assert all(r["votes"] == 2 and r["labellers"] == ["alice", "bob"] for r in rows)
    assert rlhfkit_main(["label", "stats", "--pairs", str(pairs), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out.split("\n", 1)[1])  # first line is export's summary
    assert stats["counts"]["votes"] == 6 and stats["pairs_complete"] == 3
    assert [r["votes"] for r in stats["labellers"]] == [3, 3]
    assert "cohen_kappa_5pt" in stats["agreement"]
    assert rlhfkit_main(["label", "stats", "--db", str(cli.default_db(pairs))]) == 0
    text = capsys.readouterr().out
    assert "Fleiss' kappa" in text and "Cohen's kappa (alice vs bob)" in text


def test_export_and_stats_need_a_database(tmp_path: Path, capsys) -> None:
    assert rlhfkit_main(["label", "stats", "--db", str(tmp_path / "none.sqlite")]) == 2
    assert "no labelling database" in capsys.readouterr().err
    assert not (tmp_path / "none.sqlite").exists()


def _wait_healthy(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    with httpx.Client(timeout=1) as client:
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else "server exited"
            try:
                if client.get(url + "api/health").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
    raise AssertionError("server did not come up")


def test_real_server_killed_and_restarted_loses_nothing(tmp_path: Path, lab) -> None:
    """`rlhfkit label serve` as a process: vote, SIGKILL it, start again, every vote is there."""
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(4))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "rlhfkit.cli", "label", "serve", "--pairs", str(pairs), "--port", str(port)]
    url = f"http://127.0.0.1:{port}/"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    chosen = {}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        _wait_healthy(url, proc)
        with httpx.Client(base_url=url, timeout=10) as c:
            c.post("api/labellers", json={"labeller": "alice"}).raise_for_status()
            for i in range(3):
                pid = c.post("api/next", json={"labeller": "alice"}).json()["pair"]["pair_id"]
                r = c.post("api/votes", json={"labeller": "alice", "pair_id": pid, "choice": i + 1,
                                              "request_id": f"req-{i:04d}"})
                assert r.status_code == 201
                chosen[pid] = i + 1
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        _wait_healthy(url, proc)
        with httpx.Client(base_url=url, timeout=10) as c:
            r = c.post("api/next", json={"labeller": "alice"}).json()
            assert r["progress"] == {"done": 3, "total": 4, "voted": 3, "skipped": 0}
            assert r["pair"]["pair_id"] not in chosen
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
    votes = LabelStore(tmp_path / "pairs.labels.sqlite").votes()
    assert {v.pair_id: v.choice for v in votes} == chosen
