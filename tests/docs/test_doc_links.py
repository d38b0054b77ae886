"""The documentation's links and row references resolve: every relative Markdown link in README.md
and docs/ points at a file of the repository (and, for a page, at one of its headings), and every
"performance-engineering.md row N" names a row of that page's table that holds the code name cited
just before the reference."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
ROW_REF = re.compile(r"performance-engineering\.md,?\s+row\s+(\d+)")
TABLE_ROW = re.compile(r"^\| (\d+) \|(.*)$", re.M)


def slug(heading: str) -> str:
    """The anchor a Markdown renderer gives a heading: lowercase, punctuation dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(page: Path, text: str) -> list[str]:
    """'PAGE:LINE: target' for every relative link in `text` (the text of `page`) that names no file
    of the repository, or no heading of the Markdown page it points at."""
    bad = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        ok = file.exists() and (file == ROOT or ROOT in file.parents)
        if ok and anchor and file.suffix == ".md":
            ok = anchor in {slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)}
        if not ok:
            bad.append(f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {target}")
    return bad


def test_every_relative_link_of_the_docs_resolves():
    bad = [b for page in PAGES for b in broken_links(page, page.read_text(encoding="utf-8"))]
    assert not bad, "links to nothing:\n" + "\n".join(bad)


def test_the_link_check_sees_a_missing_file_and_a_missing_heading():
    text = "[a](implementation-details.md) [b](nope.md) [c](performance-engineering.md#no-such-heading)"
    assert broken_links(ROOT / "docs" / "x.md", text) == [
        "docs/x.md:1: nope.md", "docs/x.md:1: performance-engineering.md#no-such-heading"]


def test_both_detail_pages_are_linked_from_each_other_the_readme_and_the_learning_path():
    details, perf = (ROOT / "docs" / "implementation-details.md"), (ROOT / "docs" / "performance-engineering.md")
    assert "](performance-engineering.md)" in details.read_text(encoding="utf-8")
    assert "](implementation-details.md)" in perf.read_text(encoding="utf-8")
    learn = (ROOT / "docs" / "learn" / "README.md").read_text(encoding="utf-8")
    assert "](../implementation-details.md)" in learn and "](../performance-engineering.md)" in learn
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "`docs/implementation-details.md`" in readme and "`docs/performance-engineering.md`" in readme


def test_every_row_reference_names_a_row_that_holds_the_cited_code():
    rows = {int(n): body for n, body in TABLE_ROW.findall(
        (ROOT / "docs" / "performance-engineering.md").read_text(encoding="utf-8"))}
    assert sorted(rows) == list(range(1, len(rows) + 1))
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in ROW_REF.finditer(text):
            n = int(m.group(1))
            start = text.rfind("\n", 0, text.rfind("\n", 0, m.start()))  # the line before, whole
            cited = re.findall(r"`([^`]+)`", text[start + 1:m.start()])
            where = f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
            assert n in rows, f"{where}: no row {n}"
            name = re.sub(r"\.py$", "", cited[-1]).split("/")[-1].split(".")[-1] if cited else ""  # trunk, head_logprobs
            assert name and name in rows[n], f"{where}: row {n} does not mention {name!r}"
            found.append(n)
    assert len(found) >= 4, found
