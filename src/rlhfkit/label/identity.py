"""Labeller identities: one normalised key per person, and invitation tokens.

A name is compared by its **key**: Unicode NFKC, case-folded, NFKC again (Unicode's
"NFKC_Casefold" caseless match) with runs of spaces collapsed, so ``alice``, ``ALICE``,
``Alice `` and fullwidth ``ａｌｉｃｅ`` are one labeller. The first spelling registered is
kept as the display name.

An **invitation token** is a random secret (192 bits) handed to one labeller by
``rlhfkit label invite NAME``; the database keeps only its SHA-256, so a copy of the
database does not let anyone sign in.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import unicodedata

NAME_PUNCTUATION = frozenset(" ._-@'")
MAX_NAME_LENGTH = 40
INVITE_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")


def clean_name(raw: str) -> str:
    """The display form of a labeller name: NFKC, trimmed, inner spaces collapsed.

    Raises ValueError (one line) if the result is empty, longer than 40 characters or holds
    anything but letters, digits, spaces and ``. _ - @ '``.
    """
    name = " ".join(unicodedata.normalize("NFKC", raw).split())
    if not name:
        raise ValueError("labeller name is empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"labeller name is longer than {MAX_NAME_LENGTH} characters")
    if not all(ch.isalnum() or ch in NAME_PUNCTUATION for ch in name):
        raise ValueError("labeller name may contain letters, digits, spaces and . _ - @ ' only")
    return name


def name_key(name: str) -> str:
    """The identity a name stands for (no validation: unknown forms simply match nobody).

    >>> name_key("ALICE") == name_key(" alice ") == name_key("ａｌｉｃｅ") == "alice"
    True
    """
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold())
    return " ".join(folded.split())


def new_invite_token() -> str:
    """A fresh invitation token: 32 URL-safe characters (192 random bits)."""
    return secrets.token_urlsafe(24)


def token_digest(token: str) -> str | None:
    """SHA-256 (hex) of a well-formed token, as stored in the database; None if malformed."""
    if not INVITE_RE.fullmatch(token):
        return None
    return hashlib.sha256(token.encode("ascii")).hexdigest()
