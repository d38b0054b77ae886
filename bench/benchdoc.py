"""Writing a benchmark's block into docs/benchmarks.md (shared by the bench scripts)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def write_block(name: str, title: str, table: str, doc: Path = DOC) -> None:
    """Replace the text between `<!-- name:start -->` and `<!-- name:end -->` with `table`, or append
    a `## title` section holding it when the markers are not there yet."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{start}\n{table}\n{end}"
    if start in text and end in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip("\n") + f"\n\n## {title}\n\n{block}\n"
    doc.write_text(text)
