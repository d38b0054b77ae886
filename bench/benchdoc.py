"""Writing a benchmark's block into docs/benchmarks.md (shared by the bench scripts)."""

from __future__ import annotations

import atexit
import re
import shutil
import tempfile
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def scratch_dir() -> str:
    """A temporary folder for one benchmark run, deleted when the process exits (each PPO run
    writes a checkpoint of ~2 GB: left behind, a full bench fills the disk)."""
    path = tempfile.mkdtemp(prefix="rlhfkit-bench-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


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
