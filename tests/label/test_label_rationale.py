"""Reasons and per-criterion ratings with a vote: stored (schema 4, older databases migrated or
read as they are), exported next to TRL's columns, shown in `stats`; bounded and checked.
Every request goes over a real socket on loopback."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
import pytest

from rlhfkit.label import cli
from rlhfkit.label.app import create_app
from rlhfkit.label.db import BASE_SCHEMA
from rlhfkit.label.pairs import Pair
from rlhfkit.label.queries import ReadOnlyStore
from rlhfkit.label.rationale import MAX_REASON_CHARS, parse_criteria
from rlhfkit.label.security import LOOPBACK_HOSTS
from rlhfkit.label.store import LabelStore

CRITERIA = ("helpfulness", "harmlessness", "honesty")
JSON = {"Content-Type": "application/json"}


def _vote(c: httpx.Client, name: str, choice: int, rid: str, **extra) -> httpx.Response:
    assert c.post("/api/labellers", json={"labeller": name}).status_code == 200
    pair = c.post("/api/next", json={"labeller": name}).json()["pair"]
    return c.post("/api/votes", json={"labeller": name, "pair_id": pair["pair_id"], "choice": choice,
                                      "request_id": rid, **extra})


def _served(tmp_path: Path, lab, n_pairs: int = 1, votes_per_pair: int = 2) -> LabelStore:
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=votes_per_pair)
    store.import_pairs(lab.make_pairs(n_pairs))
    return store


def test_reasons_and_ratings_are_stored_exported_and_shown_in_stats(tmp_path: Path, lab, capsys) -> None:
    store = _served(tmp_path, lab)
    app = create_app(store, allowed_hosts=LOOPBACK_HOSTS, criteria=CRITERIA)
    reason_a = 'Left is right; the other says </script><script>alert(1)</script>\nand "quotes"'
    with lab.LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        assert c.get("/api/config").json() == {"criteria": list(CRITERIA), "guidelines": None}
        # alice: left significantly better; rates helpfulness left-much, honesty right-slightly.
        r = _vote(c, "alice", 1, "req-alice-1", reason="  " + reason_a + "  ",
                  ratings={"helpfulness": 1, "honesty": 4})
        assert r.status_code == 201, r.text
        # bob: left slightly better, a reason, no ratings.
        assert _vote(c, "bob", 2, "req-bob-01", reason="clearer").status_code == 201
    votes = {v.labeller: v for v in store.votes()}
    a, b = votes["alice"], votes["bob"]
    assert a.reason == reason_a  # stripped, otherwise exactly as typed
    # Canonical frame: +2 = response_a much better. The left side was drawn at random per labeller.
    sign_a = 1 if a.left_side == "a" else -1
    assert dict(a.ratings) == {"helpfulness": 2 * sign_a, "honesty": -1 * sign_a}
    assert b.reason == "clearer" and b.ratings == ()
    store.close()

    out = tmp_path / "prefs.jsonl"
    assert cli.main(["export", "--db", str(store.path), "--out", str(out)]) == 0
    (row,) = lab.read_jsonl(out)
    mean = (a.score + b.score) / 2  # e.g. (+2 + +1) / 2 = 1.5 when both saw A on the left
    assert row["margin"] == abs(mean) / 2
    chosen_is_a = mean > 0
    assert row["chosen"] == ("alpha answer 0" if chosen_is_a else "beta answer 0")
    assert row["reasons"] == [{"labeller": "alice", "reason": reason_a}, {"labeller": "bob", "reason": "clearer"}]
    orient = 1 if chosen_is_a else -1
    assert row["criteria"] == {"helpfulness": {"mean": 2 * sign_a * orient, "n": 1},
                               "honesty": {"mean": -1 * sign_a * orient, "n": 1}}
    # TRL's columns are untouched.
    assert {"prompt", "chosen", "rejected"} <= set(row)

    capsys.readouterr()
    assert cli.main(["stats", "--db", str(store.path), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["counts"]["reasons"] == 2 and stats["counts"]["rated_votes"] == 1
    helpful = stats["criteria"]["helpfulness"]
    assert helpful["ratings"] == 1 and helpful["mean_score"] == 2 * sign_a
    assert helpful["agrees_with_vote"] == 1.0  # rated the same way as the vote
    assert stats["criteria"]["honesty"]["agrees_with_vote"] == 0.0  # rated against it
    assert cli.main(["stats", "--db", str(store.path)]) == 0
    text = capsys.readouterr().out
    assert "reasons given: 2 of 2 vote(s)" in text and "helpfulness" in text and "honesty" in text


@pytest.mark.parametrize("extra, field", [
    ({"reason": "x" * (MAX_REASON_CHARS + 1)}, "reason"),
    ({"reason": "bell \x07"}, "reason"),
    ({"ratings": {"kindness": 3}}, "ratings"),  # not a criterion of this server
    ({"ratings": {"helpfulness": 6}}, "ratings"),
    ({"ratings": {"helpfulness": "1"}}, "ratings"),
    ({"ratings": {f"c{i}": 1 for i in range(9)}}, "ratings"),
])
def test_bad_reasons_and_ratings_are_refused_and_nothing_is_stored(tmp_path: Path, lab, extra, field) -> None:
    store = _served(tmp_path, lab)
    with lab.LiveServer(create_app(store, allowed_hosts=LOOPBACK_HOSTS, criteria=CRITERIA)) as srv, \
            httpx.Client(base_url=srv.url, timeout=10) as c:
        r = _vote(c, "alice", 1, "req-alice-1", **extra)
    assert r.status_code == 422, r.text
    assert r.json()["error"].startswith(field)
    assert store.votes() == []
    store.close()


def test_a_server_without_criteria_refuses_ratings(tmp_path: Path, lab) -> None:
    store = _served(tmp_path, lab)
    with lab.LiveServer(create_app(store, allowed_hosts=LOOPBACK_HOSTS)) as srv, \
            httpx.Client(base_url=srv.url, timeout=10) as c:
        r = _vote(c, "alice", 1, "req-alice-1", ratings={"helpfulness": 1})
        assert r.status_code == 422 and "no criteria" in r.json()["error"]
        assert _vote(c, "alice", 1, "req-alice-2").status_code == 201  # a plain vote still works
    store.close()


def test_export_without_any_reason_keeps_the_old_columns(tmp_path: Path, lab) -> None:
    pairs, db = lab.voted_db(tmp_path)
    out = tmp_path / "prefs.jsonl"
    assert cli.main(["export", "--db", str(db), "--out", str(out)]) == 0
    (row,) = lab.read_jsonl(out)
    assert "reasons" not in row and "criteria" not in row


def _v1_database(path: Path) -> None:
    con = sqlite3.connect(path, isolation_level=None)
    con.executescript(BASE_SCHEMA)
    t = "2026-01-01T00:00:00.000000Z"
    con.execute("INSERT INTO meta VALUES ('schema_version', '1'), ('votes_per_pair', '1')")
    con.execute("INSERT INTO pairs VALUES ('p1', 0, 'prompt', 'A', 'B', '', '', 1, ?)", (t,))
    con.execute("INSERT INTO pairs VALUES ('p2', 1, 'prompt 2', 'C', 'D', '', '', 1, ?)", (t,))
    con.execute("INSERT INTO labellers VALUES (1, 'alice', ?)", (t,))
    con.execute("INSERT INTO assignments VALUES (1, 'p1', 'a', 'voted', ?, ?, 1)", (t, t))
    con.execute("INSERT INTO votes (labeller_id, pair_id, choice, score, left_side, request_id, shown_at, "
                "created_at) VALUES (1, 'p1', 2, 1, 'a', 'req-a-0001', ?, ?)", (t, t))
    con.close()


def test_an_older_database_is_read_as_it_is_and_migrated_when_served(tmp_path: Path, lab) -> None:
    db = tmp_path / "old.sqlite"
    _v1_database(db)
    ro = ReadOnlyStore(db)  # stats/export: no migration, no reasons, no final labels
    (old,) = ro.votes()
    assert (old.reason, old.ratings, ro.resolutions(), ro.counts()["reasons"]) == ("", (), {}, 0)
    ro.close()
    assert sqlite3.connect(db).execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == ("1",)

    store = LabelStore(db, votes_per_pair=1)  # serve migrates to version 4
    assert store.get_meta("schema_version") == "4"
    with lab.LiveServer(create_app(store, allowed_hosts=LOOPBACK_HOSTS, criteria=("honesty",))) as srv, \
            httpx.Client(base_url=srv.url, timeout=10) as c:
        assert _vote(c, "alice", 3, "req-a-0002", reason="both fine", ratings={"honesty": 3}).status_code == 201
    assert [(v.pair_id, v.reason, v.ratings) for v in store.votes()] == [
        ("p1", "", ()), ("p2", "both fine", (("honesty", 0),))]
    store.close()


@pytest.mark.parametrize("sql, message", [
    ("UPDATE votes SET ratings = '{\"honesty\": 9}'", "ratings"),
    ("UPDATE votes SET ratings = 'not json'", "ratings"),
    ("UPDATE votes SET ratings = '{\"\\u001b[2J\": 1}'", "ratings"),
])
def test_crafted_ratings_are_one_line(tmp_path: Path, lab, capsys, sql, message) -> None:
    _, db = lab.voted_db(tmp_path)
    sqlite3.connect(db, isolation_level=None).execute(sql)
    from rlhfkit.cli import main as rlhfkit_main

    assert rlhfkit_main(["label", "stats", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert message in err and "\x1b" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("raw, ok", [
    ("helpfulness,harmlessness,honesty", True),
    (" helpfulness , honesty ", True),
    ("", False), ("Helpfulness", False), ("a b", False), ("x,x", False), ("<b>", False),
    (",".join(f"c{i}" for i in range(9)), False), ("c" * 33, False),
])
def test_criterion_names_are_checked(raw: str, ok: bool) -> None:
    if ok:
        assert parse_criteria(raw) == tuple(n.strip() for n in raw.split(","))
    else:
        with pytest.raises(ValueError):
            parse_criteria(raw)


@pytest.mark.parametrize("option, message", [
    (["--criteria", "Bad Name"], "--criteria"),
    (["--guidelines", "missing.md"], "guidelines file not found"),
    (["--lead-token", "short"], "--lead-token"),
])
def test_serve_refuses_bad_new_options_in_one_line_writing_nothing(tmp_path: Path, lab, capsys, no_server,
                                                                    option, message) -> None:
    from rlhfkit.cli import main as rlhfkit_main

    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(1))
    args = [a.replace("missing.md", str(tmp_path / "missing.md")) for a in option]
    assert rlhfkit_main(["label", "serve", "--pairs", str(pairs), "--port", str(lab.free_port()), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl"]


def test_guidelines_file_limits(tmp_path: Path) -> None:
    from rlhfkit.errors import DataError
    from rlhfkit.label.rationale import MAX_GUIDELINES_BYTES, read_guidelines

    good = tmp_path / "g.md"
    good.write_text("# Rules\nPrefer *honest* answers.\n", encoding="utf-8")
    assert read_guidelines(good).startswith("# Rules")
    big = tmp_path / "big.md"
    big.write_bytes(b"x" * (MAX_GUIDELINES_BYTES + 1))
    with pytest.raises(DataError, match="at most"):
        read_guidelines(big)
    binary = tmp_path / "bin.md"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(DataError, match="not UTF-8"):
        read_guidelines(binary)


def test_pair_text_reaches_the_page_unchanged(tmp_path: Path, lab) -> None:
    """The server hands Markdown over as text; only the page renders it (see the browser test)."""
    md = "# Title\n\n```python\nprint('<b>hi</b>')\n```\n<script>window.__pwned = 1</script>"
    store = LabelStore(tmp_path / "db.sqlite")
    store.import_pairs([Pair("md", "Format this.", md, "plain")])
    with lab.LiveServer(create_app(store, allowed_hosts=LOOPBACK_HOSTS)) as srv, \
            httpx.Client(base_url=srv.url, timeout=10) as c:
        c.post("/api/labellers", json={"labeller": "alice"})
        pair = c.post("/api/next", json={"labeller": "alice"}).json()["pair"]
        assert md in (pair["left"], pair["right"])
        assert c.get("/static/render.js").headers["content-type"].startswith("text/javascript")
        page = c.get("/")
        assert "static/render.js" in page.text
        for name in ("render.js", "app.js", "lead.js"):  # no way to parse text as HTML, no eval
            script = c.get(f"/static/{name}").text
            for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
                assert sink not in script, (name, sink)
        assert page.headers["content-security-policy"].startswith("default-src 'none'; script-src 'self'")
    store.close()
