"""Reading a run folder's checkpoints (runtime/checkpoint.py writes them): which step-N folders are
complete, which one a resume takes, and what makes one unusable.

A resume takes the newest checkpoint that passes `checkpoint_problem` (every file present with its
recorded size and sha256, the step in meta.json that of the folder name); a newer one that fails
is skipped with a notice naming the file (`resumable_checkpoint`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CHECKPOINTS = "checkpoints"
META, WEIGHTS, STATE, CONFIG = "meta.json", "trainable.safetensors", "state.pt", "config.yaml"


def step_of(path: Path) -> int | None:
    """N of a folder named step-N, else None."""
    name = path.name
    if not name.startswith("step-") or not name[5:].isdigit():
        return None
    return int(name[5:])


def is_complete(path: Path) -> bool:
    """A step-N folder whose meta.json exists and names files that all exist."""
    try:
        meta = json.loads((path / META).read_text())
    except (OSError, ValueError):
        return False
    return all((path / f).is_file() for f in meta.get("files", []))


def file_digest(path: Path) -> str:
    """sha256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checkpoint_problem(path: Path) -> str | None:
    """What makes checkpoint folder `path` unusable, naming the file, or None: meta.json unreadable,
    a file missing, of another size or sha256 than recorded, a step that is not the folder's."""
    try:
        meta = json.loads((path / META).read_text())
        files = meta["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{path / META} is unreadable ({type(e).__name__})"
    if meta.get("step") != step_of(path):
        return f"{path / META} says step {meta.get('step')}, the folder step-{step_of(path)}"
    sizes, digests = meta.get("sizes", {}), meta.get("sha256", {})
    for name in files:
        f = path / name
        if not f.is_file():
            return f"{f} is missing"
        if name in sizes and f.stat().st_size != sizes[name]:
            return f"{f} has {f.stat().st_size} bytes, {sizes[name]} were written (truncated or replaced)"
        if name in digests and file_digest(f) != digests[name]:
            return f"{f} does not match the sha256 recorded when it was written (changed or damaged)"
    return None


def resumable_checkpoint(run_dir: str | Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint of a run folder that passes `checkpoint_problem` (None: none does), and
    one notice per newer checkpoint skipped, naming what is wrong with it."""
    root = Path(run_dir) / CHECKPOINTS
    found = sorted(((step_of(p), p) for p in root.iterdir() if p.is_dir() and step_of(p) is not None),
                   reverse=True) if root.is_dir() else []
    notices = []
    for _, path in found:
        problem = checkpoint_problem(path)
        if problem is None:
            return path, [f"{n}; resuming from {path.name} instead" for n in notices]
        notices.append(f"[resume] skipping {path.name}: {problem}")
    return None, notices


def checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary and half-deleted folders are ignored)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(step_of(p), p) for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    return [p for _, p in sorted(found) if is_complete(p)]


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint folder was written after (its meta.json's, else its name's)."""
    try:
        step = json.loads((Path(path) / META).read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        step = None
    return step if isinstance(step, int) else (step_of(Path(path)) or 0)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest complete checkpoint of a run folder, or None."""
    found = checkpoints(run_dir)
    return found[-1] if found else None
