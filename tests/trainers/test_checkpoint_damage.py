"""Real resumes of damaged checkpoints: files that pass their checksums but hold the wrong thing,
checkpoints written before checksums existed, and files the user cannot read (as a non-root user:
root reads every file whatever its permission bits)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from test_resume import make_cfg, read_jsonl

from rlhfkit.core.run_files import META, STATE, WEIGHTS, file_digest

NOBODY = 65534


def _reseal(path: Path) -> None:
    """Record the sizes and sha256 of a checkpoint's files as they are now."""
    meta = json.loads((path / META).read_text())
    meta["sizes"] = {f: (path / f).stat().st_size for f in meta["files"]}
    meta["sha256"] = {f: file_digest(path / f) for f in meta["files"]}
    (path / META).write_text(json.dumps(meta))


def _strip_checksums(path: Path) -> None:
    """meta.json as written before sizes and sha256 were recorded."""
    meta = json.loads((path / META).read_text())
    (path / META).write_text(json.dumps({k: v for k, v in meta.items() if k not in ("sizes", "sha256")}))


def _resume(train, cfg, run: Path, capsys) -> str:
    capsys.readouterr()
    train(dataclasses.replace(cfg, resume=str(run), max_steps=4))
    return "".join(capsys.readouterr().out.split())  # the console wraps long lines


def _squeeze(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("how", ["meta-list", "state-list"])
def test_a_misshapen_newest_checkpoint_falls_back_to_the_one_before(how, tmp_path, tiny_model_dir, capsys):
    """meta.json valid JSON but a list (was an AttributeError traceback), state.pt a list with its
    size and sha256 recomputed to match (was a TypeError traceback): skipped with a notice."""
    from rlhfkit.trainers.sft import train

    cfg = make_cfg("sft", tmp_path, tiny_model_dir, "misshapen", max_steps=3, save_every=1)
    train(cfg)
    run = tmp_path / "runs" / "misshapen"
    step3 = run / "checkpoints" / "step-3"
    if how == "meta-list":
        (step3 / META).write_text(json.dumps([json.loads((step3 / META).read_text())]))
        problem = f"{step3 / META} is unreadable (TypeError: a JSON list, not an object)"
    else:
        torch.save([0, 1, 2], step3 / STATE)
        _reseal(step3)
        problem = f"{step3 / STATE} holds a list, not the checkpoint's state dict"
    out = _resume(train, cfg, run, capsys)
    assert _squeeze(f"[resume] skipping step-3: {problem}; resuming from step-2 instead") in out
    assert _squeeze("continuing at step 2") in out
    assert [r["iteration"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2, 3]


def test_weights_of_the_step_before_copied_into_a_checkpoint_without_checksums_fall_back(
        tmp_path, tiny_model_dir, capsys):
    """sizes/sha256 removed and step-2's weights copied into step-3: not "continuing at step 3"
    with step-2's weights, but the weights' own step (their safetensors metadata) sends the resume
    back to step-2, which is taken with a notice that it cannot be verified."""
    from rlhfkit.trainers.sft import train

    cfg = make_cfg("sft", tmp_path, tiny_model_dir, "foreign", max_steps=3, save_every=1)
    train(cfg)
    run = tmp_path / "runs" / "foreign"
    step2, step3 = run / "checkpoints" / "step-2", run / "checkpoints" / "step-3"
    for step in (step2, step3):
        _strip_checksums(step)
    (step3 / WEIGHTS).write_bytes((step2 / WEIGHTS).read_bytes())
    out = _resume(train, cfg, run, capsys)
    assert _squeeze(f"[resume] skipping step-3: {step3 / WEIGHTS} holds the weights of step 2, not of step-3; "
                    "resuming from step-2 instead") in out
    assert _squeeze("[resume] step-2 has no recorded sizes and sha256 (written by an older rlhfkit): its files "
                    "cannot be verified") in out
    assert _squeeze("continuing at step 2") in out and _squeeze("continuing at step 3") not in out
    assert [r["iteration"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2, 3]


# ----------------------------------------------------------------------------- unreadable files, non-root

UNREADABLE = [STATE, WEIGHTS, "rng-rank0.pt", "config.yaml"]

# Run inside the non-root process: resume each run folder given on the command line, one after another.
RESUME_ALL = """
import sys
from rlhfkit.cli import main
for run in sys.argv[1:]:
    print("=== resume", run, flush=True)
    print("=== exit", main(["sft", "--resume", run, "max_steps=3"]), flush=True)
"""


def _as_nobody() -> list[str]:
    """The command prefix that runs a process as a user without root's right to read any file."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root and setpriv is missing: cannot run the resume as a non-root user")
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.mark.slow  # four resumes in a second process
def test_an_unreadable_checkpoint_file_falls_back_like_other_damage(tiny_model_dir):
    """state.pt, trainable.safetensors, an RNG file or config.yaml the user cannot read (was a
    PermissionError traceback from file_digest): the resume skips that step with a notice naming
    the file and goes on from the one before. Resumed as a non-root user in a real process."""
    from rlhfkit.trainers.sft import train

    prefix = _as_nobody()
    base = Path(tempfile.mkdtemp(prefix="rlhfkit-unreadable-"))  # not under pytest's root-only tmp folder
    try:
        shutil.copytree(tiny_model_dir, base / "model")
        cfg = make_cfg("sft", base, base / "model", "r", max_steps=2, save_every=1)
        train(cfg)
        runs = []
        for name in UNREADABLE:  # one copy of the run per unreadable file
            run = base / "runs" / name.replace(".", "-")
            shutil.copytree(base / "runs" / "r", run)
            (run / ".lock").unlink(missing_ok=True)
            runs.append(run)
        if prefix:
            subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(base)], check=True)
        for name, run in zip(UNREADABLE, runs):
            (run / "checkpoints" / "step-2" / name).chmod(0)
        env = {**os.environ, "HOME": str(base), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join(sys.path)}
        if prefix and subprocess.run([*prefix, sys.executable, "-c", "import rlhfkit.cli"], cwd=base, env=env,
                                     capture_output=True, timeout=300).returncode != 0:
            pytest.skip("the non-root user cannot import rlhfkit here (the checkout or its .venv is in a folder "
                        "only root may enter, e.g. one made by mktemp -d)")
        proc = subprocess.run([*prefix, sys.executable, "-c", RESUME_ALL, *map(str, runs)], cwd=base, env=env,
                              capture_output=True, text=True, timeout=600)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-3000:]
        parts = _squeeze(out).split("===resume")[1:]
        assert len(parts) == len(runs), out[-3000:]
        for name, run, part in zip(UNREADABLE, runs, parts):
            step2 = run / "checkpoints" / "step-2"
            assert _squeeze(f"[resume] skipping step-2: {step2 / name} is unreadable (PermissionError") in part, part
            assert _squeeze("; resuming from step-1 instead") in part and part.endswith("===exit0"), part
            assert [r["iteration"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]
    finally:
        shutil.rmtree(base, ignore_errors=True)
