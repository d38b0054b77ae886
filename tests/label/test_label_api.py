"""HTTP API: the labelling flow, input validation, path traversal, token, Host/Origin checks."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from rlhfkit.label.app import create_app
from rlhfkit.label.pairs import Pair
from rlhfkit.label.security import LOOPBACK_HOSTS, hostname_of
from rlhfkit.label.store import LabelStore


@pytest.fixture
def client(store: LabelStore) -> TestClient:
    return TestClient(create_app(store))


def _post(client: TestClient, path: str, body: object, **kw):
    return client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"}, **kw)


def test_full_flow(client: TestClient, store: LabelStore) -> None:
    r = _post(client, "/api/labellers", {"labeller": "  alice "})
    assert r.status_code == 200 and r.json()["labeller"] == "alice"
    assert r.json()["progress"] == {"done": 0, "total": 5, "voted": 0, "skipped": 0}
    nxt = _post(client, "/api/next", {"labeller": "alice"}).json()
    pair = nxt["pair"]
    assert set(pair) == {"pair_id", "prompt", "left", "right"}  # no model names, no A/B
    vote = {"labeller": "alice", "pair_id": pair["pair_id"], "choice": 2, "request_id": "req-0001"}
    r = _post(client, "/api/votes", vote)
    assert r.status_code == 201 and r.json()["stored"] is True
    assert r.json()["progress"]["done"] == 1 and r.json()["overall"] == {"votes": 1, "target": 10, "pairs": 5}
    r = _post(client, "/api/votes", vote)  # replay
    assert r.status_code == 200 and r.json()["duplicate"] is True
    second = _post(client, "/api/next", {"labeller": "alice"}).json()["pair"]
    assert second["pair_id"] != pair["pair_id"]
    assert _post(client, "/api/skip", {"labeller": "alice", "pair_id": second["pair_id"]}).status_code == 200
    r = _post(client, "/api/undo", {"labeller": "alice"})
    assert r.json()["undone"] == second["pair_id"]
    assert _post(client, "/api/next", {"labeller": "alice"}).json()["pair"] == second
    [stored] = store.votes()
    expected = 1 if pair["left"] == stored.response_a else -1  # "left slightly better"
    assert (stored.labeller, stored.choice, stored.score) == ("alice", 2, expected)


def test_all_done_returns_null_pair(tmp_path, lab) -> None:
    store = LabelStore(tmp_path / "db.sqlite")
    store.import_pairs(lab.make_pairs(1))
    client = TestClient(create_app(store))
    _post(client, "/api/labellers", {"labeller": "bob"})
    pid = _post(client, "/api/next", {"labeller": "bob"}).json()["pair"]["pair_id"]
    _post(client, "/api/votes", {"labeller": "bob", "pair_id": pid, "choice": 5, "request_id": "abcdefgh"})
    r = _post(client, "/api/next", {"labeller": "bob"}).json()
    assert r["pair"] is None and r["progress"] == {"done": 1, "total": 1, "voted": 1, "skipped": 0}


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"labeller": "alice", "pair_id": "p999", "choice": 1, "request_id": "req-0001"}, 404, "unknown pair_id 'p999'"),
        ({"labeller": "alice", "pair_id": "p004", "choice": 1, "request_id": "req-0001"}, 409, "has not been shown"),
        ({"labeller": "zed", "pair_id": "p000", "choice": 1, "request_id": "req-0001"}, 404, "unknown labeller"),
        ({"labeller": "alice", "pair_id": "p000", "choice": 6, "request_id": "req-0001"}, 422, "choice"),
        ({"labeller": "alice", "pair_id": "p000", "choice": 0, "request_id": "req-0001"}, 422, "choice"),
        ({"labeller": "alice", "pair_id": "p000", "choice": "1", "request_id": "req-0001"}, 422, "choice"),
        ({"labeller": "alice", "pair_id": "p000", "choice": True, "request_id": "req-0001"}, 422, "choice"),
        ({"labeller": "alice", "pair_id": "p000", "choice": 1.5, "request_id": "req-0001"}, 422, "choice"),
        ({"labeller": "alice", "pair_id": "p000", "choice": 1}, 422, "request_id"),
        ({"labeller": "alice", "pair_id": "p000", "choice": 1, "request_id": "x"}, 422, "request_id"),
        ({"labeller": "alice", "pair_id": "../../etc/passwd", "choice": 1, "request_id": "req-0001"}, 422, "pair_id"),
        ({"labeller": "<b>x</b>", "pair_id": "p000", "choice": 1, "request_id": "req-0001"}, 422, "labeller"),
        ({"labeller": "", "pair_id": "p000", "choice": 1, "request_id": "req-0001"}, 422, "labeller"),
        ({"labeller": "a" * 41, "pair_id": "p000", "choice": 1, "request_id": "req-0001"}, 422, "labeller"),
        ({"labeller": "alice", "pair_id": "p000", "choice": 1, "request_id": "req-0001", "admin": 1}, 422, "admin"),
        ([1, 2, 3], 422, "body"),
        ("just a string", 422, "body"),
    ],
)
def test_bad_votes_get_4xx_with_message(client: TestClient, body: object, status: int, message: str) -> None:
    _post(client, "/api/labellers", {"labeller": "alice"})
    r = _post(client, "/api/votes", body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


def test_malformed_requests(client: TestClient) -> None:
    r = client.post("/api/votes", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and "JSON" in r.json()["error"]
    r = client.post("/api/votes", content=b'{"labeller": "a"}', headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and "JSON" in r.json()["error"]
    big = json.dumps({"labeller": "a", "pad": "x" * 70_000})
    r = client.post("/api/labellers", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    r = client.get("/api/votes")
    assert r.status_code == 405 and r.json()["error"]
    r = client.get("/api/nope")
    assert r.status_code == 404 and r.json()["error"]


@pytest.mark.parametrize(
    "path",
    ["/static/../store.py", "/static/..%2fstore.py", "/static/%2e%2e%2fcli.py", "/static/%2e%2e/store.py",
     "/static/index.html/../../store.py", "/static//etc/passwd", "/static/....//store.py", "/../../etc/passwd",
     "/static/app.js%00.py", "/static/../../../../etc/passwd"],
)
def test_no_path_traversal(client: TestClient, path: str) -> None:
    r = client.get(path)
    assert r.status_code in (404, 405)
    assert "import" not in r.text and "root:" not in r.text


def test_static_files_and_security_headers(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "<script>" not in page.text and "onclick" not in page.text  # no inline code (CSP forbids it)
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    js = client.get("/static/app.js")
    assert js.status_code == 200 and "javascript" in js.headers["content-type"]
    assert "innerHTML" not in js.text.replace("never innerHTML", "")  # model text goes in via textContent
    assert client.get("/static/style.css").status_code == 200


def test_model_output_is_returned_verbatim_as_data(tmp_path, lab) -> None:
    store = LabelStore(tmp_path / "db.sqlite")
    store.import_pairs([Pair("x1", lab.XSS, lab.XSS, "plain")])
    client = TestClient(create_app(store))
    _post(client, "/api/labellers", {"labeller": "alice"})
    r = _post(client, "/api/next", {"labeller": "alice"})
    assert r.headers["content-type"] == "application/json"
    pair = r.json()["pair"]
    assert pair["prompt"] == lab.XSS and lab.XSS in (pair["left"], pair["right"])


TOKEN = "s3cret-token-123"


@pytest.fixture
def token_client(store: LabelStore) -> TestClient:
    return TestClient(create_app(store, token=TOKEN))


def test_token_required_everywhere(token_client: TestClient) -> None:
    for path in ("/", "/static/app.js", "/api/health"):
        r = token_client.get(path)
        assert r.status_code == 401 and "token" in r.json()["error"]
    assert token_client.get("/api/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert _post(token_client, "/api/labellers", {"labeller": "alice"}).status_code == 401


def test_token_accepted_as_header_query_or_cookie(token_client: TestClient) -> None:
    assert token_client.get("/api/health", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert token_client.get("/api/health", headers={"X-Label-Token": TOKEN}).status_code == 200
    assert token_client.get(f"/api/health?token={TOKEN}").status_code == 200
    r = token_client.get(f"/?token={TOKEN}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    token_client.cookies.set("label_token", TOKEN)
    assert token_client.get("/").status_code == 200
    assert _post(token_client, "/api/labellers", {"labeller": "alice"}).status_code == 200


def test_host_and_origin_checks(store: LabelStore) -> None:
    client = TestClient(create_app(store, allowed_hosts=LOOPBACK_HOSTS), base_url="http://127.0.0.1:8000")
    assert client.get("/api/health").status_code == 200
    for host in ("localhost:8000", "[::1]:8000", "127.0.0.1"):
        assert client.get("/api/health", headers={"Host": host}).status_code == 200
    r = client.get("/api/health", headers={"Host": "evil.example:8000"})  # DNS rebinding
    assert r.status_code == 400
    body = json.dumps({"labeller": "alice"})
    headers = {"Content-Type": "application/json", "Origin": "http://evil.example"}
    assert client.post("/api/labellers", content=body, headers=headers).status_code == 403
    headers["Origin"] = "http://127.0.0.1:8000"
    assert client.post("/api/labellers", content=body, headers=headers).status_code == 200


@pytest.mark.parametrize(
    ("header", "host"),
    [("127.0.0.1:8000", "127.0.0.1"), ("LocalHost", "localhost"), ("[::1]:80", "::1"), ("[::1]", "::1"), ("", None),
     # lax parsing used to accept these as loopback names:
     ("127.0.0.1:18002@evil.com", None), ("[::1]evil.com", None), ("[::1].evil.com:80", None),
     ("localhost:evil", None), ("localhost:80:80", None), ("localhost :80", None)],
)
def test_hostname_of(header: str, host: str | None) -> None:
    assert hostname_of(header) == host


@pytest.mark.parametrize("host", ["127.0.0.1:18002@evil.com", "[::1]evil.com", "[::1].evil.com:80", "localhost:evil"])
def test_host_headers_that_only_start_like_a_loopback_name_are_refused(store: LabelStore, host: str) -> None:
    client = TestClient(create_app(store, allowed_hosts=LOOPBACK_HOSTS), base_url="http://127.0.0.1:8000")
    r = client.get("/api/health", headers={"Host": host})
    assert r.status_code == 400 and r.json()["error"].startswith("Host header not allowed")


def test_undo_answers_whether_the_pair_came_back(tmp_path, lab) -> None:
    store = LabelStore(tmp_path / "db.sqlite", votes_per_pair=1)
    store.import_pairs(lab.make_pairs(2))
    client = TestClient(create_app(store))
    for name in ("alice", "bob"):
        _post(client, "/api/labellers", {"labeller": name})
    assert _post(client, "/api/next", {"labeller": "alice"}).json()["pair"]["pair_id"] == "p000"
    _post(client, "/api/skip", {"labeller": "alice", "pair_id": "p000"})
    r = _post(client, "/api/undo", {"labeller": "alice"}).json()
    assert (r["undone"], r["reopened"]) == ("p000", True)  # room left: the pair is back
    _post(client, "/api/skip", {"labeller": "alice", "pair_id": "p000"})
    assert _post(client, "/api/next", {"labeller": "bob"}).json()["pair"]["pair_id"] == "p000"
    _post(client, "/api/votes", {"labeller": "bob", "pair_id": "p000", "choice": 3, "request_id": "bob-0001"})
    r = _post(client, "/api/undo", {"labeller": "alice"}).json()
    assert (r["undone"], r["reopened"]) == ("p000", False)  # bob filled it: the skip is only forgotten
    r = _post(client, "/api/undo", {"labeller": "alice"}).json()
    assert (r["undone"], r["reopened"]) == (None, False)  # and the skip is gone from her history
