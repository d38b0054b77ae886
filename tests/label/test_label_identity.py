"""Identities: one normalised name per person, invitation links, votes bound to the signed-in labeller."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from datetime import datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from rlhfkit.cli import main as rlhfkit_main
from rlhfkit.label import cli
from rlhfkit.label.app import create_app
from rlhfkit.label.identity import clean_name, name_key, token_digest
from rlhfkit.label.store import LabelStore


def _post(client: TestClient, path: str, body: object, **kw):
    return client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json", **kw})


# --------------------------------------------------------------------------- one person, one key


@pytest.mark.parametrize("spelling", ["alice", "ALICE", "Alice", "  alice ", "ａｌｉｃｅ", "ＡＬＩＣＥ"])
def test_name_key_folds_case_width_and_spaces(spelling: str) -> None:
    assert name_key(spelling) == "alice"


def test_clean_name_keeps_a_readable_display_form() -> None:
    assert clean_name("  Mary   Ann ") == "Mary Ann"
    assert clean_name("ａｌｉｃｅ") == "alice"  # NFKC: fullwidth letters are the plain ones
    assert name_key("Straße") == name_key("STRASSE")  # full case folding, not lower()
    for bad in ("", "   ", "a" * 41, "<b>", "al\u200bice", "bob\x00", "eve\u202e"):  # zero-width, NUL, RTL override
        with pytest.raises(ValueError):
            clean_name(bad)


@pytest.mark.parametrize("name", ["alice\u3164", "\u3164", "\u115f", "al\u1160ice", "\uffa0bob", "\u3164 \u3164"])
def test_names_with_hangul_fillers_are_refused(store: LabelStore, name: str) -> None:
    """The Hangul fillers are letters to `str.isalnum` but render as nothing: "alice" + U+3164
    showed as a second "alice", U+3164 alone as a blank name."""
    with pytest.raises(ValueError, match="invisible character"):
        clean_name(name)
    r = _post(TestClient(create_app(store)), "/api/labellers", {"labeller": name})
    assert r.status_code == 422 and "invisible character" in r.json()["error"]
    assert store.counts()["labellers"] == 0


def test_default_ignorable_ranges_match_the_unicode_property() -> None:
    """Every listed code point is one a font draws as nothing: not printable, or a Hangul filler."""
    import unicodedata

    from rlhfkit.label.identity import DEFAULT_IGNORABLE
    assigned = [chr(c) for low, high in DEFAULT_IGNORABLE for c in range(low, high + 1)
                if unicodedata.category(chr(c)) != "Cn"]
    fillers = {"\u115f", "\u1160", "\u3164", "\uffa0"}
    assert {c for c in assigned if c.isalnum()} == fillers
    assert all(not c.isprintable() or c in fillers or unicodedata.category(c) == "Mn" for c in assigned)


def test_alice_ALICE_and_fullwidth_alice_are_one_labeller(store: LabelStore) -> None:
    client = TestClient(create_app(store))
    assert _post(client, "/api/labellers", {"labeller": "alice"}).json()["labeller"] == "alice"
    first = _post(client, "/api/next", {"labeller": "alice"}).json()["pair"]
    for other in ("ALICE", "ａｌｉｃｅ"):
        r = _post(client, "/api/labellers", {"labeller": other}).json()
        assert r["labeller"] == "alice"  # the display name stays the first spelling
        assert _post(client, "/api/next", {"labeller": other}).json()["pair"] == first  # same open pair
    vote = {"labeller": "ＡＬＩＣＥ", "pair_id": first["pair_id"], "choice": 1, "request_id": "req-0001"}
    assert _post(client, "/api/votes", vote).status_code == 201
    vote.update(labeller="alice", request_id="req-0002")
    assert _post(client, "/api/votes", vote).status_code == 409  # already voted: one person, one vote
    assert store.counts()["labellers"] == 1
    assert [v.labeller for v in store.votes()] == ["alice"]


# --------------------------------------------------------------------------- invitations


def test_invite_stores_only_a_hash_and_a_new_invite_replaces_the_old(store: LabelStore) -> None:
    name, token = store.invite("Alice")
    assert name == "Alice" and store.authenticate(token) == "Alice"
    stored = sqlite3.connect(store.path).execute("SELECT token_hash FROM labellers").fetchall()
    assert stored == [(hashlib.sha256(token.encode()).hexdigest(),)] and token_digest(token) == stored[0][0]
    _, token2 = store.invite("ALICE")  # same person, new link
    assert store.authenticate(token) is None and store.authenticate(token2) == "Alice"
    assert store.revoke("alice") == "Alice" and store.authenticate(token2) is None
    assert store.authenticate("short") is None and store.authenticate("x" * 32) is None


@pytest.fixture
def invite_app(store: LabelStore):
    """An invite-mode app with two invited labellers; returns (client factory, tokens)."""
    tokens = {name: store.invite(name)[1] for name in ("alice", "bob")}
    app = create_app(store, auth="invite")

    def client_for(name: str | None) -> TestClient:
        client = TestClient(app, base_url="http://127.0.0.1:8123")
        if name is not None:
            r = client.get(f"/?invite={tokens[name]}", follow_redirects=False)
            assert r.status_code == 200 and "set-cookie" not in r.headers  # the page asks first
            r = _post(client, "/api/signin", {"invite": tokens[name]})
            assert r.json() == {"auth": "invite", "labeller": name}
            cookie = r.headers["set-cookie"].lower()
            assert cookie.startswith("label_session_8123=") and "httponly" in cookie and "samesite=strict" in cookie
            assert tokens[name].lower() not in cookie  # a session id of its own, not the link's secret
        return client

    return client_for, tokens


def test_invite_mode_needs_a_valid_link(invite_app) -> None:
    client_for, _ = invite_app
    anonymous = client_for(None)
    assert anonymous.get("/").status_code == 200  # the page itself holds no data
    assert anonymous.get("/api/session").json() == {"auth": "invite", "labeller": None}
    for path, body in (("/api/labellers", {"labeller": "alice"}), ("/api/next", {}), ("/api/undo", {"labeller": "bob"})):
        r = _post(anonymous, path, body)
        assert r.status_code == 401 and "invitation link" in r.json()["error"]
    assert anonymous.get("/?invite=" + "x" * 32).status_code == 401
    assert client_for("alice").get("/api/session").json() == {"auth": "invite", "labeller": "alice"}


def test_a_second_labeller_cannot_change_the_first_ones_votes(store: LabelStore, invite_app) -> None:
    client_for, tokens = invite_app
    alice, bob = client_for("alice"), client_for("bob")
    pair = _post(alice, "/api/next", {}).json()["pair"]
    r = _post(alice, "/api/votes", {"pair_id": pair["pair_id"], "choice": 1, "request_id": "alice-001"})
    assert r.status_code == 201 and r.json()["labeller"] == "alice"

    # Bob names alice: refused. The name in the body is a claim, the cookie is the identity.
    for path, body in (("/api/undo", {"labeller": "alice"}), ("/api/labellers", {"labeller": "ALICE"}),
                       ("/api/votes", {"labeller": "alice", "pair_id": pair["pair_id"], "choice": 5,
                                       "request_id": "bob-0001"})):
        r = _post(bob, path, body)
        assert r.status_code == 403 and r.json()["error"] == "signed in as 'bob'; cannot act as " + repr(body["labeller"])
    # Bob's own undo and vote touch only bob.
    assert _post(bob, "/api/undo", {}).json()["undone"] is None
    r = _post(bob, "/api/votes", {"pair_id": pair["pair_id"], "choice": 5, "request_id": "bob-0002"})
    assert r.status_code == 409  # bob was never shown alice's pair
    # A script may send the token as a header instead of the cookie.
    r = _post(client_for(None), "/api/undo", {}, **{"X-Labeller-Token": tokens["bob"]})
    assert r.status_code == 200 and r.json()["labeller"] == "bob" and r.json()["undone"] is None
    assert [(v.labeller, v.pair_id, v.choice) for v in store.votes()] == [("alice", pair["pair_id"], 1)]


def test_open_mode_still_takes_the_name_from_the_body(store: LabelStore) -> None:
    client = TestClient(create_app(store))  # auth="open": the loopback single-user default
    assert client.get("/api/session").json() == {"auth": "open", "labeller": None}
    r = _post(client, "/api/next", {})
    assert r.status_code == 422 and r.json()["error"] == "labeller: Field required"
    assert client.get("/?invite=" + "x" * 32).status_code == 401  # no invitations in open mode


# --------------------------------------------------------------------------- `rlhfkit label invite`


def test_invite_command_prints_a_link_and_revoke_ends_it(tmp_path: Path, lab, capsys) -> None:
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(2))
    args = ["label", "invite", "ａｌｉｃｅ", "--pairs", str(pairs), "--url", "http://127.0.0.1:8123/"]
    assert rlhfkit_main(args) == 0
    out = capsys.readouterr().out
    link = out.strip().splitlines()[-1]
    assert out.startswith("invited alice;") and link.startswith("http://127.0.0.1:8123/?invite=")
    token = link.split("=", 1)[1]
    store = LabelStore(tmp_path / "pairs.labels.sqlite")
    assert store.authenticate(token) == "alice"
    assert token not in (tmp_path / "pairs.labels.sqlite").read_bytes().decode("latin-1")
    assert rlhfkit_main(["label", "invite", "ALICE", "--pairs", str(pairs), "--revoke"]) == 0
    assert "alice's invitation link no longer works" in capsys.readouterr().out
    assert store.authenticate(token) is None
    assert rlhfkit_main(["label", "invite", "<script>", "--pairs", str(pairs)]) == 2
    assert rlhfkit_main(["label", "invite", "zed", "--pairs", str(pairs), "--revoke"]) == 2
    assert rlhfkit_main(["label", "invite", "bob", "--pairs", str(pairs), "--url", "ftp://x"]) == 2
    assert rlhfkit_main(["label", "invite", "bob", "--pairs", str(tmp_path / "typo.jsonl")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["rlhfkit: error: NAME '<script>': labeller name may contain letters, digits, spaces and . _ - @ ' only",
                   "rlhfkit: error: unknown labeller 'zed'; register the name first",
                   "rlhfkit: error: --url must be an http:// or https:// address, got 'ftp://x'",
                   f"rlhfkit: error: {tmp_path / 'typo.jsonl'}: pairs file not found"]
    assert not (tmp_path / "typo.labels.sqlite").exists()
    store.close()


def test_an_invitation_link_works_behind_the_access_token(store: LabelStore) -> None:
    """`serve --token T --auth invite`: `invite --url 'http://h/?token=T'` gives a link that
    passes the token gate first (cookie, redirect keeping ?invite=), then signs in."""
    from rlhfkit.label.cli import invite_link

    _, secret = store.invite("alice")
    link = invite_link("http://127.0.0.1:8123/?token=gate-token-1", secret)
    assert link == f"http://127.0.0.1:8123/?token=gate-token-1&invite={secret}"
    assert invite_link("https://labels.example/team/", "T" * 16) == "https://labels.example/team/?invite=" + "T" * 16
    client = TestClient(create_app(store, token="gate-token-1", auth="invite"), base_url="http://127.0.0.1:8123")
    r = client.get(link.removeprefix("http://127.0.0.1:8123"), follow_redirects=False)
    assert (r.status_code, r.headers["location"]) == (303, f"/?invite={secret}")
    assert client.get(r.headers["location"], follow_redirects=False).status_code == 200
    assert _post(client, "/api/signin", {"invite": secret}).status_code == 200
    assert set(client.cookies.keys()) == {"label_token_8123", "label_session_8123"}
    assert client.get("/api/session").json() == {"auth": "invite", "labeller": "alice"}


# --------------------------------------------------------------------------- sign-in: no login CSRF, sessions


def test_a_link_opened_from_another_site_does_not_replace_who_is_signed_in(store: LabelStore, invite_app) -> None:
    """`GET /?invite=SECRET` used to sign the browser in at once: another site could send a signed-in
    labeller to the attacker's link and collect their votes under the attacker's name."""
    client_for, _ = invite_app
    alice = client_for("alice")
    _, mallory = store.invite("mallory")
    r = alice.get(f"/?invite={mallory}", headers={"Referer": "http://evil.example/"}, follow_redirects=False)
    assert r.status_code == 200 and "set-cookie" not in r.headers
    assert alice.get("/api/session").json() == {"auth": "invite", "labeller": "alice"}
    # The page asks first: whose link it is, and who is signed in now.
    assert _post(alice, "/api/invitation", {"invite": mallory}).json() == {"labeller": "mallory", "current": "alice"}
    assert alice.get("/api/session").json()["labeller"] == "alice"
    # Signing in is a JSON POST: a cross-site one is refused (and a cross-site form cannot send JSON).
    r = _post(alice, "/api/signin", {"invite": mallory}, Origin="http://evil.example")
    assert r.status_code == 403 and alice.get("/api/session").json()["labeller"] == "alice"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    r = alice.post("/api/signin", content=f"invite={mallory}", headers=form)
    assert r.status_code == 415 and alice.get("/api/session").json()["labeller"] == "alice"


def test_sessions_are_their_own_secret_and_end_with_the_link(tmp_path: Path, lab) -> None:
    now = [1_000_000.0]
    store = LabelStore(tmp_path / "db.sqlite", clock=lambda: now[0])
    store.import_pairs(lab.make_pairs(1))
    _, link = store.invite("alice", expires_seconds=3600)
    name, session = store.sign_in(link)
    assert (name, store.session_labeller(session), store.authenticate(link)) == ("alice", "alice", "alice")
    assert session != link and store.authenticate(session) is None and store.session_labeller(link) is None
    stored = sqlite3.connect(store.path).execute("SELECT session_hash, expires_at FROM sessions").fetchall()
    assert stored == [(hashlib.sha256(session.encode()).hexdigest(), "1970-01-12T14:46:40.000000Z")]  # 1e6 + 3600 s
    now[0] += 3599
    assert store.session_labeller(session) == "alice" and store.authenticate(link) == "alice"
    now[0] += 1  # the link's hour is over: the link and the browser signed in with it stop working
    assert store.session_labeller(session) is None and store.authenticate(link) is None and store.sign_in(link) is None
    _, link = store.invite("alice", expires_seconds=3600)
    _, session = store.sign_in(link)
    store.invite("alice")  # a new link signs out the browsers of the old one
    assert store.session_labeller(session) is None
    _, session = store.sign_in(store.invite("alice")[1])
    store.revoke("alice")
    assert store.session_labeller(session) is None
    store.close()


def test_invite_expires_option(tmp_path: Path, lab, capsys) -> None:
    pairs = lab.write_pairs_file(tmp_path / "pairs.jsonl", lab.make_pairs(1))
    assert rlhfkit_main(["label", "invite", "alice", "--pairs", str(pairs), "--expires", "12h"]) == 0
    out = capsys.readouterr().out
    store = LabelStore(cli.default_db(pairs))
    until = store.invite_expires_at("alice")
    invited_at = sqlite3.connect(store.path).execute("SELECT invited_at FROM labellers").fetchone()[0]
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ"
    assert (datetime.strptime(until, fmt) - datetime.strptime(invited_at, fmt)).total_seconds() == 12 * 3600
    assert f"valid until {until[:10]} {until[11:16]} UTC" in out.splitlines()[0]
    store.close()
    for bad in ("0d", "367d", "1w", "-1h", "nan", "12"):
        assert rlhfkit_main(["label", "invite", "bob", "--pairs", str(pairs), f"--expires={bad}"]) == 2
        assert capsys.readouterr().err == (f"rlhfkit: error: --expires must be a duration such as 30m, 12h or 7d, "
                                           f"at most 366d, got {bad!r}\n")


def test_sign_ins_with_one_link_keep_a_bounded_number_of_sessions(tmp_path: Path, lab) -> None:
    """300 sign-ins with the same link used to leave 301 session rows; now the newest
    MAX_SESSIONS (20) browsers stay signed in and older ones are signed out."""
    from rlhfkit.label.invitations import MAX_SESSIONS

    store = LabelStore(tmp_path / "db.sqlite")
    store.import_pairs(lab.make_pairs(1))
    _, link = store.invite("alice")
    _, bob_session = store.sign_in(store.invite("bob")[1])
    sessions = [store.sign_in(link)[1] for _ in range(300)]
    count = sqlite3.connect(store.path).execute("SELECT labeller_id, COUNT(*) FROM sessions GROUP BY labeller_id")
    assert sorted(n for _, n in count.fetchall()) == [1, MAX_SESSIONS] and MAX_SESSIONS == 20
    assert [store.session_labeller(s) for s in sessions[-MAX_SESSIONS:]] == ["alice"] * MAX_SESSIONS
    assert store.session_labeller(sessions[-MAX_SESSIONS - 1]) is None and store.session_labeller(sessions[0]) is None
    assert store.session_labeller(bob_session) == "bob"  # another labeller's browsers are untouched
    store.close()
