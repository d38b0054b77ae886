"""The lead's view behind its own token (disputed pairs, final labels kept apart from the votes,
`export --resolve`) and each labeller's own history; real sockets on loopback."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from rlhfkit.label import cli
from rlhfkit.label.app import create_app
from rlhfkit.label.records import VoteRecord
from rlhfkit.label.review import disagreements
from rlhfkit.label.security import LOOPBACK_HOSTS
from rlhfkit.label.store import LabelStore

LEAD = "lead-secret-0123"


def _vote(c: httpx.Client, name: str, want_a: int, rid: str, reason: str = "") -> str:
    """``name`` votes on their next pair with canonical score ``want_a`` (+2 = A much better);
    the choice is worked out from which side A was shown on. Returns the pair id."""
    assert c.post("/api/labellers", json={"labeller": name}).status_code == 200
    pair = c.post("/api/next", json={"labeller": name}).json()["pair"]
    left_is_a = pair["left"].startswith("alpha")
    choice = 3 - want_a if left_is_a else 3 + want_a
    r = c.post("/api/votes", json={"labeller": name, "pair_id": pair["pair_id"], "choice": choice,
                                   "request_id": rid, "reason": reason})
    assert r.status_code == 201, r.text
    return pair["pair_id"]


@pytest.fixture
def voted(tmp_path: Path, lab):
    """Two pairs, two votes each: p000 disputed (alice A much better, bob B slightly better),
    p001 agreed (both A slightly better)."""
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=2)
    store.import_pairs(lab.make_pairs(2))
    app = create_app(store, allowed_hosts=LOOPBACK_HOSTS, lead_token=LEAD)
    with lab.LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        assert _vote(c, "alice", 2, "req-alice-1", reason="A is <b>correct</b>") == "p000"
        assert _vote(c, "alice", 1, "req-alice-2") == "p001"
        assert _vote(c, "bob", -1, "req-bob-001", reason="B is shorter") == "p000"
        assert _vote(c, "bob", 1, "req-bob-002") == "p001"
        yield store, srv, c
    store.close()


def test_the_lead_sees_disputed_pairs_only_with_the_lead_token(voted) -> None:
    store, srv, c = voted
    assert c.get("/api/lead/disputed").status_code == 401
    assert c.get("/api/lead/disputed", headers={"X-Lead-Token": LEAD[:-1] + "x"}).status_code == 401
    # A labeller's own credentials are no lead token.
    assert c.get("/api/lead/disputed", headers={"X-Labeller-Token": LEAD}).status_code == 401
    r = c.get("/api/lead/disputed", headers={"X-Lead-Token": LEAD})
    assert r.status_code == 200
    (pair,) = r.json()["pairs"]  # p001 (both said A slightly better) is not disputed
    assert pair["pair_id"] == "p000"
    assert (pair["response_a"], pair["response_b"]) == ("alpha answer 0", "beta answer 0")
    assert [(v["labeller"], v["score"], v["reason"]) for v in pair["votes"]] == [
        ("alice", 2, "A is <b>correct</b>"), ("bob", -1, "B is shorter")]
    assert pair["resolution"] is None
    page = c.get("/lead")
    assert page.status_code == 200 and "static/lead.js" in page.text
    assert page.headers["content-security-policy"].startswith("default-src 'none'; script-src 'self'")


def test_a_final_label_is_kept_apart_from_the_votes_and_used_by_export_resolve(voted, tmp_path: Path, lab) -> None:
    store, srv, c = voted
    lead = {"X-Lead-Token": LEAD}
    assert c.post("/api/lead/resolve", json={"pair_id": "p000", "choice": 5}).status_code == 401
    r = c.post("/api/lead/resolve", json={"pair_id": "p000", "choice": 5, "note": "B is right; A invents"},
               headers=lead)
    assert r.status_code == 200 and r.json()["score"] == -2  # choice 5 in the A/B frame: B much better
    assert c.post("/api/lead/resolve", json={"pair_id": "p000", "choice": 6}, headers=lead).status_code == 422
    assert c.post("/api/lead/resolve", json={"pair_id": "nope", "choice": 1}, headers=lead).status_code == 404
    # The votes are untouched.
    assert [(v.labeller, v.pair_id, v.score) for v in store.votes()] == [
        ("alice", "p000", 2), ("bob", "p000", -1), ("alice", "p001", 1), ("bob", "p001", 1)]
    (listed,) = c.get("/api/lead/disputed", headers=lead).json()["pairs"]
    assert listed["resolution"]["score"] == -2 and listed["resolution"]["note"] == "B is right; A invents"

    plain, resolved = tmp_path / "plain.jsonl", tmp_path / "resolved.jsonl"
    assert cli.main(["export", "--db", str(store.path), "--out", str(plain)]) == 0
    assert cli.main(["export", "--db", str(store.path), "--out", str(resolved), "--resolve"]) == 0
    by_pair = {r["pair_id"]: r for r in lab.read_jsonl(plain)}
    # Votes only: mean (+2 - 1) / 2 = 0.5 -> A chosen, slightly, margin 0.5 / 2 = 0.25.
    assert (by_pair["p000"]["chosen"], by_pair["p000"]["strength"], by_pair["p000"]["margin"]) == (
        "alpha answer 0", 0.5, 0.25)
    rows = {r["pair_id"]: r for r in lab.read_jsonl(resolved)}
    # The lead's -2: B chosen, significantly, margin 2 / 2 = 1.0; the voters are still named.
    p0 = rows["p000"]
    assert (p0["chosen"], p0["rejected"], p0["strength"], p0["margin"]) == ("beta answer 0", "alpha answer 0", 1.0, 1.0)
    assert p0["resolved"] is True and p0["labellers"] == ["alice", "bob"] and p0["votes"] == 2
    assert [r["reason"] for r in p0["reasons"]] == ["A is <b>correct</b>", "B is shorter"]
    assert rows["p001"] == by_pair["p001"]  # an unresolved pair is exported from its votes as before


def test_no_lead_view_without_a_lead_token(tmp_path: Path, lab) -> None:
    store = LabelStore(tmp_path / "db.sqlite")
    store.import_pairs(lab.make_pairs(1))
    with lab.LiveServer(create_app(store, allowed_hosts=LOOPBACK_HOSTS)) as srv, \
            httpx.Client(base_url=srv.url, timeout=10) as c:
        assert c.get("/lead").status_code == 404
        assert c.get("/api/lead/disputed", headers={"X-Lead-Token": ""}).status_code == 404
        r = c.post("/api/lead/resolve", json={"pair_id": "p000", "choice": 1}, headers={"X-Lead-Token": ""})
        assert r.status_code == 404
    store.close()


def test_the_lead_link_needs_the_access_token_too(tmp_path: Path, lab) -> None:
    store = LabelStore(tmp_path / "db.sqlite")
    store.import_pairs(lab.make_pairs(1))
    app = create_app(store, token="access-token-1", allowed_hosts=LOOPBACK_HOSTS, lead_token=LEAD)
    with lab.LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        assert c.get("/lead").status_code == 401
        r = c.get(f"/lead?token=access-token-1&lead={LEAD}")  # the cookie is set, the token leaves the URL
        assert r.status_code == 303 and r.headers["location"] == f"/lead?lead={LEAD}"
        assert c.get("/api/lead/disputed", headers={"X-Lead-Token": LEAD}).status_code == 200
    store.close()


def test_each_labeller_sees_their_own_history_only(voted, tmp_path: Path, lab) -> None:
    store, srv, c = voted
    alice = c.post("/api/history", json={"labeller": "alice"}).json()["votes"]
    assert [v["pair_id"] for v in alice] == ["p001", "p000"]  # newest first
    assert alice[1]["reason"] == "A is <b>correct</b>"
    assert all(v["choice_label"] for v in alice)
    assert [v["pair_id"] for v in c.post("/api/history", json={"labeller": "bob"}).json()["votes"]] == [
        "p001", "p000"]
    assert c.post("/api/history", json={"labeller": "carol"}).status_code == 404


def test_history_in_invite_mode_is_the_signed_in_labellers(tmp_path: Path, lab) -> None:
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=2)
    store.import_pairs(lab.make_pairs(1))
    links = {name: store.invite(name)[1] for name in ("alice", "bob")}
    store.submit_vote("alice", store.next_pair("alice").pair_id, 1, "req-alice-1", reason="mine")
    app = create_app(store, allowed_hosts=LOOPBACK_HOSTS, auth="invite")
    with lab.LiveServer(app) as srv, httpx.Client(base_url=srv.url, timeout=10) as c:
        bob = {"X-Labeller-Token": links["bob"]}
        assert c.post("/api/history", json={"labeller": "alice"}, headers=bob).status_code == 403
        assert c.post("/api/history", json={}, headers=bob).json() == {"votes": []}
        mine = c.post("/api/history", json={}, headers={"X-Labeller-Token": links["alice"]}).json()["votes"]
        assert [(v["pair_id"], v["reason"]) for v in mine] == [("p000", "mine")]
        assert c.post("/api/history", json={}).status_code == 401
    store.close()


def _v(pair: str, who: str, score: int) -> VoteRecord:
    return VoteRecord(pair, who, score, 3 - score, "a", "t", "t", "p", "A", "B")


def test_disagreement_is_a_difference_in_direction() -> None:
    votes = [_v("same-way", "a", 2), _v("same-way", "b", 1),   # both A: agreed
             _v("tie-vs-a", "a", 0), _v("tie-vs-a", "b", 1),   # same vs A: disputed
             _v("a-vs-b", "a", 1), _v("a-vs-b", "b", -1),      # disputed
             _v("alone", "a", 2)]
    assert [p["pair_id"] for p in disagreements(votes, {})] == ["tie-vs-a", "a-vs-b"]


def test_serve_wires_criteria_guidelines_and_the_lead_token_from_the_environment(tmp_path: Path, lab) -> None:
    """`rlhfkit label serve` as a process: the banner names the lead's address without printing
    the secret from the environment; the page gets the criteria and guidelines; the lead's view
    answers to that secret only."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(1))
    guide = tmp_path / "guide.md"
    guide.write_text("# Be fair\n\nPrefer *honest* answers.\n", encoding="utf-8")
    port = lab.free_port()
    cmd = [sys.executable, "-m", "rlhfkit.cli", "label", "serve", "--pairs", str(pairs), "--port", str(port),
           "--criteria", "helpfulness,honesty", "--guidelines", str(guide)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RLHFKIT_LABEL_LEAD_TOKEN": LEAD}
    url = f"http://127.0.0.1:{port}/"
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline, up = time.monotonic() + 30, False
        with httpx.Client(base_url=url, timeout=2) as c:
            while not up and time.monotonic() < deadline:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else "server exited"
                try:
                    up = c.get("api/health").status_code == 200
                except httpx.TransportError:
                    time.sleep(0.05)
            assert up, "server did not come up"
            assert c.get("api/config").json() == {"criteria": ["helpfulness", "honesty"],
                                                  "guidelines": guide.read_text(encoding="utf-8")}
            assert c.get("api/lead/disputed").status_code == 401
            assert c.get("api/lead/disputed", headers={"X-Lead-Token": LEAD}).json()["pairs"] == []
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=10)
    assert f"{url}lead?lead=$RLHFKIT_LABEL_LEAD_TOKEN" in out and LEAD not in out
