"""The page's stylesheet keeps the two responses in equal columns whatever their text (checked
in a real Chromium by test_label_browser.py when it is installed; this checks the rules)."""

from __future__ import annotations

import re
from pathlib import Path

import rlhfkit.label

CSS = (Path(rlhfkit.label.__file__).parent / "static" / "style.css").read_text(encoding="utf-8")


def _rule(selector: str) -> str:
    """The declarations of the first top-level rule for exactly ``selector``."""
    match = re.search(r"(?m)^" + re.escape(selector) + r"\s*\{([^}]*)\}", CSS)
    assert match, f"no rule for {selector}"
    return " ".join(match.group(1).split())


def test_response_columns_cannot_be_widened_by_their_text() -> None:
    """`1fr` columns grow to their content's min-content width: one unbreakable word (300
    combining marks on one letter) made one column 2893 px wide and pushed the other off-screen."""
    assert "grid-template-columns: repeat(2, minmax(0, 1fr))" in _rule(".responses")
    assert "min-width: 0" in _rule(".response")
    text = _rule(".text")
    assert "overflow: auto" in text and "min-width: 0" in text  # too wide: it scrolls inside its box
