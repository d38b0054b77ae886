"""Request checks for the labelling app: access token, Host/Origin, body limits, headers.

- **Token**: when set, every request needs it, as ``Authorization: Bearer T``, an
  ``X-Label-Token: T`` header, a ``?token=T`` query parameter or the ``label_token`` cookie
  (set, HttpOnly and SameSite=Strict, the first time a browser opens ``/?token=T``).
- **Host** (DNS-rebinding guard): on a loopback bind only ``127.0.0.1``, ``localhost`` and
  ``[::1]`` are accepted as the Host header.
- **Origin** (cross-site request guard): a state-changing request whose Origin does not
  match its Host is refused.
- **Body**: API POSTs must be JSON (``Content-Type: application/json``) of at most 64 KiB.
- **Headers**: a strict Content-Security-Policy (scripts and styles from this server only,
  no inline code), ``nosniff``, no framing, no referrer (the URL may carry the token).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
TOKEN_COOKIE = "label_token"
MAX_BODY_BYTES = 64 * 1024

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


def hostname_of(host_header: str) -> str:
    """'[::1]:8000' -> '::1', 'localhost:8000' -> 'localhost' (lower-cased)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def presented_token(request: Request) -> tuple[str | None, bool]:
    """The token the request carries and whether it came in the query string."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip(), False
    if "x-label-token" in request.headers:
        return request.headers["x-label-token"], False
    if "token" in request.query_params:
        return request.query_params["token"], True
    return request.cookies.get(TOKEN_COOKIE), False


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def check(request: Request, token: str | None, allowed_hosts: frozenset[str] | None) -> Response | None:
    """Return an error response if the request must be refused, else None."""
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
        length = request.headers.get("content-length")
        if length is None or not length.isdigit():
            return _error(411, "a Content-Length header is required")
        if int(length) > MAX_BODY_BYTES:
            return _error(413, f"request body larger than {MAX_BODY_BYTES} bytes")
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype != "application/json":
            return _error(415, "request body must be JSON (Content-Type: application/json)")
    return None


def make_middleware(
    token: str | None, allowed_hosts: frozenset[str] | None
) -> Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]:
    """An HTTP middleware applying ``check`` and adding the security headers."""

    async def middleware(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        refusal = check(request, token, allowed_hosts)
        if refusal is not None:
            response = refusal
        elif token is not None and presented_token(request)[1] and request.url.path == "/":
            # First visit with ?token=: keep it in a cookie and drop it from the address bar.
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict", path="/")
        else:
            response = await call_next(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response

    return middleware
