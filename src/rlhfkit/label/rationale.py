"""Reasons, per-criterion ratings and guidelines: their limits and checks (no database code).

- A **reason** is optional free text a labeller gives with a vote: at most ``MAX_REASON_CHARS``
  characters after stripping, no control characters but newline and tab.
- **Criteria** are named when the server starts (``serve --criteria helpfulness,honesty``):
  at most ``MAX_CRITERIA`` names of 1-32 characters, lower-case letters, digits, ``_`` and ``-``,
  starting with a letter, no repeats. A labeller may rate any of them on the same five-point
  scale as the vote (1 = left significantly better ... 5 = right significantly better); the
  store keeps each rating in the canonical frame (-2..+2, positive = response_a better).
- **Guidelines** are a Markdown file of at most ``MAX_GUIDELINES_BYTES`` bytes, UTF-8.
"""

from __future__ import annotations

import json
import re
import unicodedata
from pathlib import Path

from rlhfkit.errors import DataError

MAX_REASON_CHARS = 2000
MAX_CRITERIA = 8
MAX_GUIDELINES_BYTES = 64 * 1024
CRITERION_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
CRITERION_RULE = "1-32 lower-case letters, digits, _ or -, starting with a letter"


def parse_criteria(raw: str) -> tuple[str, ...]:
    """'helpfulness, honesty' -> ('helpfulness', 'honesty'); ValueError (one line) otherwise."""
    names = tuple(part.strip() for part in raw.split(",")) if raw.strip() else ()
    if not names:
        raise ValueError("give one or more criterion names separated by commas")
    if len(names) > MAX_CRITERIA:
        raise ValueError(f"at most {MAX_CRITERIA} criteria, got {len(names)}")
    for name in names:
        if not CRITERION_RE.fullmatch(name):
            raise ValueError(f"criterion {name[:40]!r}: expected {CRITERION_RULE}")
    if len(set(names)) != len(names):
        raise ValueError("a criterion is named twice")
    return names


def clean_reason(text: str) -> str:
    """The reason as stored: stripped, bounded, no control characters (ValueError otherwise)."""
    text = text.strip()
    if len(text) > MAX_REASON_CHARS:
        raise ValueError(f"at most {MAX_REASON_CHARS} characters, got {len(text)}")
    bad = next((c for c in text if c not in "\n\t" and unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        raise ValueError(f"control character U+{ord(bad):04X} not allowed")
    return text


def ratings_json(ratings: dict[str, int]) -> str:
    """Canonical ratings -> the text stored in ``votes.ratings`` (keys sorted)."""
    return json.dumps(dict(sorted(ratings.items())), separators=(",", ":"))


def parse_ratings(text: object) -> tuple[tuple[str, int], ...] | None:
    """``votes.ratings`` -> ((criterion, score), ...), or None if no rlhfkit could have written it."""
    try:
        data = json.loads(text) if isinstance(text, str) and len(text) <= 4096 else None
    except ValueError:
        return None
    if not isinstance(data, dict) or len(data) > MAX_CRITERIA:
        return None
    out = []
    for name, score in data.items():
        if not CRITERION_RE.fullmatch(name) or type(score) is not int or not -2 <= score <= 2:
            return None
        out.append((name, score))
    return tuple(sorted(out))


def read_guidelines(path: str | Path) -> str:
    """The guidelines file's text, or a one-line DataError naming the file."""
    p = Path(path)
    try:
        if not p.is_file():
            raise DataError(f"{path}: guidelines file not found (--guidelines needs a Markdown file)")
        size = p.stat().st_size
        if size > MAX_GUIDELINES_BYTES:
            raise DataError(f"{path}: guidelines file of {size} bytes; at most {MAX_GUIDELINES_BYTES}")
        data = p.read_bytes()[: MAX_GUIDELINES_BYTES + 1]
    except OSError as e:
        raise DataError(f"{path}: cannot read the guidelines file ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: guidelines file is not UTF-8 (byte {e.start})") from None
    if "\x00" in text:
        raise DataError(f"{path}: guidelines file holds a NUL byte; is it a text file?")
    return text
