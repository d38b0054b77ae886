"""Safe output files for ``label pairs`` and ``label export``.

- ``check_output``: refuse an empty path, a directory, any input of the command (the
  database with its ``-wal``/``-shm``/``-journal`` files under the name given and under the
  resolved name, the pairs file), any SQLite database or side file of one (even with
  ``--force``) and, without ``--force``, an existing file; every refusal is one line naming
  the option.
- ``write_lines_atomic``: write into a uniquely named temporary file in the target folder
  (``mkstemp``: ``O_CREAT | O_EXCL | O_NOFOLLOW``, so a planted symlink is never followed),
  fsync it and rename it over the target. The rename replaces a symlink at the target
  itself, never the file it points to; a failure leaves the old file and no temporary. The
  file keeps ``mkstemp``'s mode, 0600: exports and pairs files hold prompts, answers and
  labeller names, which other users of the machine have no business reading.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from rlhfkit.errors import UserError

SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")
SQLITE_HEADER = b"SQLite format 3\x00"


def database_files(db: Path) -> list[Path]:
    """The database and the files SQLite keeps next to it, named after the path as given and
    after the resolved path: SQLite names the side files of a symlinked database after its
    target (``link.sqlite -> real.sqlite`` writes ``real.sqlite-wal``)."""
    names = dict.fromkeys([db, db.resolve()])
    return [name.with_name(name.name + suffix) for name in names for suffix in ("", *SQLITE_SIDE_FILES)]


def _is_sqlite(path: Path) -> bool:
    """True if ``path`` is a regular file that starts with SQLite's header (symlinks followed).

    Opened with ``O_NONBLOCK`` and checked with ``fstat`` before reading: a FIFO or a terminal
    is never read (reading one used to block ``export`` forever)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return False
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode) and os.read(fd, len(SQLITE_HEADER)) == SQLITE_HEADER
    except OSError:
        return False
    finally:
        os.close(fd)


SYSTEM_TREES = (Path("/dev"), Path("/proc"), Path("/sys"))


def _special_kind(path: Path) -> str | None:
    """Why ``path`` may not be an output file, or None: it lies in /dev, /proc or /sys (as
    given or resolved), or it exists and is (or links to) anything but a regular file."""
    for name in dict.fromkeys([Path(os.path.abspath(path)), path.resolve()]):
        if any(name == tree or tree in name.parents for tree in SYSTEM_TREES):
            return f"is in {next(t for t in SYSTEM_TREES if name == t or t in name.parents)}"
    try:
        mode = path.stat().st_mode  # follows symlinks: a link to /dev/null is a device
    except OSError:
        return None  # a new name (or a dangling symlink, which the rename replaces)
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"))
    for test, kind in kinds:
        if test(mode):
            return f"is {kind}"
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else "is not a regular file"


def sqlite_database_of(path: Path) -> Path | None:
    """The SQLite database that ``path`` is, or whose ``-wal``/``-shm``/``-journal`` file it is
    (looked up under the path as given and resolved); None for anything else."""
    for name in dict.fromkeys([path, path.resolve()]):
        if _is_sqlite(name):
            return name
        for suffix in SQLITE_SIDE_FILES:
            if name.name.endswith(suffix) and _is_sqlite(base := name.with_name(name.name[: -len(suffix)])):
                return base
    return None


def looks_like_pairs_file(path: Path) -> bool:
    """True if ``path`` is a regular file whose first line is a pairs-file record (a JSON object
    with ``response_a`` and ``response_b``; preference rows have ``chosen``/``rejected``)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        with os.fdopen(os.dup(fd), "rb") as f:
            first = f.readline(1 << 20)
        obj = json.loads(first.decode("utf-8-sig"))
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)
    return isinstance(obj, dict) and "response_a" in obj and "response_b" in obj


def same_file(a: Path, b: Path) -> bool:
    """True if both paths name one file (symlinks resolved, hard links compared by inode)."""
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def check_output(raw: str, force: bool, inputs: Sequence[tuple[str, Path]], option: str = "--out") -> Path:
    """Validate an output path; ``inputs`` are (what, path) pairs the command reads."""
    if not raw.strip():
        raise UserError(f"{option}: empty path; give a file name")
    path = Path(raw)
    if (why := _special_kind(path)) is not None:
        raise UserError(f"{option} {raw} {why}; give a regular file or a new name")
    if path.is_dir() or raw.endswith(("/", os.sep)):
        raise UserError(f"{option} {raw}: is a directory; give a file name")
    for what, src in inputs:
        if same_file(path, src):
            raise UserError(f"{option} {raw} is the {what} ({src}); writing it would destroy it, choose another file")
    if (db := sqlite_database_of(path)) is not None:
        role = "an SQLite database" if same_file(path, db) else f"a file of the SQLite database {db}"
        raise UserError(f"{option} {raw} is {role}; writing it would destroy it, even with --force: "
                        "choose another file")
    if (path.exists() or path.is_symlink()) and not force:
        raise UserError(f"{raw} exists; pass --force to overwrite it")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"{option} {raw}: {parent} is not a directory")
            break
    return path


def write_lines_atomic(path: Path, lines: Iterable[str]) -> int:
    """Write ``lines`` (each gets a newline) to ``path`` atomically; returns the line count."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise UserError(f"{path}: cannot write ({e.strerror or e})") from None
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:  # 0600: prompts, answers, names
            for line in lines:
                f.write(line + "\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise UserError(f"{path}: cannot write ({e.strerror or e})") from None
        raise
    return n
