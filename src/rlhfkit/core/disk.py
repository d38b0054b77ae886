"""Writing run files on a disk that may fill up: one line naming the path, nothing half-written.

`out_of_space(path, run_dir)` wraps a write: a full disk (ENOSPC/EDQUOT, or the errors torch and
safetensors raise after a short write while the disk has no space left) becomes DiskFull, one line:
"no space left on device writing PATH; free space, then --resume RUN". `append_text` appends
whole lines or nothing (a failed append is cut back), `write_atomic` replaces a file or leaves it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from rlhfkit.core.run_files import latest_checkpoint
from rlhfkit.errors import UserError

FULL_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
NEARLY_FULL = 1 << 20  # bytes free below which a failed write is put down to the disk


class DiskFull(UserError):
    """A run file could not be written for want of space."""


def is_disk_full(e: BaseException, path: Path) -> bool:
    """Whether error `e`, raised writing `path`, comes from a full disk: its errno says so, or the
    write failed (torch: "unexpected pos", safetensors: an I/O error) with under 1 MiB left."""
    if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
        return True
    if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
        return True
    folder = next((p for p in [Path(path), *Path(path).parents] if p.exists()), None)
    try:
        return folder is not None and shutil.disk_usage(folder).free < NEARLY_FULL
    except OSError:
        return False


def resume_advice(run_dir: Path | None) -> str:
    if run_dir is not None and latest_checkpoint(run_dir) is not None:
        return f"free space, then --resume {run_dir}"
    return "free space, then start the run again"


@contextlib.contextmanager
def out_of_space(path: Path, run_dir: Path | None) -> Iterator[None]:
    """Turn a full disk while writing `path` into DiskFull (one line); other errors pass."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        if not is_disk_full(e, path):
            raise
        raise DiskFull(f"no space left on device writing {path}; {resume_advice(run_dir)}") from None


def append_text(path: Path, text: str, run_dir: Path | None = None) -> None:
    """Append `text` (whole lines) to `path`, or nothing: a write that fails is cut back to the old end."""
    data = text.encode()
    with out_of_space(path, run_dir):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            end = os.fstat(fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            except OSError:
                os.ftruncate(fd, end)
                raise
        finally:
            os.close(fd)


def write_atomic(path: Path, text: str, run_dir: Path | None = None) -> None:
    """Replace `path` with `text` in one rename: the old file or the new one, never an empty one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with out_of_space(path, run_dir):
        try:
            tmp.write_text(text)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
