"""The HTTP server under the labelling app: uvicorn plus the limits a shared network needs.

What uvicorn 0.54 (h11) covers on its own: ``timeout_keep_alive`` closes a connection that
stays idle *after* an answer, ``limit_concurrency`` answers 503 to a *request* once too many
are open, and h11 refuses a header block over 16 KiB while it arrives in pieces (the app
refuses one that arrived whole: `security.MAX_HEADER_BYTES`). Nothing closes a connection that never
completes a request: one that sends nothing, or trickles its headers or its body a byte at a
time, stays open for ever and holds a file descriptor. So this module adds:

- **a request deadline**: from the moment a connection opens, or its previous answer has
  been sent, the next request must arrive whole (headers and body) within
  ``request_seconds``; otherwise the connection is closed. A request that has arrived is
  never cut off while the app works on it.
- **a connection cap**: a connection beyond ``max_connections`` takes the place of the one
  that has waited longest for its request (idle or trickling clients go first, so they cannot
  lock others out); if every connection has a request being answered, the new one gets 503
  and is closed at once, before it can pin a descriptor. The default leaves room in the
  descriptor limit for each connection's database files (a socket plus up to three SQLite
  files).
- **a write-progress timeout**: a client that sends requests but does not read the answers
  (many pipelined requests, then nothing) fills the transport's buffer; once writing has
  stayed paused ``write_seconds`` the connection is aborted. Such a connection also counts as
  stuck at the cap, so it cannot lock others out either.
- **quiet accept errors**: out of descriptors, asyncio stops accepting for a second (its
  back-off) but logs a traceback for every attempt, a hundred per retry; this server logs
  one line a minute instead.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from rlhfkit.label.security import SECURITY_HEADERS

log = logging.getLogger("rlhfkit.label")
ACCEPT_ERROR = "socket.accept() out of system resource"
INVALID_REQUEST = "Invalid HTTP request received."  # uvicorn's warning, once per malformed request
_SECURITY_LINES = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items())


def closing_answer(status: bytes, body: bytes) -> bytes:
    """A complete HTTP/1.1 answer with a JSON body, the security headers and ``connection: close``."""
    return (b"HTTP/1.1 %s\r\ncontent-type: application/json\r\nconnection: close\r\n%scontent-length: %d\r\n\r\n%s"
            % (status, _SECURITY_LINES, len(body), body))


FULL_ANSWER = closing_answer(b"503 Service Unavailable", b'{"error": "too many connections; try again in a moment"}')
BAD_REQUEST_ANSWER = closing_answer(b"400 Bad Request", b'{"error": "malformed HTTP request"}')


class _QuietLogger:
    """uvicorn's connection logger with its per-request "Invalid HTTP request" warning turned
    into one line a minute (anyone can send malformed requests, no credentials needed)."""

    def __init__(self, logger: logging.Logger, throttle: Throttle) -> None:
        self._logger, self._throttle = logger, throttle

    def __getattr__(self, name: str) -> object:
        return getattr(self._logger, name)

    def warning(self, msg: object, *args: object, **kwargs: object) -> None:
        if msg != INVALID_REQUEST:
            self._logger.warning(msg, *args, **kwargs)
        elif self._throttle.ready():
            log.warning("labelling app: malformed HTTP request(s) answered 400; logged at most once a minute")


def default_max_connections(fd_limit: int | None = None) -> int:
    """A quarter of the process's descriptor limit (each connection may need a socket and a
    thread's three database files), at most 256."""
    if fd_limit is None:
        fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return max(1, min(256, fd_limit // 4))


@dataclass
class Throttle:
    """Say something at most once per ``seconds`` (the first time at once)."""

    seconds: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _last: float | None = field(default=None, repr=False)

    def ready(self) -> bool:
        now = self.clock()
        if self._last is not None and now - self._last < self.seconds:
            return False
        self._last = now
        return True


@dataclass(frozen=True)
class Limits:
    """Per-server connection limits (see the module docstring)."""

    request_seconds: float = 10.0
    keep_alive_seconds: int = 5
    write_seconds: float = 10.0
    max_connections: int = field(default_factory=default_max_connections)


class DeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol with the request deadline and the connection cap."""

    limits: Limits  # all three set per server by ``make_server``
    full: Throttle
    invalid: Throttle

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.logger = _QuietLogger(self.logger, self.invalid)  # type: ignore[assignment]

    def send_400_response(self, msg: str) -> None:
        """h11 found the request malformed. Answer 400 (with the security headers) only if no
        answer has begun: the app may already have refused the request (a chunked body is
        refused on its headers), and a second answer raised h11's LocalProtocolError, a 3 KB
        traceback per request. Either way the app's later sends are dropped and the
        connection closes."""
        if self.cycle is not None:
            self.cycle.disconnected = True  # the app's send() becomes a no-op, receive() says disconnect
            self.cycle.message_event.set()
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE) and not self.transport.is_closing():
            if self.conn.our_state is h11.IDLE or self.cycle is None or not self.cycle.response_started:
                self.transport.write(BAD_REQUEST_ANSWER)
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._stalled: asyncio.TimerHandle | None = None
        self._paused_since: float | None = None
        self._waiting_since = self.loop.time()
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            victim = self._longest_waiting()
            if victim is None:  # every other connection has a request in the works
                if self.full.ready():
                    log.warning("labelling app: %d connections busy (the cap); refusing new ones for now",
                                self.limits.max_connections)
                transport.write(FULL_ANSWER)
                transport.close()
                return
            if victim._paused_since is not None:
                victim.transport.abort()  # a stalled reader's buffered answers are dropped, not flushed
            else:
                victim.transport.close()
        self._arm()

    def _waiting(self) -> bool:
        """No request of this connection has arrived whole yet (idle, or still arriving)."""
        return self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing()

    def _stuck_since(self) -> float | None:
        """Since when this connection holds its place without progress: waiting for its request,
        or its answers not being read (writing paused); None while it is being served."""
        if self._paused_since is not None:
            return self._paused_since
        return self._waiting_since if self._waiting() else None

    def _longest_waiting(self) -> DeadlineProtocol | None:
        """At the cap, the connection to close for a new one: the one stuck longest (an idle or
        trickling client, or one that does not read its answers), never one being served."""
        stuck = [(since, c) for c in self.connections if c is not self and isinstance(c, DeadlineProtocol)
                 and (since := c._stuck_since()) is not None]
        return min(stuck, key=lambda sc: sc[0], default=(0.0, None))[1]

    def pause_writing(self) -> None:
        """The client reads its answers too slowly (the transport's buffer is full): start the
        write-progress clock; a reader that stays paused ``write_seconds`` is cut off."""
        super().pause_writing()
        if self._paused_since is None:
            self._paused_since = self.loop.time()
            self._stalled = self.loop.call_later(self.limits.write_seconds, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._paused_since = None
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def _write_stalled(self) -> None:
        if self._paused_since is not None:
            self.transport.abort()  # close() would wait for the buffer to drain, i.e. for ever

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._deadline, self._stalled):
            if timer is not None:
                timer.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        """Start the clock for the next request (restarting it after each answer)."""
        if self._deadline is not None:
            self._deadline.cancel()
        if not self.transport.is_closing():
            self._waiting_since = self.loop.time()
            self._deadline = self.loop.call_later(self.limits.request_seconds, self._overdue)

    def _overdue(self) -> None:
        """The next request has not arrived whole in time: idle, or headers/body still coming."""
        if self._waiting():
            self.transport.close()


def quiet_accept_errors(throttle: Throttle):
    """An asyncio exception handler that turns the accept-error flood into one line a minute
    and passes every other error to asyncio's default handler."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if context.get("message") != ACCEPT_ERROR:
            loop.default_exception_handler(context)
        elif throttle.ready():
            exc = context.get("exception")
            log.warning("labelling app: cannot accept connections (%s); retrying every second",
                        getattr(exc, "strerror", None) or exc)

    return handle


class LabelServer(uvicorn.Server):
    """A uvicorn server whose event loop logs accept errors quietly."""

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(quiet_accept_errors(Throttle()))
        await super().serve(sockets)


def make_server(app: object, limits: Limits | None = None, log_level: str = "warning", **config: object) -> LabelServer:
    """A uvicorn server for ``app`` with ``limits`` (``config``: more ``uvicorn.Config`` options,
    e.g. host and port; ``serve`` passes its own bound socket to ``run`` instead)."""
    limits = limits or Limits()
    protocol = type("LabelProtocol", (DeadlineProtocol,), {"limits": limits, "full": Throttle(),
                                                       "invalid": Throttle()})
    return LabelServer(uvicorn.Config(app, http=protocol, timeout_keep_alive=limits.keep_alive_seconds,
                                      log_level=log_level, access_log=False, **config))
