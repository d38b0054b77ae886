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
# Unicode's Default_Ignorable_Code_Point (DerivedCoreProperties.txt, Unicode 15.1): characters
# a renderer shows as nothing. Most are format or mark characters that fail ``isalnum``
# anyway, but the Hangul fillers (U+115F, U+1160, U+3164, U+FFA0) are letters (Lo):
# "alice" + U+3164 looked like a second "alice", U+3164 alone like a blank name.
DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)
MAX_NAME_LENGTH = 40
INVITE_RE = re.compile(r"[A-Za-z0-9_-]{16,128}")


def is_default_ignorable(ch: str) -> bool:
    """True for a character Unicode says to render as nothing (``DEFAULT_IGNORABLE``)."""
    return any(low <= ord(ch) <= high for low, high in DEFAULT_IGNORABLE)


def printable(text: str) -> str:
    """``text`` with every character a terminal would act on or hide escaped (``\\x1b``,
    ``\\u202e``, ``\\u3164``): names in a supplied database are not trusted to be clean."""
    return "".join(ascii(ch)[1:-1] if not ch.isprintable() or is_default_ignorable(ch) else ch for ch in text)


def clean_name(raw: str) -> str:
    """The display form of a labeller name: NFKC, trimmed, inner spaces collapsed.

    Raises ValueError (one line) if the result is empty, longer than 40 characters or holds
    anything but letters, digits, spaces and ``. _ - @ '``, or an invisible character
    (``DEFAULT_IGNORABLE``, e.g. a Hangul filler).
    """
    name = " ".join(unicodedata.normalize("NFKC", raw).split())
    if not name:
        raise ValueError("labeller name is empty")
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(f"labeller name is longer than {MAX_NAME_LENGTH} characters")
    if not all(ch.isalnum() or ch in NAME_PUNCTUATION for ch in name):
        raise ValueError("labeller name may contain letters, digits, spaces and . _ - @ ' only")
    if any(is_default_ignorable(ch) for ch in name):
        raise ValueError("labeller name holds an invisible character (such as a Hangul filler)")
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
