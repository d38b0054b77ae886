"""Which folders are run folders, the tree rule between them, and whether a run can write where it must.

A **run folder** is a folder that holds (`run_marker`, the one definition):
- `.lock` and `config.yaml`: every training run creates `.lock` first and writes its `config.yaml`
  as it opens; the `.lock` stays after the run ends;
- a `.lock` held by a live process (a run that is opening: its config.yaml is not there yet);
- `config.yaml` and `metrics.jsonl`: a run copied without its dotfiles, or made before locks.
A `.lock` alone is not enough (pytest's temporary folders hold one, as do other tools'), nor is a
`summary.json` (the pipeline writes one above its stages' run folders).

**The tree rule**: a run creates, overwrites or deletes nothing inside another run's folder (live or
finished), nor in a folder that holds one. Paths are compared resolved (`os.path.realpath`: symlinks
and `..` followed), so no spelling of a path gets round it. `tree_problem` says what breaks it.

**Writable up front**: `not_writable` says why a folder cannot be written by this process (a
read-only file system, or no permission), so a run can refuse before it trains rather than fail
at its first checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: folders are still refused and created atomically, but not locked
    fcntl = None  # type: ignore[assignment]

LOCK, CONFIG, METRICS = ".lock", "config.yaml", "metrics.jsonl"
APPENDED = (LOCK, METRICS, "samples.jsonl", "diagnostics.jsonl")  # files a resumed run opens to write


def real_path(path: str | Path) -> Path:
    """`path` with every symlink and `..` resolved (it need not exist)."""
    return Path(os.path.realpath(path))


def lock_is_held(path: Path) -> bool:
    """Whether a live process holds the lock of run folder `path` (a shared lock tried and released at
    once: it fails only against the owner's exclusive one)."""
    lock = path / LOCK
    if fcntl is None or not lock.is_file():
        return False
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:  # shared: two processes asking at once do not see each other as the owner
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the lock taken here
    return False


def run_marker(path: Path) -> str | None:
    """What makes folder `path` a run folder (see the module docstring), in words, or None."""
    try:
        lock, config = (path / LOCK).is_file(), (path / CONFIG).is_file()
        if lock and config:
            return f"{LOCK} and {CONFIG}"
        if config and (path / METRICS).is_file():
            return f"{CONFIG} and {METRICS}"
        return f"a {LOCK} held by a live process" if lock and lock_is_held(path) else None
    except OSError:  # unreadable: not known to be a run folder
        return None


def is_run_folder(path: Path) -> bool:
    return run_marker(path) is not None


def enclosing_run(real: Path) -> Path | None:
    """The innermost run folder strictly above resolved path `real`, or None."""
    return next((p for p in real.parents if is_run_folder(p)), None)


def nested_run(real: Path, limit: int = 10_000) -> Path | None:
    """A run folder strictly below resolved folder `real` (symlinks inside it are not followed), or None.
    The search stops after `limit` folders: a run folder's tree is far smaller, and a larger folder
    of other files is refused anyway before it could be cleared (it is not a run folder)."""
    seen = 0
    for top, dirs, _ in os.walk(real):
        for name in dirs:
            if is_run_folder(Path(top) / name):
                return Path(top) / name
        seen += len(dirs)
        if seen > limit:
            break
    return None


def tree_problem(real: Path, shown: Path | str) -> str | None:
    """Why a run may not write in the folder `real` (resolved; `shown` is how the user spelled it):
    it lies inside another run's folder, or holds one. None when the tree rule allows it."""
    outer = enclosing_run(real)
    if outer is not None:
        return (f"run folder {shown} is inside the run folder {outer} (it holds {run_marker(outer)}): a run never "
                "writes into another run's folder; choose an output_dir outside it")
    inner = nested_run(real) if real.is_dir() else None
    if inner is not None:
        return (f"run folder {shown} holds the run folder {inner} (it holds {run_marker(inner)}): a run never "
                "writes over another run's folder; choose another run_name or output_dir")
    return None


def not_writable(path: Path) -> str | None:
    """Why this process cannot write `path` (a folder: create and delete entries in it; a file:
    append to it): "read-only file system" or "no write permission for this user"; None if it can."""
    mode = os.R_OK | os.W_OK | (os.X_OK if path.is_dir() else 0)
    return None if os.access(path, mode) else _why(path)


def _why(path: Path) -> str:
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "read-only file system"
    except (OSError, AttributeError):  # no statvfs (not POSIX): say the general thing
        pass
    return "no write permission for this user"


def unwritable_in_tree(real: Path) -> tuple[Path, str] | None:
    """The first folder under `real` (itself included; symlinks not followed), or file a resumed
    run appends to (APPENDED), that this process cannot write, with why; None when all can be."""
    tops = [real / name for name in APPENDED if (real / name).is_file()]
    for path in [real, *tops]:
        if why := not_writable(path):
            return path, why
    for top, dirs, _ in os.walk(real):
        for name in dirs:
            sub = Path(top) / name
            if not sub.is_symlink() and (why := not_writable(sub)):
                return sub, why
    return None


def first_existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists (the folder a mkdir of `path` writes in)."""
    return next(p for p in [path, *path.parents] if os.path.lexists(p))


def shown_path(spelled: Path, real: Path) -> Path:
    """How a run folder is named to the user and to the run: `spelled` with `.`/`..` removed when that
    still names folder `real` (resolved), else `real` (a `..` after a symlink)."""
    norm = Path(os.path.normpath(spelled))
    return norm if real_path(norm) == real else real


def output_dir_problem(output_dir: str) -> str | None:
    """output_dir (or a folder above it) is a file."""
    place = first_existing(real_path(output_dir))
    if place.is_dir():
        return None
    if place == real_path(output_dir):
        return f"output_dir: {output_dir} is a file, not a folder"
    return f"output_dir: {output_dir} is below {place}, a file, not a folder; choose another output_dir"


def new_folder_problem(real: Path, shown: Path) -> str | None:
    """Why run folder `real` (resolved, not there yet) cannot be made: the tree rule, a file or a
    folder this process cannot write where it would be made."""
    place = first_existing(real)
    if not place.is_dir():
        return f"run_name: cannot create {shown}: {place} is a file, not a folder"
    why = not_writable(place)
    if why:
        return (f"output_dir: cannot create the run folder {shown}: {place} is not writable ({why}); choose a "
                "writable output_dir, or make it writable")
    return tree_problem(real, shown)
