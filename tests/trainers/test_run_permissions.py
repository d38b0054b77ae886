"""Places a run cannot write are refused up front, one line, exit 2, nothing changed (runtime/run_folder.py,
core/run_tree.py): a read-only output_dir for a new run, a read-only run folder on --resume or with
overwrite=true, a read-only checkpoints/ on --resume (before a step trains, not at its first checkpoint),
an output_dir below a file, and a read-only mount. Permission bits bind only a non-root user (root ignores
them): as root these tests run the command as user nobody (setpriv); a read-only mount is made with
bubblewrap. Each is skipped, saying why, where that cannot be done."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from test_faults import sft_argv
from test_resume import make_cfg, read_jsonl
from test_run_tree import tree

NOBODY = 65534
SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def _works(prefix: list[str]) -> bool:
    try:
        return subprocess.run([*prefix, sys.executable, "-c", "import rlhfkit"], capture_output=True,
                              timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="module")
def unprivileged() -> list[str]:
    """The prefix that runs a command as a user bound by permission bits ([] when not root)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None or not _works(SETPRIV):
        pytest.skip("running as root without a working `setpriv --reuid` to become an unprivileged user")
    return SETPRIV


@pytest.fixture()
def shared(tmp_path, tiny_model_dir):
    """A folder the unprivileged user can use (pytest's own are root's, mode 0700), with the tiny model,
    and a finished run RUNS/done with checkpoints, all owned by that user. Restored and removed after."""
    root = Path(tempfile.mkdtemp(prefix="rlhfkit-perm-"))
    try:
        os.chmod(root, 0o755)
        shutil.copytree(tiny_model_dir, root / "model")
        from rlhfkit.trainers.sft import train

        train(make_cfg("sft", root, root / "model", "done", max_steps=2, save_every=1))
        if os.geteuid() == 0:
            for top, dirs, files in os.walk(root):
                for name in [".", *dirs, *files]:
                    os.chown(Path(top) / name, NOBODY, NOBODY)
        yield root
    finally:
        for top, dirs, _ in os.walk(root):
            for name in dirs:
                os.chmod(Path(top) / name, 0o755)
        shutil.rmtree(root, ignore_errors=True)


def _run(prefix: list[str], argv: list[str], home: Path) -> subprocess.Popen:
    env = {**os.environ, "HOME": str(home), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen([*prefix, sys.executable, "-m", "rlhfkit.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _one_line_refusals(prefix, cases, home: Path) -> list[str]:
    """Start every case (argv, expected words) together; the ones that were not exit 2 with one line."""
    procs = [(words, _run(prefix, argv, home)) for argv, words in cases]
    failures = []
    for words, proc in procs:
        _, err = proc.communicate(timeout=300)
        if proc.returncode != 2 or len(err.strip().splitlines()) != 1 or words not in err:
            failures.append(f"expected {words!r}: rc {proc.returncode}: {err[-800:]}")
    return failures


@pytest.mark.slow
def test_unwritable_places_are_one_line_before_any_work(shared, unprivileged):
    runs, run = shared / "runs", shared / "runs" / "done"
    new = [a for a in sft_argv(shared, shared / "model", "x", max_steps=3) if not a.startswith("output_dir=")]
    (shared / "ro-out").mkdir()
    (shared / "a-file").write_text("x")
    not_writable = "is not writable (no write permission for this user)"
    cases = {
        "ro-out": [(["sft", *new, f"output_dir={shared / 'ro-out'}"],
                    f"output_dir: cannot create the run folder {shared / 'ro-out' / 'x'}: {shared / 'ro-out'} "
                    + not_writable)],
        "below a file": [(["sft", *new, f"output_dir={shared / 'a-file' / 'sub'}"],
                          f"output_dir: {shared / 'a-file' / 'sub'} is below {shared / 'a-file'}, a file")],
        "ro run": [(["sft", "--resume", str(run), "max_steps=3"], f"resume: {run} {not_writable}"),
                   (["sft", *sft_argv(shared, shared / "model", "done", overwrite="true", max_steps=3)],
                    f"run folder {run}: {run} {not_writable}")],
        "ro checkpoints": [(["sft", "--resume", str(run), "max_steps=3"],
                            f"resume: {run / 'checkpoints'} {not_writable}")],
    }
    before, rows = tree(runs), read_jsonl(run / "metrics.jsonl")
    failures = []
    for label, mode_of in (("ro-out", {shared / "ro-out": 0o555}), ("below a file", {}),
                           ("ro run", {run: 0o555}), ("ro checkpoints", {run / "checkpoints": 0o555})):
        for path, mode in mode_of.items():
            os.chmod(path, mode)
        failures += [f"{label}: {f}" for f in _one_line_refusals(unprivileged, cases[label], shared)]
        for path in mode_of:
            os.chmod(path, 0o755)
    assert failures == [], "\n".join(failures)
    assert tree(runs) == before and read_jsonl(run / "metrics.jsonl") == rows  # no step trained, nothing written
    assert sorted(p.name for p in shared.iterdir()) == ["a-file", "model", "ro-out", "runs", "sft.jsonl"]
    assert list((shared / "ro-out").iterdir()) == []


def _bwrap_read_only(folder: Path) -> list[str] | None:
    """A bubblewrap prefix that shows `folder` read-only (a read-only mount), or None."""
    if shutil.which("bwrap") is None:
        return None
    prefix = ["bwrap", "--bind", "/", "/", "--ro-bind", str(folder), str(folder), "--dev", "/dev", "--proc", "/proc"]
    return prefix if _works(prefix) else None


@pytest.mark.slow
def test_a_read_only_mount_is_one_line(shared):
    """--resume of a run on a read-only mount (once an OSError on its .lock) and a new run there (once
    an OSError from mkdir): one line naming the path and saying it is a read-only file system."""
    prefix = _bwrap_read_only(shared)
    if prefix is None:
        pytest.skip("bubblewrap (bwrap) is missing or cannot mount here: no read-only mount to test on")
    runs, run = shared / "runs", shared / "runs" / "done"
    before = tree(runs)
    ro = "is not writable (read-only file system)"
    cases = [(["sft", "--resume", str(run), "max_steps=3"], f"resume: {run} {ro}"),
             (["sft", *sft_argv(shared, shared / "model", "new", max_steps=3)],
              f"output_dir: cannot create the run folder {runs / 'new'}: {runs} {ro}")]
    failures = _one_line_refusals(prefix, cases, shared)
    assert failures == [], "\n".join(failures)
    assert tree(runs) == before
