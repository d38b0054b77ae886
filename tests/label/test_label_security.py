"""Request smuggling and body limits, headers on crashes, cookies per port (loopback only)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import httpx
import pytest
from fastapi.testclient import TestClient

from rlhfkit.label.app import create_app
from rlhfkit.label.security import MAX_BODY_BYTES, SECURITY_HEADERS, SecurityMiddleware
from rlhfkit.label.store import LabelStore

BODY = json.dumps({"labeller": "alice"}).encode()


def _raw_request(port: int, head: str) -> bytes:
    """Send request headers (and no body) to the loopback server; return its whole answer, or a
    note if none came within 5 s (the server was waiting for the body)."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(head.replace("\n", "\r\n").encode() + b"\r\n")
        try:
            while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
                chunk = s.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            return answer or b"(no answer: the server is still reading the body)"
    return answer


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 0


@pytest.mark.parametrize("length_header", ["Content-Length: 10\n", ""])
def test_chunked_body_is_refused_before_it_is_read(store: LabelStore, lab, length_header: str) -> None:
    """A small Content-Length next to Transfer-Encoding: chunked used to let a 200 MB body through.
    The server must answer from the headers alone: no body byte is ever sent here."""
    with lab.LiveServer(create_app(store)) as srv:
        head = (f"POST /api/labellers HTTP/1.1\nHost: 127.0.0.1:{srv.port}\nContent-Type: application/json\n"
                f"{length_header}Transfer-Encoding: chunked\n")
        answer = _raw_request(srv.port, head)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert b"Transfer-Encoding is not accepted" in answer and b"content-security-policy" in answer.lower()


def _asgi_post(app, chunks: int, chunk_size: int, content_length: int) -> tuple[int, int, bytes]:
    """Drive an ASGI app with a body of `chunks` x `chunk_size` bytes whose header claims
    `content_length`; returns (status, chunks the app pulled, response body)."""
    pulled, sent = 0, []

    async def receive() -> dict:
        nonlocal pulled
        pulled += 1
        if pulled > chunks:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": b" " * chunk_size, "more_body": pulled < chunks}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/api/labellers", "raw_path": b"/api/labellers",
             "query_string": b"", "root_path": "", "scheme": "http", "http_version": "1.1",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
             "headers": [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"),
                         (b"content-length", str(content_length).encode())]}
    asyncio.run(app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, pulled, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_body_bytes_are_counted_as_they_arrive_whatever_the_header_says() -> None:
    """Behind a server that framed the body some other way, the lying header still cannot help:
    reading stops at the first chunk past 64 KiB (17 chunks of 4 KiB = 68 KiB)."""
    reached = []

    async def app(scope, receive, send) -> None:  # must never run
        reached.append(scope["path"])

    status, pulled, body = _asgi_post(SecurityMiddleware(app), chunks=200_000, chunk_size=4096, content_length=10)
    assert (status, reached) == (413, [])
    assert pulled == MAX_BODY_BYTES // 4096 + 1 == 17
    assert json.loads(body) == {"error": f"request body larger than {MAX_BODY_BYTES} bytes"}


def test_a_body_within_the_limit_reaches_the_app_intact(store: LabelStore) -> None:
    status, pulled, body = _asgi_post(create_app(store), chunks=1, chunk_size=0, content_length=0)
    assert status == 422 and pulled == 1  # empty body: the app's own validation answers
    client = TestClient(create_app(store))
    r = client.post("/api/labellers", content=BODY, headers={"Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["labeller"] == "alice"


def test_a_crash_answers_json_with_the_security_headers(store: LabelStore, monkeypatch) -> None:
    def boom(name: str):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(store, "next_pair", boom)
    client = TestClient(create_app(store), raise_server_exceptions=False)
    client.post("/api/labellers", content=BODY, headers={"Content-Type": "application/json"})
    r = client.post("/api/next", content=BODY, headers={"Content-Type": "application/json"})
    assert r.status_code == 500
    assert r.json() == {"error": "internal error; the server log has the details"}  # no internals leak
    for name, value in SECURITY_HEADERS.items():
        assert r.headers[name] == value


def test_token_cookies_are_named_by_port_so_two_servers_on_one_host_both_work(tmp_path, lab) -> None:
    """Browsers send a host's cookies to every port: with one cookie name, signing in to the
    second server signed you out of the first."""
    stores = [LabelStore(tmp_path / f"db{i}.sqlite") for i in range(2)]
    tokens = ["first-token-123", "second-token-456"]
    with lab.LiveServer(create_app(stores[0], token=tokens[0])) as a, \
            lab.LiveServer(create_app(stores[1], token=tokens[1])) as b, httpx.Client(timeout=10, follow_redirects=True) as browser:
        for srv, token in ((a, tokens[0]), (b, tokens[1])):
            r = browser.get(f"{srv.url}/?token={token}")
            assert r.status_code == 200 and r.history[0].status_code == 303
        assert {c.name for c in browser.cookies.jar} == {f"label_token_{a.port}", f"label_token_{b.port}"}
        assert browser.get(f"{a.url}/api/health").status_code == 200
        assert browser.get(f"{b.url}/api/health").status_code == 200
    for s in stores:
        s.close()


def test_no_secret_leaves_through_fastapis_opentelemetry(store: LabelStore, monkeypatch) -> None:
    """With FastAPI's built-in telemetry switched on from the environment and a tracer configured
    (as FASTAPI_OTEL_AUTO_CONFIGURE=true with an OTLP endpoint does), every request's span carried
    `url.query` with the access token and the invitation secret in clear text."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)  # not the process-wide one
    monkeypatch.setenv("FASTAPI_OTEL_AUTO_CONFIGURE", "true")
    invite = store.invite("alice")[1]
    client = TestClient(create_app(store, token="access-token-123", auth="invite"))
    client.get(f"/?token=access-token-123&invite={invite}", follow_redirects=False)
    client.get(f"/api/health?token=access-token-123&invite={invite}")
    spans = repr([(s.name, dict(s.attributes)) for s in exported.get_finished_spans()])
    assert "access-token-123" not in spans and invite not in spans
    assert exported.get_finished_spans() == ()


def test_an_early_413_closes_the_connection_instead_of_reading_the_rest(store: LabelStore, lab) -> None:
    """A 10 MiB body got its 413 from the headers, then the server read and threw away the rest
    and kept the connection open. Now it says `Connection: close` and closes: the client sees the
    end of the stream right after the answer, no body byte ever sent (bounded: 10 s)."""
    with lab.LiveServer(create_app(store)) as srv, socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        s.sendall((f"POST /api/labellers HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {10 * 2**20}\r\n\r\n").encode())
        answer = b""
        try:
            while chunk := s.recv(4096):
                answer += chunk
            closed = True
        except TimeoutError:
            closed = False
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 413") and b"connection: close" in head.split(b"\r\n")
    assert closed


def _one_exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw`` on a new connection and read until the server closes it (bounded: 10 s)."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return answer


def test_a_header_block_over_16_kib_is_refused_even_when_it_arrives_in_one_piece(store: LabelStore, lab) -> None:
    """h11 counts a header block only while it is still arriving: 30 KB sent at once was accepted
    although the docs promised 16 KiB. Now 431 with the security headers, whatever the pieces."""
    with lab.LiveServer(create_app(store)) as srv:
        def health(header_kib: int) -> bytes:
            filler = "".join(f"X-Fill-{i}: {'a' * 1000}\r\n" for i in range(header_kib))
            return _one_exchange(srv.port, (f"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n{filler}"
                                            "Connection: close\r\n\r\n").encode())

        small, large = health(14), health(30)
    assert small.startswith(b"HTTP/1.1 200 ")
    assert large.startswith(b"HTTP/1.1 431 ") and b"x-content-type-options: nosniff" in large.lower()
    assert large.endswith(b'{"error":"request header block larger than 16384 bytes"}')


def test_a_full_disk_answers_503_and_logs_once(store: LabelStore, lab, monkeypatch, caplog) -> None:
    """A full disk used to answer "internal error" and log a ~4 KB traceback per request."""
    import sqlite3

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    store.register("alice")
    pair_id = store.next_pair("alice").pair_id
    monkeypatch.setattr(store, "submit_vote", full)
    with lab.LiveServer(create_app(store)) as srv, caplog.at_level(logging.WARNING, logger="rlhfkit.label"):
        with httpx.Client(timeout=10) as client:
            answers = [client.post(f"{srv.url}/api/votes", json={"labeller": "alice", "pair_id": pair_id, "choice": 1,
                                                                   "request_id": f"req-{i:04d}"}) for i in range(20)]
    assert {(r.status_code, r.text) for r in answers} == {(503, '{"error":"disk full; vote not saved"}')}
    assert all(r.headers["x-content-type-options"] == "nosniff" for r in answers)
    assert [r.getMessage() for r in caplog.records] == [
        "labelling app: disk full (database or disk is full); votes are not saved until there is room "
        "(logged at most once a minute)"]
    assert not any(r.exc_info for r in caplog.records)
