"""Who owns a run folder: one live run at a time, and a new run never writes into an old one.

A run folder OUTPUT_DIR/RUN_NAME belongs to the run that holds the exclusive lock on its `.lock`
file (fcntl.flock, released by the kernel when the process ends, even by kill -9). A training run:

- with a new `run_name` creates the folder and its `.lock` (O_EXCL: two runs started together
  with one name cannot both claim it); without `run_name` it takes COMMAND-DATE-TIME, with -2,
  -3, ... when that folder exists (two runs in the same second get two folders);
- with the name of an existing folder is refused, unless it continues it (`--resume RUN` /
  `resume=auto`) or replaces it (`overwrite=true`: its contents are deleted once the lock is held);
- `resume=auto` on a folder without a checkpoint starts afresh in it: the dead attempt's files
  are deleted (a finished run without checkpoints is refused instead: its results would be lost);
- is refused while another process holds the lock (`--resume` of a run that still runs);
- that fails before it logged a step leaves the folder as it found it: one it created is deleted,
  a resumed one is untouched (`RunFolder.close`); a run that fails after logging steps is kept,
  marked by RUN/failed.json (the error), to be read (doctor, report) or resumed.

`check_run_folder` runs the same refusals up front (before any model loads, nothing written);
`claim_run_folder` then takes the folder for real when the run opens.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from rlhfkit.core.run_files import CHECKPOINTS, META, latest_checkpoint, resumable_checkpoint
from rlhfkit.errors import UserError

LOCK, FAILED = ".lock", "failed.json"

try:
    import fcntl
except ImportError:  # not POSIX: folders are still refused and created atomically, but not locked
    fcntl = None  # type: ignore[assignment]


def run_name_problem(run_name: str | None) -> str | None:
    """Why `run_name` cannot name a folder inside output_dir, or None."""
    if run_name is None:
        return None
    if not run_name.strip():
        return f"run_name ({run_name!r}) must not be empty"
    path = Path(run_name)
    if path.is_absolute() or ".." in path.parts:
        return f"run_name ({run_name}) must be a folder name inside output_dir (no absolute path, no '..')"
    return None


def _in_use_message(path: Path, lock: Path) -> str:
    try:
        pid = lock.read_text().strip()
    except OSError:
        pid = ""
    who = f" (pid {pid})" if pid.isdigit() else ""
    return (f"run folder {path} is in use by a running rlhfkit process{who}: wait for it to finish or stop it "
            "(SIGINT/SIGTERM) first")


def _existing_message(path: Path) -> str:
    return (f"run folder {path} already exists: continue it with --resume {path} (or resume=auto), choose "
            "another run_name, or replace it with overwrite=true")


def _has_content(path: Path) -> bool:
    return any(p.name != LOCK for p in path.iterdir())


def _is_finished(path: Path) -> bool:
    return (path / "summary.json").is_file()


def _not_a_folder(path: Path, what: str) -> str | None:
    """The message when `path` exists but is not a folder (a file where a folder must be)."""
    if path.exists() and not path.is_dir():
        return f"{what}: {path} is a file, not a folder"
    return None


def lock_is_held(path: Path) -> bool:
    """Whether a live process holds the run folder's lock (tried and released at once)."""
    lock = path / LOCK
    if fcntl is None or not lock.is_file():
        return False
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the lock taken here
    return False


class FolderOptions(Protocol):
    """What the run folder reads of a config: trainers/options.RunArgs, and the model a resumed run
    must keep (ModelArgs.model; None where a config trains no named model)."""

    output_dir: str
    run_name: str | None
    resume: str | None
    overwrite: bool
    model: str | None


def target_folder(cfg: FolderOptions) -> Path | None:
    """The folder this configuration runs in: the resumed one, else output_dir/run_name (None: a
    default COMMAND-DATE-TIME name, chosen when the run opens)."""
    resume = cfg.resume
    if resume not in (None, "", "auto"):
        return Path(resume)
    return Path(cfg.output_dir) / cfg.run_name if cfg.run_name else None


def check_run_folder(cfg: FolderOptions) -> None:
    """Every refusal `claim_run_folder` would make, without writing anything: run before the model
    loads, so a run that cannot have its folder stops at once. A one-line UserError."""
    problem = run_name_problem(cfg.run_name) or _not_a_folder(Path(cfg.output_dir), "output_dir")
    if problem:
        raise UserError(problem)
    path, resume = target_folder(cfg), cfg.resume
    if path is None or not path.exists():
        if resume not in (None, "", "auto"):
            raise UserError(f"resume: {path} is not a run folder")
        return
    problem = _not_a_folder(path, "resume" if resume not in (None, "", "auto") else "run_name")
    if problem:
        raise UserError(problem)
    if lock_is_held(path):
        raise UserError(_in_use_message(path, path / LOCK))
    if resume not in (None, "", "auto"):
        if latest_checkpoint(path) is None:
            raise UserError(no_checkpoint_message(path))
        _check_same_model(cfg, latest_checkpoint(path))
    elif resume == "auto":
        if latest_checkpoint(path) is not None:
            _check_same_model(cfg, latest_checkpoint(path))
        if latest_checkpoint(path) is None and _is_finished(path):
            raise UserError(f"resume=auto: {path} is a finished run without checkpoints (save_every=0); choose "
                            "another run_name, or replace it with overwrite=true")
    elif not cfg.overwrite and _has_content(path):
        raise UserError(_existing_message(path))


def _same_model(a: str, b: str) -> bool:
    """Two model specs that name one model (the same text, or two spellings of one folder)."""
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


def _check_same_model(cfg: FolderOptions, checkpoint: Path) -> None:
    """A resumed run keeps its model: its weights, optimiser state and before-training evaluation
    belong to it. Another `model=` is refused (one line) rather than half applied."""
    import yaml

    try:
        saved = yaml.safe_load((checkpoint / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return
    old, new = saved.get("model") if isinstance(saved, dict) else None, cfg.model
    if isinstance(old, str) and isinstance(new, str) and not _same_model(old, new):
        raise UserError(f"resume: model={new}, but {checkpoint.parent.parent} trains {old}: a run continues with "
                        "its own model; leave model out to resume, or start a new run (another run_name) for "
                        "the other model")


def no_checkpoint_message(path: Path, notices: list[str] = ()) -> str:
    if notices:  # checkpoints there, none usable: say why the oldest is not
        return f"resume: {path} has no usable checkpoint: {notices[-1].removeprefix('[resume] skipping ')}"
    return (f"resume: {path} has no complete checkpoint ({CHECKPOINTS}/step-N with {META}); checkpoints are "
            "written every save_every iterations and when a run is stopped")


@dataclass
class RunFolder:
    """A claimed run folder: `path`, the checkpoint to resume from (or None), and the lock."""

    path: Path
    resume_from: Path | None = None
    created: list[Path] = field(default_factory=list)  # folders this run made (removed if it fails early)
    notices: list[str] = field(default_factory=list)  # newer checkpoints skipped as damaged, and why
    fd: int | None = None

    def release(self) -> None:
        """Drop the lock (the `.lock` file stays: it marks the folder as a run's)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def close(self, error: BaseException | None = None, logged: bool = False) -> None:
        """Release the folder. After an `error`: a run that `logged` no step leaves the folder as
        it found it (a folder it created is deleted, with the parents it made); one that logged
        steps is kept for diagnosis and marked: RUN/failed.json holds the error."""
        self.release()
        if error is None:
            return
        if logged:
            from rlhfkit.errors import one_line

            with contextlib.suppress(OSError):  # a full disk may be the error
                (self.path / FAILED).write_text(json.dumps({"error": one_line(error), "type": type(error).__name__,
                                                            "time": time.time()}, indent=2))
        elif self.created:
            shutil.rmtree(self.path, ignore_errors=True)
            for parent in self.created[1:]:
                try:
                    parent.rmdir()  # only when empty: another run may have started in it since
                except OSError:
                    break


def _lock(path: Path, fresh: bool) -> int:
    """Open and lock RUN/.lock; `fresh`: the lock file must not exist yet (a new folder). Returns
    the descriptor; UserError when the folder is someone else's."""
    lock = path / LOCK
    flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if fresh else 0)
    try:
        fd = os.open(lock, flags, 0o644)
    except FileExistsError:
        raise UserError(_in_use_message(path, lock) if lock_is_held(path) else _existing_message(path)) from None
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise UserError(_in_use_message(path, lock)) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _make_folder(path: Path) -> list[Path] | None:
    """mkdir `path` and its missing parents; the folders made, innermost first, or None when
    `path` already existed."""
    missing = [p for p in [path, *path.parents] if not p.exists()]
    for p in reversed(missing[1:]):
        p.mkdir(exist_ok=True)
    try:
        path.mkdir()
    except FileExistsError:
        return None
    return missing


def _clear(path: Path) -> None:
    """Delete everything in a run folder but its lock."""
    for p in path.iterdir():
        if p.name == LOCK:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _default_folder(output_dir: Path, command: str) -> tuple[Path, list[Path]]:
    """A new COMMAND-DATE-TIME folder (with -2, -3, ... when that name is taken)."""
    stem = f"{command}-{time.strftime('%Y%m%d-%H%M%S')}"
    for i in range(1, 10_000):
        path = output_dir / (stem if i == 1 else f"{stem}-{i}")
        made = _make_folder(path)
        if made is not None:
            return path, made
    raise UserError(f"output_dir: {output_dir} has no free run folder name for {stem}")


def claim_run_folder(cfg: FolderOptions, command: str) -> RunFolder:
    """Take the run folder of `cfg` (see the module docstring), locked for this process."""
    check_run_folder(cfg)
    resume = cfg.resume
    if resume not in (None, "", "auto"):
        path = Path(resume)
        folder = RunFolder(path, fd=_lock(path, fresh=False))
        folder.resume_from, folder.notices = resumable_checkpoint(path)
        if folder.resume_from is None:
            folder.release()
            raise UserError(no_checkpoint_message(path, folder.notices))
        return folder
    if not cfg.run_name:
        path, made = _default_folder(Path(cfg.output_dir), command)
        return RunFolder(path, created=made, fd=_lock(path, fresh=True))
    path = Path(cfg.output_dir) / cfg.run_name
    made = _make_folder(path)
    if made is not None:
        return RunFolder(path, created=made, fd=_lock(path, fresh=True))
    if resume != "auto" and not cfg.overwrite:
        if any(path.iterdir()):  # filled since the check
            raise UserError(_existing_message(path))
        return RunFolder(path, fd=_lock(path, fresh=True))
    folder = RunFolder(path, fd=_lock(path, fresh=False))
    if resume == "auto":
        folder.resume_from, folder.notices = resumable_checkpoint(path)
        if folder.resume_from is None and folder.notices:  # damaged checkpoints are not a dead attempt
            folder.release()
            raise UserError(no_checkpoint_message(path, folder.notices))
    if folder.resume_from is None:  # overwrite, or resume=auto with nothing to continue: start afresh
        _clear(path)
        folder.created = [path]
    return folder

