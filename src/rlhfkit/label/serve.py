"""`rlhfkit label serve`: check everything, bind the address, then import pairs and serve.

Order matters: options, the pairs file and the address are checked before the database is
opened, so a wrong port or host leaves no database behind, and the socket that was checked
is the one uvicorn serves on (no window for another process to take the port).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
from collections.abc import Mapping
from pathlib import Path

from rlhfkit.errors import UserError
from rlhfkit.label.db import hold_for_serving, writes_reported
from rlhfkit.label.options import LEAD_TOKEN_VARIABLE, TOKEN_RE, TOKEN_VARIABLE, check_number, default_db
from rlhfkit.label.pairs import read_pairs
from rlhfkit.label.rationale import parse_criteria, read_guidelines
from rlhfkit.label.store import MAX_VOTES_PER_PAIR, LabelStore

MAX_LEASE_MINUTES = 7 * 24 * 60


def bind_error(host: str, port: int, e: OSError) -> str:
    """One line that blames what is actually wrong: the port, the host or the permissions."""
    if isinstance(e, socket.gaierror) or e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        return f"--host {host}: not an address of this machine ({e.strerror or e}); use 127.0.0.1 or one of its own addresses"
    if e.errno == errno.EADDRINUSE:
        return f"--port {port}: already in use on {host}; choose another --port"
    if e.errno == errno.EACCES:
        return f"--port {port}: not allowed for this user (ports below 1024 need privileges); choose another --port"
    return f"cannot listen on {host}:{port} ({e.strerror or e})"


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening TCP socket for (host, port), or a one-line UserError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise UserError(bind_error(host, port, e)) from None
    return sock


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def run_server(app: object, sock: socket.socket, log_level: str) -> None:
    """Serve ``app`` on the already bound socket until Ctrl-C (limits: ``server.Limits``)."""
    from rlhfkit.label.server import make_server

    make_server(app, log_level=log_level).run(sockets=[sock])


def access_token(option: str | None, environ: Mapping[str, str], flag: str = "--token",
                 variable: str = TOKEN_VARIABLE) -> tuple[str | None, str]:
    """The access token and where it came from (``--token``, else ``$RLHFKIT_LABEL_TOKEN``), or
    (None, ""); an empty or malformed one is a one-line error naming its source. ``flag`` and
    ``variable`` name another secret of the same form (the lead token)."""
    if option is not None:
        token, source = option, flag
    elif variable in environ:
        token, source = environ[variable], variable
    else:
        return None, ""
    if not token:
        raise UserError(f"{source} is empty: give it 8-128 characters of letters, digits and _.~-"
                        + (f", or unset {variable}" if source == variable else ""))
    if not TOKEN_RE.fullmatch(token):
        raise UserError(f"{source} must be 8-128 characters of letters, digits and _.~-")
    return token, source


def check_serve_options(args: argparse.Namespace, loopback: bool) -> str:
    """Validate the numbers and the auth mode; returns the auth mode to use."""
    check_number("--votes-per-pair", args.votes_per_pair, 1, MAX_VOTES_PER_PAIR)
    check_number("--port", args.port, 1, 65535)
    check_number("--lease-minutes", args.lease_minutes, 1, MAX_LEASE_MINUTES)
    auth = args.auth or ("open" if loopback else "invite")
    if auth == "open" and not loopback:
        raise UserError(f"--auth open is for loopback only: on {args.host} anyone who can reach the app could "
                        "vote and undo as any labeller; invite labellers with `rlhfkit label invite NAME`")
    return auth


def _criteria(raw: str | None) -> tuple[str, ...]:
    """``--criteria`` checked (``rationale.parse_criteria``), or a one-line error."""
    if raw is None:
        return ()
    try:
        return parse_criteria(raw)
    except ValueError as e:
        raise UserError(f"--criteria: {e}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    """Check the options, pairs and address, then import the pairs and run until Ctrl-C."""
    from rlhfkit.label.security import LOOPBACK_HOSTS, is_loopback

    host = args.host.strip("[]")
    loopback = is_loopback(host)
    auth = check_serve_options(args, loopback)
    token, token_source = access_token(args.token, os.environ)
    lead_token, lead_source = access_token(args.lead_token, os.environ, "--lead-token", LEAD_TOKEN_VARIABLE)
    if lead_token is not None and lead_token == token:
        raise UserError(f"{lead_source} must differ from the access token: the lead's view is for the lead only")
    criteria = _criteria(args.criteria)
    guidelines = read_guidelines(args.guidelines) if args.guidelines is not None else None
    pairs = read_pairs(args.pairs)
    db = Path(args.db) if args.db else default_db(args.pairs)
    with contextlib.ExitStack() as cleanup:  # undone in reverse: store, then lock, then socket
        sock = listen(host, args.port)
        cleanup.callback(sock.close)
        from rlhfkit.label.app import create_app  # FastAPI: imported once the address is bound

        lock = hold_for_serving(db)  # before the store: a second server must change nothing
        cleanup.callback(os.close, lock)  # after the store: closing it drops SQLite's locks here
        with writes_reported(db):  # a read-only file or folder, a full disk: one line
            store = LabelStore(db, votes_per_pair=args.votes_per_pair, lease_seconds=args.lease_minutes * 60)
            cleanup.callback(store.close)
            added = store.import_pairs(pairs, source=str(args.pairs))
            store.set_meta("votes_per_pair", str(args.votes_per_pair))
            store.set_meta("criteria", ",".join(criteria))
        app = create_app(store, token=token, allowed_hosts=LOOPBACK_HOSTS if loopback else None, auth=auth,
                         criteria=criteria, guidelines=guidelines, lead_token=lead_token)
        _print_banner(args, db, url_of(host, args.port), len(pairs), added, auth, token_source)
        if lead_source == "--lead-token":
            print(f"lead's view (disputed pairs, final labels): {url_of(host, args.port)}lead?lead={args.lead_token}")
        elif lead_source:
            print(f"lead's view: {url_of(host, args.port)}lead?lead=${LEAD_TOKEN_VARIABLE}", flush=True)
        run_server(app, sock, args.log_level)
    return 0


def _print_banner(args: argparse.Namespace, db: Path, url: str, n_pairs: int, added: int, auth: str,
                  token_source: str) -> None:
    """What is served, where the votes go and the address to open; a token from the
    environment is never printed (the banner may end up in a log)."""
    print(f"labelling {n_pairs} pair(s) ({added} new), each by {args.votes_per_pair} labeller(s); votes in {db}")
    if auth == "invite":
        print(f"labellers sign in with their own link: rlhfkit label invite NAME --db {db} --url {url}")
    if token_source == "--token":
        print(f"note: --token is visible to every user of this machine (ps); set {TOKEN_VARIABLE} instead")
        print(f"open {url}?token={args.token}")
    elif token_source:
        print(f"open {url}?token=${TOKEN_VARIABLE} (the access token is in that environment variable)")
    else:
        print(f"open {url}")
    print("press Ctrl-C to stop (every vote is already saved)", flush=True)
