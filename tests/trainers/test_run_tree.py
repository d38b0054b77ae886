"""The tree rule of run folders (core/run_tree.py, runtime/run_folder.py): no run creates, overwrites or
deletes anything inside another run's folder, live or finished, nor in a folder that holds one, however
the path is spelled (a nested run_name, an output_dir into a run, `..`, symlinks); overwrite=true never
reaches into another run's tree and refuses while the run it would replace is live. The live run is a
real second process; every refusal is exit 2 and one line, and the other run's tree (every entry and
the sha256 of every file) is the same before and after."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import time
from pathlib import Path

import pytest
from test_faults import cli, sft_argv, wait_for
from test_resume import make_cfg, read_jsonl

from rlhfkit.core.run_files import latest_checkpoint
from rlhfkit.errors import UserError


def tree(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (dotfiles included, symlinks not followed): a file's sha256, 'dir',
    or where a symlink points."""
    out = {}
    for top, dirs, files in os.walk(folder):
        for name in dirs + files:
            p = Path(top) / name
            key = str(p.relative_to(folder))
            if p.is_symlink():
                out[key] = f"-> {os.readlink(p)}"
            elif p.is_dir():
                out[key] = "dir"
            else:
                out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def spellings(tmp: Path, runs: Path, name: str) -> list[tuple[str, list[str], str]]:
    """(label, key=value overrides, expected words) of runs that would write in run folder runs/NAME or
    in a folder holding it. Every path goes through a different spelling."""
    run = runs / name
    (tmp / "link-to-run").symlink_to(run)
    (tmp / "link-to-checkpoints").symlink_to(run / "checkpoints")
    (tmp / "link-to-runs").symlink_to(runs)
    inside, holds, live = "is inside the run folder", "holds the run folder", "in use by a running"
    return [
        ("nested run_name", [f"output_dir={runs}", f"run_name={name}/sub"], inside),
        ("the reported case: output_dir=RUN run_name=checkpoints overwrite=true",
         [f"output_dir={run}", "run_name=checkpoints", "overwrite=true"], inside),
        ("output_dir into the run, default name", [f"output_dir={run / 'checkpoints'}"], inside),
        ("'..' into the run", [f"output_dir={run / 'checkpoints' / '..'}", "run_name=fresh"], inside),
        ("'..' from a sibling", [f"output_dir={runs / 'elsewhere' / '..' / name}", "run_name=x"], inside),
        ("symlink to the run", [f"output_dir={tmp / 'link-to-run'}", "run_name=x"], inside),
        ("symlink to its checkpoints, overwrite",
         [f"output_dir={tmp}", "run_name=link-to-checkpoints", "overwrite=true"], inside),
        ("a folder holding it, overwrite", [f"output_dir={tmp}", f"run_name={runs.name}", "overwrite=true"], holds),
        ("a folder holding it through a symlink, resume=auto",
         [f"output_dir={tmp}", "run_name=link-to-runs", "resume=auto"], holds),
        ("run_name '.': output_dir itself, overwrite", [f"output_dir={runs}", "run_name=.", "overwrite=true"], holds),
        ("overwrite the run itself", [f"output_dir={runs}", f"run_name={name}", "overwrite=true"], live),
        ("overwrite it through a symlink", [f"output_dir={tmp}", "run_name=link-to-run", "overwrite=true"], live),
        ("overwrite it through '..'",
         [f"output_dir={runs / 'elsewhere' / '..'}", f"run_name={name}", "overwrite=true"], live),
    ]


def _refused_all(tmp_path, tiny_model_dir, cases) -> list[str]:
    """Start every case as its own process (together: all are refused before a model loads); check
    each is exit 2 with one line; returns the labels that were not."""
    base = [a for a in sft_argv(tmp_path, tiny_model_dir, "unused") if not a.startswith(("output_dir=", "run_name="))]
    procs = [(label, words, cli(["sft", *base, *over])) for label, over, words in cases]
    failures = []
    for label, words, proc in procs:
        _, err = proc.communicate(timeout=300)
        lines = err.strip().splitlines()
        if proc.returncode != 2 or len(lines) != 1 or words not in err or "Traceback" in err:
            failures.append(f"{label}: rc {proc.returncode}: {err[-600:]}")
    return failures


@pytest.mark.slow
def test_no_spelling_of_a_path_reaches_into_a_live_run(tmp_path, tiny_model_dir):
    """A live run (a real process, saving a checkpoint every step) is frozen with SIGSTOP while 13
    other runs try to write in its tree: each is refused (exit 2, one line) and its tree is unchanged.
    Resumed with SIGCONT, it goes on writing its own rows only, and stops with its checkpoint."""
    runs = tmp_path / "runs"
    run = runs / "live2"
    live = cli(["sft", *sft_argv(tmp_path, tiny_model_dir, "live2", max_steps=100_000, save_every=1,
                                 keep_checkpoints=2)])
    try:
        wait_for(lambda: latest_checkpoint(run) is not None, live)
        live.send_signal(signal.SIGSTOP)  # still live (its lock held), but its tree stands still
        time.sleep(0.5)
        before = tree(run)
        cases = spellings(tmp_path, runs, "live2")
        failures = _refused_all(tmp_path, tiny_model_dir, cases)
        changed = tree(run) != before  # something created, overwritten or deleted in the live run's tree
        assert not failures and not changed, (f"{len(failures)} of {len(cases)} spellings not refused; the live "
                                              f"run's tree changed: {changed}\n" + "\n".join(failures))
        assert not (runs / "elsewhere").exists() and sorted(p.name for p in runs.iterdir()) == ["live2"]
        live.send_signal(signal.SIGCONT)
        n = len(read_jsonl(run / "metrics.jsonl"))
        wait_for(lambda: len(read_jsonl(run / "metrics.jsonl")) >= n + 2, live)
    finally:
        live.send_signal(signal.SIGCONT)
        live.send_signal(signal.SIGTERM)
        live.communicate(timeout=120)
    assert live.returncode == 143
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == list(range(len(rows)))  # one writer
    assert not (run / "checkpoints" / ".lock").exists() and not (run / "sub").exists()


def test_a_finished_run_is_not_reached_into_either(tmp_path, tiny_model_dir):
    """The same spellings against a finished run (in-process, refused before the model loads), except
    the three that replace the run itself: those are allowed (overwrite=true of a run that is over)."""
    from rlhfkit.trainers.sft import train

    train(make_cfg("sft", tmp_path, tiny_model_dir, "done", max_steps=2, save_every=1))
    runs, run = tmp_path / "runs", tmp_path / "runs" / "done"
    before = tree(run)
    cases = [c for c in spellings(tmp_path, runs, "done") if c[2] != "in use by a running"]
    base = make_cfg("sft", tmp_path, tiny_model_dir, "x", max_steps=2)
    base = dataclasses.replace(base, model=str(tmp_path / "no-such-model"))  # would fail later, as it loads
    for label, over, words in cases:
        kw = {"run_name": None, "overwrite": False, "resume": None}
        for arg in over:
            key, value = arg.split("=", 1)
            kw[key] = value == "true" if key == "overwrite" else value
        with pytest.raises(UserError, match=words):
            train(dataclasses.replace(base, **kw))
        assert tree(run) == before, label
    assert sorted(p.name for p in runs.iterdir()) == ["done"]


def _lock_then(real_lock, pending: list, words: str):
    """A run_folder._lock that, once it holds the lock, lets the `pending` claim run in full (refused
    with `words`) before its own claim goes on."""
    from rlhfkit.runtime.run_folder import claim_run_folder

    def lock(*args, **kwargs):
        fd = real_lock(*args, **kwargs)
        if pending:
            with pytest.raises(UserError, match=words):
                claim_run_folder(pending.pop(), "sft")
        return fd

    return lock


def test_a_claim_checks_the_tree_again_once_it_holds_the_lock(tmp_path, monkeypatch):
    """Two runs on nested paths that both passed the up-front check (neither folder existed): the
    second claims in full between the first one's lock and the rest of its claim. The second is
    refused, in both orders, and leaves nothing; the first goes on."""
    import shutil

    from rlhfkit.runtime import run_folder
    from rlhfkit.runtime.run_folder import claim_run_folder

    cfg = dataclasses.make_dataclass("C", [("output_dir", str), ("run_name", object), ("resume", object),
                                           ("overwrite", bool), ("model", object)])
    outer = cfg(str(tmp_path / "a"), "nest", None, False, None)
    inner = cfg(str(tmp_path / "a"), "nest/in", None, False, None)
    monkeypatch.setattr(run_folder, "check_run_folder", lambda cfg: None)  # both passed it before either claimed
    real_lock = run_folder._lock
    for first, second, words in ((outer, inner, "is inside the run folder .*a/nest .*held by a live process"),
                                 (inner, outer, "already exists")):
        pending = [second]
        lock_then_the_other_claims = _lock_then(real_lock, pending, words)
        monkeypatch.setattr(run_folder, "_lock", lock_then_the_other_claims)
        folder = claim_run_folder(first, "sft")
        assert not pending and folder.path == tmp_path / "a" / first.run_name
        mine = "a/nest/.lock" if first is outer else "a/nest/in/.lock"
        assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == sorted(
            {"a", "a/nest", str(Path(mine).parent), mine})  # only the first one's folder and lock
        folder.release()
        shutil.rmtree(tmp_path / "a")


@pytest.mark.slow
def test_two_runs_started_together_on_nested_paths_do_not_both_train(tmp_path, tiny_model_dir):
    """Real processes: RUN and RUN/inner started at once. At most one trains (exit 0), the other is
    exit 2 with one line; the one that trained has only its own rows."""
    procs = [cli(["sft", *sft_argv(tmp_path, tiny_model_dir, name, max_steps=3)]) for name in ("nest", "nest/inner")]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    assert sorted(codes) in ([0, 2], [2, 2]), [err[-1500:] for _, err in outs]
    for (_, err), code in zip(outs, codes):
        if code == 2:
            assert len(err.strip().splitlines()) == 1 and "run folder" in err, err[-1500:]
    winner = tmp_path / "runs" / ("nest" if codes[0] == 0 else "nest/inner")
    if 0 in codes:
        assert [r["iteration"] for r in read_jsonl(winner / "metrics.jsonl")] == [0, 1, 2]


def test_what_makes_a_run_folder(tmp_path):
    """One definition (core/run_tree.run_marker): .lock with config.yaml, a held .lock, or config.yaml with
    metrics.jsonl. A .lock alone (pytest's own temporary folders hold one), config.yaml alone (a user's
    file, each checkpoint's) or summary.json (the pipeline's) is not."""
    import fcntl

    from rlhfkit.core.run_tree import run_marker

    def folder(name, *files):
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f).write_text("1\n")
        return tmp_path / name

    assert run_marker(folder("finished", ".lock", "config.yaml")) == ".lock and config.yaml"
    assert run_marker(folder("copied", "config.yaml", "metrics.jsonl")) == "config.yaml and metrics.jsonl"
    for name, files in (("pytest-like", [".lock"]), ("user", ["config.yaml"]), ("pipeline", ["summary.json"]),
                        ("metrics-only", ["metrics.jsonl"])):
        assert run_marker(folder(name, *files)) is None, name
    opening = folder("opening", ".lock")
    fd = os.open(opening / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a run between its lock and its config.yaml
    try:
        assert run_marker(opening) == "a .lock held by a live process"
    finally:
        os.close(fd)
    assert run_marker(opening) is None


def test_only_run_folders_are_cleared(tmp_path, tiny_model_dir):
    """overwrite=true and resume=auto (no checkpoint) delete a folder's contents only when it is a run
    folder: a folder of other files is refused, before the model loads, and kept as it was."""
    from rlhfkit.trainers.sft import train

    mine = tmp_path / "runs" / "notes"
    mine.mkdir(parents=True)
    (mine / "thesis.tex").write_text("years of work")
    (mine / "config.yaml").write_text("mine: true\n")
    base = dataclasses.replace(make_cfg("sft", tmp_path, tiny_model_dir, "notes"), model=str(tmp_path / "none"))
    for over in ({"overwrite": True}, {"resume": "auto"}):
        with pytest.raises(UserError, match=f"{mine} holds files but is not a run folder"):
            train(dataclasses.replace(base, **over))
    assert sorted(p.name for p in mine.iterdir()) == ["config.yaml", "thesis.tex"]
