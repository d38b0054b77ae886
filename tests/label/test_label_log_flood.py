"""Malformed requests from anyone (no credentials needed) grow the log by a bounded amount:
a bad chunk after a refused chunked body used to log a 3.3 KB traceback per request (h11 had
answered already and uvicorn tried to answer again), and every malformed request line logged
uvicorn's "Invalid HTTP request received." (loopback only; every wait is bounded)."""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from collections.abc import Iterator

import pytest

from rlhfkit.label.app import create_app
from rlhfkit.label.server import Limits
from rlhfkit.label.store import LabelStore

BOUND_S = 15.0  # the longest any one exchange waits
N_REQUESTS = 30
LOG_BUDGET = 1500  # bytes for all N_REQUESTS: a line or two, never one per request


class _Collect(logging.Handler):
    """Every record logged while attached, formatted with its traceback, counted once."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: dict[int, str] = {}
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.setdefault(id(record), self.format(record))

    def size(self) -> int:
        return sum(len(text) + 1 for text in self.seen.values())


@contextlib.contextmanager
def log_lines() -> Iterator[_Collect]:
    """Collect what the root and uvicorn's loggers get (attach after the server is made: its
    logging set-up replaces uvicorn's handlers)."""
    handler = _Collect()
    loggers = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("uvicorn.error")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def _exchange(port: int, raw: bytes, later: bytes = b"") -> bytes:
    """Send ``raw`` on a new connection (then ``later`` once an answer has begun) and read
    until the server closes it (bounded)."""
    got = b""
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND_S) as sock:
        sock.sendall(raw)
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            try:
                piece = sock.recv(65536)
                if later and piece:
                    sock.sendall(later)
                    later = b""
            except (ConnectionResetError, BrokenPipeError, TimeoutError):
                break
            if not piece:
                break
            got += piece
    return got


def _chunked_head(port: int) -> bytes:
    return (f"POST /api/votes HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()


BAD_CHUNK = b"ZZ-not-a-chunk-size\r\n\r\n"


@pytest.mark.parametrize("kind", ["bad chunk", "bad chunk after the answer", "bad request line"])
def test_many_malformed_requests_log_a_bounded_amount(store: LabelStore, lab, kind: str) -> None:
    limits = Limits(request_seconds=5.0, max_connections=64)
    with lab.LiveServer(create_app(store), limits) as srv, log_lines() as logged:
        raw, later = {"bad chunk": (_chunked_head(srv.port) + BAD_CHUNK, b""),
                      "bad chunk after the answer": (_chunked_head(srv.port), BAD_CHUNK),
                      "bad request line": (b"GARBAGE \x01\x02 NOT-HTTP\r\n\r\n", b"")}[kind]
        answers = [_exchange(srv.port, raw, later) for _ in range(N_REQUESTS)]
        time.sleep(0.3)  # let the server finish logging about the last connection
    assert all(a.startswith(b"HTTP/1.1 400 ") for a in answers), answers[:2]
    assert all(a.count(b"HTTP/1.1 ") == 1 for a in answers), answers[:2]  # one answer, never two
    assert all(b"x-content-type-options: nosniff" in a.lower() for a in answers)  # h11's own 400 too
    assert logged.size() <= LOG_BUDGET, (logged.size(), list(logged.seen.values())[:3])
    assert "Traceback" not in "".join(logged.seen.values())
