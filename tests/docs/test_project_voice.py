"""The repository speaks of the project, not of the team's work: no "issue N", "the session ended",
"(4x asked)" or "other engineers' jobs" in the docs, the README, the code or the benches (dates and
commits say when something happened). The labelling app's browser sessions are a feature, not process."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Each pattern names a way the team's process leaked into the text before.
PROCESS_WORDS = re.compile(
    r"\bissue\s*#?\d+|\bthe issue\b|\bthis issue\b|\b(?:this|next|last) session\b|\bthe session ended\b"
    r"|\bsession \d+|\(\d+x asked\)|\bother engineers\b|\bthe team's\b",
    re.IGNORECASE,
)
SCANNED = ["README.md", "docs", "src", "bench", "configs", "scripts"]
SUFFIXES = {".md", ".py", ".yaml", ".yml", ".sh", ".txt", ".html", ".js"}


def _files() -> list[Path]:
    out: list[Path] = []
    for name in SCANNED:
        path = ROOT / name
        out += [path] if path.is_file() else [p for p in sorted(path.rglob("*")) if p.suffix in SUFFIXES]
    return out


def test_scan_covers_the_docs_and_the_code():
    files = _files()
    assert any(p.name == "README.md" for p in files)
    assert sum(p.suffix == ".md" for p in files) >= 10 and sum(p.suffix == ".py" for p in files) >= 100


def test_no_process_words():
    hits = [f"{p.relative_to(ROOT)}:{i}: {m.group(0)!r}"
            for p in _files() for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            for m in [PROCESS_WORDS.search(line)] if m]
    assert not hits, "the team's process in the project's text:\n" + "\n".join(hits[:40])


def test_pattern_catches_the_old_wording():
    for text in ["The start is lower than the ~12% the issue", "(the session ended)", "3.39x (4x asked)",
                 "shared with other engineers' jobs", "fixed in issue 42"]:
        assert PROCESS_WORDS.search(text), text
    for text in ["a valid session gets 401", "SHA-256 of each session id", "the session ends with the link"]:
        assert not PROCESS_WORDS.search(text), text
