"""Clients that pipeline requests and never read the answers: each such connection used to hold
its place for ever (never "waiting", so never evicted, and the request deadline never fired);
16 of them under a cap of 16 made /api/health answer 503. Now a connection whose writing stays
paused is aborted after ``write_seconds``, and at the cap it is evicted like an idle one
(loopback only, 127.0.0.1; every wait and every loop is bounded)."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import httpx

from rlhfkit.label.app import create_app
from rlhfkit.label.server import Limits
from rlhfkit.label.store import LabelStore

BOUND_S = 20.0  # the longest any wait here lasts
PIPELINED = 1500  # GET /static/app.js (9.6 KB each): far more than the socket buffers hold


def _slow_reader(port: int) -> socket.socket:
    """A connection with a tiny receive buffer that pipelines many requests and reads nothing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(BOUND_S)
    sock.connect(("127.0.0.1", port))
    request = f"GET /static/app.js HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    sock.sendall(request * PIPELINED)
    return sock


def _wait_for(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _connections(srv) -> list:
    return list(srv.server.server_state.connections)


def test_a_reader_that_stays_paused_is_cut_off(store: LabelStore, lab) -> None:
    limits = Limits(request_seconds=60, keep_alive_seconds=60, write_seconds=0.5, max_connections=100)
    with lab.LiveServer(create_app(store), limits) as srv:
        sock = _slow_reader(srv.port)
        try:
            assert _wait_for(lambda: len(_connections(srv)) == 1), "the slow reader never connected"
            assert _wait_for(lambda: not _connections(srv)), "the stalled connection was never closed"
        finally:
            sock.close()


def test_paused_readers_at_the_cap_make_room_for_others(store: LabelStore, lab) -> None:
    cap = 4
    limits = Limits(request_seconds=60, keep_alive_seconds=60, write_seconds=60, max_connections=cap)
    with lab.LiveServer(create_app(store), limits) as srv:
        readers = [_slow_reader(srv.port) for _ in range(cap)]
        try:
            def all_paused() -> bool:
                conns = _connections(srv)
                return len(conns) == cap and all(c.flow.write_paused for c in conns)

            assert _wait_for(all_paused), "the slow readers never filled their buffers"
            with httpx.Client(timeout=BOUND_S) as client:
                for _ in range(3):  # each new connection takes the place of a stalled reader
                    r = client.get(f"{srv.url}/api/health", headers={"Connection": "close"})
                    assert (r.status_code, r.json()) == (200, {"ok": True})
        finally:
            for sock in readers:
                sock.close()
