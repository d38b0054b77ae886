"""The repository speaks of the project: a change is named by its feature, date or commit, never by the
number of a work item of the team that built it (a reader of the code, docs or benches cannot follow
such a number). Product words stay: a labelling session, a session id or cookie (`label_session_8000`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOTS = ("README.md", "pyproject.toml", "constraints.txt", ".ci", "bench", "configs", "docs", "scripts", "src",
         "tests")
SKIPPED_DIRS = ("__pycache__", ".pytest_cache", ".hypothesis")
# "<word> 14", "<word>-14", "<word> #14" for the two words; assembled from parts so this file does not match.
WORK_ITEM = re.compile(r"\b(?:[Ss]ession|[Ii]ssue)s?[- ]#?\d+\b")
# The team's process in other words: a work item named without its number as the reason for a figure,
# a working period that ended, a target someone set ("(4x" then "asked)"), other people's jobs on the machine.
PROCESS = re.compile("|".join([r"\b(?:the|this) " + "iss" + r"ue\b", r"\b(?:this|next|last) " + "sess" + r"ion\b",
                               r"\bthe " + "sess" + r"ion ended\b", r"\(\d+x " + "ask" + r"ed\)",
                               r"\bother " + "engin" + r"eers\b"]))


def text_files(root: Path) -> list[Path]:
    """The text files under the repository's own roots (no virtual environments, caches or build output)."""
    files = []
    for name in ROOTS:
        top = root / name
        for path in [top] if top.is_file() else sorted(top.rglob("*")):
            if path.is_file() and not any(part in SKIPPED_DIRS or part.endswith(".egg-info")
                                          for part in path.relative_to(root).parts):
                files.append(path)
    return files


def work_item_lines(root: Path) -> list[str]:
    """`file:line: text` for every line of a text file under `root` that names a work item by number."""
    found = []
    for path in text_files(root):
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            if WORK_ITEM.search(line) or PROCESS.search(line):
                found.append(f"{path.relative_to(root)}:{n}: {line.strip()[:100]}")
    return found


def test_no_file_names_a_work_item_by_number():
    offenders = work_item_lines(ROOT)
    assert not offenders, "name the feature, date or commit instead:\n" + "\n".join(offenders)


def test_the_pattern_sees_work_items_and_leaves_product_words():
    number = "14"
    for flagged in ("session " + number, "Session " + number, "the session-" + number + " code",
                    "issue " + number, "Issue #" + number, "issues " + number):
        assert WORK_ITEM.search(flagged), flagged
    for kept in ("a labelling session", "the session id", "session cookie", "label_session_8000",
                 "without a valid session gets 401", "issue a new link"):
        assert not WORK_ITEM.search(kept), kept


def test_the_pattern_sees_the_process_in_other_words():
    for flagged in ("lower than the ~12% the " + "issue", "(the " + "session ended)", "3.39x (4x " + "asked)",
                    "shared with other " + "engineers' jobs", "as this " + "issue asks"):
        assert PROCESS.search(flagged), flagged
    for kept in ("the session ends with the link", "a valid session gets 401", "issue a new link",
                 "we issue tokens"):
        assert not PROCESS.search(kept), kept


def test_the_scan_names_file_and_line(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("fine\nmeasured in sess" + "ion 3\n", encoding="utf-8")
    (tmp_path / "src" / "pkg" / "__pycache__").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "__pycache__" / "m.txt").write_text("iss" + "ue 5", encoding="utf-8")
    (tmp_path / "src" / "pkg" / "blob.bin").write_bytes(b"\0iss" + b"ue 5")
    assert work_item_lines(tmp_path) == ["docs/a.md:2: measured in sess" + "ion 3"]
