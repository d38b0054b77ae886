"""Request checks for the labelling app: access token, Host/Origin, body limits, headers.

- **Token**: when set, every request needs it, as ``Authorization: Bearer T``, an
  ``X-Label-Token: T`` header, a ``?token=T`` query parameter or the ``label_token_PORT``
  cookie (set, HttpOnly and SameSite=Strict, the first time a browser opens ``/?token=T``).
  Cookies are shared by every port of a host, so each server names its cookies by its port.
- **Host** (DNS-rebinding guard): on a loopback bind only ``127.0.0.1``, ``localhost`` and
  ``[::1]`` are accepted as the Host header, each exactly, with an optional ``:digits`` port.
- **Origin** (cross-site request guard): a state-changing request whose Origin does not
  match its Host is refused.
- **Body**: API POSTs must be JSON (``Content-Type: application/json``) with a
  ``Content-Length`` and no ``Transfer-Encoding`` (a request carrying both is a smuggling
  attempt: 400). Whatever the headers say, the body is counted as it arrives and the request
  is refused with 413 as soon as it passes 64 KiB; nothing beyond that is read: a refusal
  sent before the body was read says ``Connection: close`` and the connection ends.
- **Headers**: a strict Content-Security-Policy (scripts and styles from this server only,
  no inline code), ``nosniff``, no framing, no referrer (the URL may carry a secret), on
  every response, errors and crashes (a JSON 500) included.
"""

from __future__ import annotations

import errno
import logging
import re
import secrets
import sqlite3
import time
from urllib.parse import urlencode, urlsplit

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
MAX_BODY_BYTES = 64 * 1024
MAX_HEADER_BYTES = 16 * 1024  # request line + headers, as h11 counts a block that arrives in pieces


def header_bytes(scope: Scope) -> int:
    """About the size of the request's line and header block: h11 refuses one over its limit
    only while it is still arriving, so a block sent in one piece is measured here."""
    line = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 16
    return line + sum(len(name) + len(value) + 4 for name, value in scope.get("headers", []))
log = logging.getLogger("rlhfkit.label")


def _disk_full(e: BaseException) -> bool:
    """SQLite's "database or disk is full" (SQLITE_FULL) or an OSError with ENOSPC/EDQUOT."""
    if isinstance(e, sqlite3.OperationalError):
        return "disk is full" in str(e) or getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def is_loopback(host: str) -> bool:
    """True for the addresses that only this machine can reach."""
    return host.strip("[]").lower() in LOOPBACK_HOSTS


def new_token() -> str:
    """A fresh random access token (128 bits, URL-safe)."""
    return secrets.token_urlsafe(16)


def cookie_name(kind: str, scope: Scope) -> str:
    """``label_token_8000``: the cookie ``kind`` of the server listening on this port."""
    server = scope.get("server") or (None, None)
    return f"label_{kind}_{server[1]}" if server[1] is not None else f"label_{kind}"


HOST_RE = re.compile(r"(?:\[(?P<ip6>[0-9a-f:.]+)\]|(?P<name>[a-z0-9.-]+))(?::[0-9]{1,5})?")


def hostname_of(host_header: str) -> str | None:
    """'[::1]:8000' -> '::1', 'LocalHost:8000' -> 'localhost'; None unless the header is exactly
    one name (or bracketed IPv6 address) with an optional ``:digits`` port, so that
    ``127.0.0.1:1@evil.com``, ``[::1]evil.com`` or ``localhost:evil`` match nothing."""
    match = HOST_RE.fullmatch(host_header.strip().lower())
    return None if match is None else match["ip6"] or match["name"]


def presented_token(request: Request) -> tuple[str | None, bool]:
    """The token the request carries and whether it came in the query string."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip(), False
    if "x-label-token" in request.headers:
        return request.headers["x-label-token"], False
    if "token" in request.query_params:
        return request.query_params["token"], True
    return request.cookies.get(cookie_name("token", request.scope)), False


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _closing(response: Response, method: str) -> Response:
    """A refusal sent before the request body was read ends the connection (``Connection:
    close``): otherwise the server would go on reading, and throwing away, the rest of it."""
    if method not in ("GET", "HEAD"):
        response.headers["Connection"] = "close"
    return response


def check(request: Request, token: str | None, allowed_hosts: frozenset[str] | None) -> Response | None:
    """Return an error response if the request must be refused on its headers, else None."""
    if header_bytes(request.scope) > MAX_HEADER_BYTES:
        return _error(431, f"request header block larger than {MAX_HEADER_BYTES} bytes")
    if allowed_hosts is not None and hostname_of(request.headers.get("host", "")) not in allowed_hosts:
        return _error(400, "Host header not allowed (the app only answers on its loopback address)")
    origin = request.headers.get("origin")
    if request.method not in ("GET", "HEAD") and origin is not None:
        if urlsplit(origin).netloc.lower() != request.headers.get("host", "").lower():
            return _error(403, "cross-origin request refused")
    if token is not None:
        given, _ = presented_token(request)
        if given is None or not secrets.compare_digest(given.encode(), token.encode()):
            return _error(401, "missing or wrong access token: open the URL that `rlhfkit label serve` printed")
    if request.method == "POST" and request.url.path.startswith("/api/"):
        if "transfer-encoding" in request.headers:
            return _error(400, "Transfer-Encoding is not accepted; send the body with a Content-Length")
        length = request.headers.get("content-length")
        if length is None or not length.isdigit():
            return _error(411, "a Content-Length header is required")
        if int(length) > MAX_BODY_BYTES:
            return _error(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return _error(415, "request body must be JSON (Content-Type: application/json)")
    return None


class _Disconnected(Exception):
    """The client went away while sending its body."""


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None as soon as more than ``limit`` bytes have arrived."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then defers to the server."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class SecurityMiddleware:
    """Pure ASGI middleware: ``check`` on the headers, a counted body, headers on every answer."""

    def __init__(self, app: ASGIApp, token: str | None = None, allowed_hosts: frozenset[str] | None = None,
                 max_body: int = MAX_BODY_BYTES) -> None:
        self.app, self.token, self.allowed_hosts, self.max_body = app, token, allowed_hosts, max_body
        self._disk_full_logged_at: float | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    headers.setdefault(name, value)
            await send(message)

        try:
            await self._handle(scope, receive, send_with_headers)
        except _Disconnected:
            return
        except Exception as e:
            if started:
                raise
            if _disk_full(e):
                if self._disk_full_logged_at is None or time.monotonic() - self._disk_full_logged_at >= 60:
                    self._disk_full_logged_at = time.monotonic()
                    log.error("labelling app: disk full (%s); votes are not saved until there is room "
                              "(logged at most once a minute)", e)
                await _error(503, "disk full; vote not saved")(scope, receive, send_with_headers)
                return
            log.exception("labelling app: unhandled error on %s %s", scope.get("method"), scope.get("path"))
            await _error(500, "internal error; the server log has the details")(scope, receive, send_with_headers)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope)
        refusal = check(request, self.token, self.allowed_hosts)
        if refusal is not None:
            await _closing(refusal, request.method)(scope, receive, send)
            return
        if self.token is not None and presented_token(request)[1] and request.url.path in ("/", "/lead"):
            # First visit with ?token=: keep it in a cookie and drop it from the address bar.
            rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
            response = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303)
            response.set_cookie(cookie_name("token", scope), self.token, httponly=True, samesite="strict", path="/")
            await response(scope, receive, send)
            return
        if request.method not in ("GET", "HEAD"):
            body = await read_body(receive, self.max_body)
            if body is None:
                too_large = _error(413, f"request body larger than {self.max_body} bytes")
                await _closing(too_large, request.method)(scope, receive, send)
                return
            receive = _replaying(body, receive)
        await self.app(scope, receive, send)
