"""Invitation links and browser sessions, mixed into ``store.LabelStore``.

An invitation token (``identity.new_invite_token``) is handed to one labeller by ``rlhfkit
label invite NAME`` and works until it expires (``--expires``, default 7 days), is replaced
by a new invitation or revoked. A browser trades it for a session id of its own
(``sign_in``), its cookie; the session ends with the link, or when the labeller has signed in
``MAX_SESSIONS`` more times since (each sign-in with a link adds one; they used to pile up
without bound). The database keeps only the
SHA-256 of each token and session id.

The methods use the store's transactions (``_tx``, ``_read``), clock and labeller look-ups.
"""

from __future__ import annotations

import math
import sqlite3

from rlhfkit.label.db import iso
from rlhfkit.label.identity import new_invite_token, token_digest

INVITE_SECONDS = 7 * 86400  # how long an invitation link works unless `invite --expires` says otherwise
MAX_INVITE_SECONDS = 366 * 86400
MAX_SESSIONS = 20  # signed-in browsers per labeller; a new sign-in beyond this ends the oldest


class Invitations:
    """Invitation and session methods of ``LabelStore`` (see the module docstring)."""

    def invite(self, name: str, expires_seconds: float = INVITE_SECONDS) -> tuple[str, str]:
        """Create the labeller if new and give them a fresh invitation token, valid for
        ``expires_seconds``; the old token and every browser signed in with it stop working.
        Returns (display name, token); only the token's SHA-256 is stored."""
        if not (math.isfinite(expires_seconds) and 0 < expires_seconds <= MAX_INVITE_SECONDS):
            raise ValueError(f"expires_seconds must be in (0, {MAX_INVITE_SECONDS}], got {expires_seconds}")
        token, now = new_invite_token(), self.clock()
        with self._tx() as con:
            self._create(con, name, iso(now))
            row = self._labeller(con, name)
            con.execute("UPDATE labellers SET token_hash = ?, invited_at = ?, invite_expires_at = ? "
                        "WHERE labeller_id = ?", (token_digest(token), iso(now), iso(now + expires_seconds),
                                                  row["labeller_id"]))
            con.execute("DELETE FROM sessions WHERE labeller_id = ?", (row["labeller_id"],))
        return str(row["name"]), token

    def revoke(self, name: str) -> str:
        """Invalidate the labeller's invitation token and sign out their browsers; returns
        their display name."""
        with self._tx() as con:
            row = self._labeller(con, name)
            con.execute("UPDATE labellers SET token_hash = NULL, invite_expires_at = NULL WHERE labeller_id = ?",
                        (row["labeller_id"],))
            con.execute("DELETE FROM sessions WHERE labeller_id = ?", (row["labeller_id"],))
        return str(row["name"])

    def _invited(self, con: sqlite3.Connection, token: str) -> sqlite3.Row | None:
        """The labeller whose live (unexpired) invitation token this is."""
        digest = token_digest(token)
        if digest is None:
            return None
        return con.execute(
            "SELECT labeller_id, name, invite_expires_at FROM labellers WHERE token_hash = ? "
            "AND (invite_expires_at IS NULL OR invite_expires_at > ?)", (digest, iso(self.clock())),
        ).fetchone()

    def authenticate(self, token: str) -> str | None:
        """The display name of the labeller holding the live invitation ``token``, or None."""
        with self._read() as con:
            row = self._invited(con, token)
        return None if row is None else str(row["name"])

    def invite_expires_at(self, name: str) -> str | None:
        """When the labeller's link stops working (ISO-8601 UTC); None if it never does."""
        with self._read() as con:
            lid = self._labeller_id(con, name)
            row = con.execute("SELECT invite_expires_at FROM labellers WHERE labeller_id = ?", (lid,)).fetchone()
        return None if row[0] is None else str(row[0])

    def sign_in(self, token: str) -> tuple[str, str] | None:
        """Open a browser session with a live invitation token: (display name, session id), or
        None. The session id (the cookie) is a new secret, not the link's, stored as its
        SHA-256, and ends with the link (expiry, a new invitation, revoke)."""
        session, now = new_invite_token(), self.clock()
        with self._tx() as con:
            row = self._invited(con, token)
            if row is None:
                return None
            expires = row["invite_expires_at"] or iso(now + MAX_INVITE_SECONDS)
            con.execute("INSERT INTO sessions VALUES (?, ?, ?, ?)",
                        (token_digest(session), row["labeller_id"], iso(now), expires))
            con.execute("DELETE FROM sessions WHERE expires_at <= ?", (iso(now),))
            con.execute("DELETE FROM sessions WHERE labeller_id = ? AND rowid NOT IN (SELECT rowid FROM sessions "
                        "WHERE labeller_id = ? ORDER BY rowid DESC LIMIT ?)",
                        (row["labeller_id"], row["labeller_id"], MAX_SESSIONS))
        return str(row["name"]), session

    def session_labeller(self, session: str) -> str | None:
        """The display name of the labeller a live session id belongs to, or None."""
        digest = token_digest(session)
        if digest is None:
            return None
        with self._read() as con:
            row = con.execute(
                "SELECT l.name FROM sessions s JOIN labellers l USING (labeller_id) "
                "WHERE s.session_hash = ? AND s.expires_at > ?", (digest, iso(self.clock())),
            ).fetchone()
        return None if row is None else str(row[0])
