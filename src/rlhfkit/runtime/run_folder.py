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
  marked by RUN/failed.json (the error), to be read (doctor, report) or resumed;
- never writes inside another run's folder, nor in a folder that holds one (core/run_tree.py: the
  paths resolved, so no spelling gets round it). The check is made again once the lock is taken:
  of two runs started together on nested paths, each has its `.lock` before it looks for the
  other's, so at most one goes on;
- deletes only in run folders (`overwrite=true` and `resume=auto` refuse a folder of other files),
  and refuses up front a folder it could not write (read-only, no permission).

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
from rlhfkit.core.run_tree import (
    LOCK,
    is_run_folder,
    lock_is_held,
    new_folder_problem,
    output_dir_problem,
    real_path,
    shown_path,
    tree_problem,
    unwritable_in_tree,
)
from rlhfkit.errors import UserError, one_line

try:
    import fcntl
except ImportError:  # not POSIX: folders are still refused and created atomically, but not locked
    fcntl = None  # type: ignore[assignment]

FAILED = "failed.json"



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


class FolderOptions(Protocol):
    """What the run folder reads of a config: trainers/options.RunArgs, and the model a resumed run
    must keep (ModelArgs.model; None where a config trains no named model)."""

    output_dir: str
    run_name: str | None
    resume: str | None
    overwrite: bool
    model: str | None


def _resuming(cfg: FolderOptions) -> bool:
    """`--resume RUN` (not resume=auto)."""
    return cfg.resume not in (None, "", "auto")


def target_folder(cfg: FolderOptions) -> Path | None:
    """The folder this configuration runs in: the resumed one, else output_dir/run_name (None: a
    default COMMAND-DATE-TIME name, chosen when the run opens)."""
    if _resuming(cfg):
        return Path(cfg.resume)
    return Path(cfg.output_dir) / cfg.run_name if cfg.run_name else None


def _unwritable_problem(real: Path, shown: Path, cfg: FolderOptions) -> str | None:
    """An existing run folder this run would write or clear, with a folder (or log) it cannot write."""
    found = unwritable_in_tree(real)
    if found is None:
        return None
    where, why = found
    if _resuming(cfg) or cfg.resume == "auto":
        return (f"resume: {where} is not writable ({why}): a resumed run writes its checkpoints and logs in "
                f"{shown}; make it writable, or copy the run folder somewhere writable and resume the copy")
    return (f"run folder {shown}: {where} is not writable ({why}); make it writable, or choose another run_name "
            "or output_dir")


def _not_a_run_message(path: Path, why: str) -> str:
    return (f"{why}: {path} holds files but is not a run folder (no .lock with config.yaml): rlhfkit deletes "
            "only in run folders; choose another run_name, or empty the folder yourself")


def check_run_folder(cfg: FolderOptions) -> None:
    """Every refusal `claim_run_folder` would make, without writing anything: run before the model
    loads, so a run that cannot have its folder stops at once. A one-line UserError."""
    problem = run_name_problem(cfg.run_name) or output_dir_problem(cfg.output_dir)
    if problem:
        raise UserError(problem)
    path = target_folder(cfg)
    if path is None:  # a new COMMAND-DATE-TIME folder inside output_dir
        problem = new_folder_problem(real_path(cfg.output_dir) / "new-run", Path(cfg.output_dir) / "COMMAND-DATE")
    else:
        problem = _existing_folder_problem(cfg, path, real_path(path))
    if problem:
        raise UserError(problem)


def _existing_folder_problem(cfg: FolderOptions, path: Path, real: Path) -> str | None:
    """check_run_folder for a named folder (run_name or --resume): `path` as given, `real` resolved."""
    resume = cfg.resume
    if not os.path.lexists(real):
        return f"resume: {path} is not a run folder" if _resuming(cfg) else new_folder_problem(real, path)
    if not real.is_dir():
        return f"{'resume' if _resuming(cfg) else 'run_name'}: {path} is a file, not a folder"
    if lock_is_held(real):
        return _in_use_message(path, real / LOCK)
    problem = tree_problem(real, path)
    if problem:
        return problem
    if _resuming(cfg):
        if latest_checkpoint(real) is None:
            return no_checkpoint_message(path)
        _check_same_model(cfg, latest_checkpoint(real))
    elif resume == "auto":
        if latest_checkpoint(real) is not None:
            _check_same_model(cfg, latest_checkpoint(real))
        elif _is_finished(real):
            return (f"resume=auto: {path} is a finished run without checkpoints (save_every=0); choose "
                    "another run_name, or replace it with overwrite=true")
        elif _has_content(real) and not is_run_folder(real):
            return _not_a_run_message(path, "resume=auto")
    elif _has_content(real) and not cfg.overwrite:
        return _existing_message(path)
    elif _has_content(real) and not is_run_folder(real):
        return _not_a_run_message(path, "overwrite=true")
    return _unwritable_problem(real, path, cfg)


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
            with contextlib.suppress(OSError):  # a full disk may be the error
                (self.path / FAILED).write_text(json.dumps({"error": one_line(error), "type": type(error).__name__,
                                                            "time": time.time()}, indent=2))
        elif self.created:
            shutil.rmtree(self.created[0], ignore_errors=True)  # the resolved folder (self.path may be a symlink)
            for parent in self.created[1:]:
                try:
                    parent.rmdir()  # only when empty: another run may have started in it since
                except OSError:
                    break


def _lock(path: Path, fresh: bool, shown: Path) -> int:
    """Open and lock `path`/.lock (`path` resolved, `shown` as the user names it); `fresh`: the lock
    file must not exist yet (a new folder). Returns the descriptor; UserError when the folder is
    someone else's or cannot be written."""
    lock = path / LOCK
    flags = os.O_RDWR | os.O_CREAT | (os.O_EXCL if fresh else 0)
    try:
        fd = os.open(lock, flags, 0o644)
    except FileExistsError:
        raise UserError(_in_use_message(shown, lock) if lock_is_held(path) else _existing_message(shown)) from None
    except OSError as e:  # read-only, no permission: check_run_folder says so first where it can
        raise UserError(f"run folder {shown}: cannot open {lock} for writing ({e.strerror}); make the folder "
                        "writable, or choose another run_name or output_dir") from None
    if fcntl is not None and not _flock(fd, fresh):
        os.close(fd)
        raise UserError(_in_use_message(shown, lock)) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _flock(fd: int, fresh: bool) -> bool:
    """Take the exclusive lock on `fd`. A fresh lock file (made with O_EXCL) can only be held for a
    moment by a process that checks whether it is held (run_tree.lock_is_held): wait for it. An
    existing one is tried a few times, then taken to be a live run's."""
    for attempt in range(1 if fresh else 5):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if fresh else fcntl.LOCK_NB))
            return True
        except OSError:
            time.sleep(0.02 * (attempt + 1))
    return False


def _make_folder(path: Path) -> list[Path] | None:
    """mkdir `path` (resolved) and its missing parents; the folders made, innermost first, or None
    when `path` already existed. UserError when a folder cannot be made (read-only, a file)."""
    missing = [p for p in [path, *path.parents] if not p.exists()]
    try:
        for p in reversed(missing[1:]):
            p.mkdir(exist_ok=True)
        path.mkdir()
    except FileExistsError:
        return None
    except OSError as e:
        raise UserError(f"output_dir: cannot create the run folder {path} ({e.strerror}); choose a writable "
                        "output_dir") from None
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


def _take(real: Path, shown: Path, fresh: bool, created: list[Path] = ()) -> RunFolder:
    """Lock folder `real`, then check the tree rule again: a run started at the same time on a
    nested path has its `.lock` by now, or will see ours. A refused claim undoes itself (its lock
    file when new, the folders it made when empty)."""
    folder = RunFolder(shown, created=list(created), fd=_lock(real, fresh, shown))
    problem = tree_problem(real, shown)
    if problem:
        if fresh:
            with contextlib.suppress(OSError):
                (real / LOCK).unlink()
        folder.release()
        for made in folder.created:
            try:
                made.rmdir()  # only when empty
            except OSError:
                break
        raise UserError(problem)
    return folder


def claim_run_folder(cfg: FolderOptions, command: str) -> RunFolder:
    """Take the run folder of `cfg` (see the module docstring), locked for this process. Every path
    is resolved first: the lock, the tree rule and every write go to the folder itself."""
    check_run_folder(cfg)
    if _resuming(cfg):
        real = real_path(cfg.resume)
        folder = _take(real, shown_path(Path(cfg.resume), real), fresh=False)
        folder.resume_from, folder.notices = resumable_checkpoint(folder.path)
        if folder.resume_from is None:
            folder.release()
            raise UserError(no_checkpoint_message(folder.path, folder.notices))
        return folder
    if not cfg.run_name:
        real, made = _default_folder(real_path(cfg.output_dir), command)
        return _take(real, shown_path(Path(cfg.output_dir) / real.name, real), fresh=True, created=made)
    real = real_path(Path(cfg.output_dir) / cfg.run_name)
    shown = shown_path(Path(cfg.output_dir) / cfg.run_name, real)
    made = _make_folder(real)
    if made is not None:
        return _take(real, shown, fresh=True, created=made)
    if cfg.resume != "auto" and not cfg.overwrite:
        if any(real.iterdir()):  # filled since the check
            raise UserError(_existing_message(shown))
        return _take(real, shown, fresh=True)
    folder = _take(real, shown, fresh=False)
    if cfg.resume == "auto":
        folder.resume_from, folder.notices = resumable_checkpoint(shown)
        if folder.resume_from is None and folder.notices:  # damaged checkpoints are not a dead attempt
            folder.release()
            raise UserError(no_checkpoint_message(shown, folder.notices))
    if folder.resume_from is None:  # overwrite, or resume=auto with nothing to continue: start afresh
        _clear(real)
        folder.created = [real]
    return folder
