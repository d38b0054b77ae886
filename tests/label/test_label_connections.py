"""Connections that never finish a request are closed, the connection count is capped, and
running out of descriptors is logged once (loopback only, 127.0.0.1; every wait is bounded)."""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import threading
import time

import httpx

from rlhfkit.label.app import create_app
from rlhfkit.label.server import ACCEPT_ERROR, Limits, Throttle, default_max_connections, quiet_accept_errors
from rlhfkit.label.store import LabelStore

BOUND_S = 15.0  # the longest any probe here waits; the server acts after request_seconds (0.3 s)


def _closed_by_server(sock: socket.socket, trickle: list[bytes], deadline: float) -> bool:
    """Send ``trickle`` one piece at a time (then nothing) until the server closes the connection;
    True if it did before ``deadline``."""
    while time.monotonic() < deadline:
        if trickle:
            try:
                sock.sendall(trickle.pop(0))
            except OSError:
                return True
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            try:
                if sock.recv(4096) == b"":
                    return True
            except ConnectionResetError:
                return True
    return False


def test_idle_and_trickling_connections_are_closed_and_others_still_served(store: LabelStore, lab) -> None:
    """30 idle, 10 header- and 10 body-trickling connections used to stay open for ever (75 s
    observed), each holding a descriptor. Now each must arrive whole within request_seconds."""
    limits = Limits(request_seconds=0.3, max_connections=100)
    with lab.LiveServer(create_app(store), limits) as srv:
        head = f"POST /api/labellers HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\nContent-Type: application/json\r\n"
        probes = {
            "idle": [],
            "headers": [b"GET /api/health HTTP/1.1\r\n"] + [b"X-Slow: 1\r\n"] * 10_000,
            "body": [(head + "Content-Length: 10000\r\n\r\n").encode()] + [b" "] * 10_000,
        }
        sockets = {name: socket.create_connection(("127.0.0.1", srv.port), timeout=BOUND_S) for name in probes}
        deadline = time.monotonic() + BOUND_S
        closed = {name: _closed_by_server(sock, probes[name], deadline) for name, sock in sockets.items()}
        for sock in sockets.values():
            sock.close()
        assert closed == {"idle": True, "headers": True, "body": True}
        with httpx.Client(timeout=BOUND_S) as client:  # a request that arrives whole is answered
            assert client.get(f"{srv.url}/api/health").json() == {"ok": True}


def _keep_alive_request(port: int) -> socket.socket:
    """A connection that has been served once and stays open (keep-alive)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND_S)
    sock.sendall(f"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b'{"ok":true}'):
        answer += sock.recv(4096)
    return sock


def _recv_all(sock: socket.socket) -> bytes:
    answer = b""
    while chunk := sock.recv(4096):
        answer += chunk
    return answer


def test_at_the_cap_a_new_connection_takes_the_place_of_the_longest_idle_one(store: LabelStore, lab) -> None:
    """Open connections used to be limited by nothing but the descriptor limit (70 idle ones made
    /api/health time out under a 64-descriptor limit)."""
    limits = Limits(request_seconds=60, keep_alive_seconds=60, max_connections=2)
    with lab.LiveServer(create_app(store), limits) as srv:
        oldest, newer = (_keep_alive_request(srv.port) for _ in range(2))
        with httpx.Client(timeout=BOUND_S) as client:
            assert client.get(f"{srv.url}/api/health", headers={"Connection": "close"}).status_code == 200
        assert _recv_all(oldest) == b""  # closed to make room; the newer idle one is still open
        newer.sendall(f"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n".encode())
        assert newer.recv(4096).startswith(b"HTTP/1.1 200 ")
        oldest.close()
        newer.close()


def _held_app(store: LabelStore, started: list, release: threading.Event):
    """The labelling app, plus GET /held: answers /api/health once ``release`` is set."""
    inner = create_app(store)

    async def app(scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] == "/held":
            started.append(1)
            while not release.is_set():
                await asyncio.sleep(0.01)
            scope = {**scope, "path": "/api/health", "raw_path": b"/api/health"}
        await inner(scope, receive, send)

    return app


def test_when_every_connection_is_being_answered_a_new_one_gets_503(store: LabelStore, lab) -> None:
    started, release = [], threading.Event()
    limits = Limits(request_seconds=60, keep_alive_seconds=60, max_connections=2)
    with lab.LiveServer(_held_app(store, started, release), limits) as srv:
        busy = [socket.create_connection(("127.0.0.1", srv.port), timeout=BOUND_S) for _ in range(2)]
        for sock in busy:
            sock.sendall(f"GET /held HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n\r\n".encode())
        deadline = time.monotonic() + BOUND_S
        while len(started) < 2 and time.monotonic() < deadline:  # both requests are in the app
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", srv.port), timeout=BOUND_S) as extra:
            answer = _recv_all(extra)
        release.set()
        assert answer.startswith(b"HTTP/1.1 503 ") and b"connection: close" in answer
        assert b"x-content-type-options: nosniff" in answer.lower()  # the security headers, as on every answer
        assert answer.endswith(b'{"error": "too many connections; try again in a moment"}')
        for sock in busy:  # the two requests being answered were never cut off
            assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")
            sock.close()


def test_the_default_cap_leaves_room_in_the_descriptor_limit() -> None:
    assert [default_max_connections(n) for n in (64, 1024, 1_048_576, 2)] == [16, 256, 256, 1]


class _Loop:
    def __init__(self) -> None:
        self.passed_on: list[dict] = []

    def default_exception_handler(self, context: dict) -> None:
        self.passed_on.append(context)


def test_running_out_of_descriptors_is_logged_once_a_minute(caplog) -> None:
    """asyncio logged a traceback per failed accept(), a hundred per retry (113 MiB of log in 20 s
    under a 64-descriptor limit, enough to fill the disk the votes are on)."""
    now = [0.0]
    handle = quiet_accept_errors(Throttle(60.0, clock=lambda: now[0]))
    loop, error = _Loop(), OSError(24, "Too many open files")
    with caplog.at_level(logging.WARNING, logger="rlhfkit.label"):
        for second in range(120):  # two minutes of retries, 100 failed accepts per retry
            now[0] = float(second)
            for _ in range(100):
                handle(loop, {"message": ACCEPT_ERROR, "exception": error})
    assert [r.getMessage() for r in caplog.records] == [
        "labelling app: cannot accept connections (Too many open files); retrying every second"] * 2
    other = {"message": "Task exception was never retrieved"}
    handle(loop, other)
    assert loop.passed_on == [other]  # anything else still reaches asyncio's own handler
