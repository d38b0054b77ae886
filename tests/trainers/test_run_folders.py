"""A run folder belongs to one run (runtime/run_folder.py): an existing name is refused unless resumed
or overwritten, a live run's folder is locked, default names never collide, and a run that fails
before its first checkpoint leaves nothing behind. The concurrency cases are two real processes."""

from __future__ import annotations

import dataclasses
import signal

import pytest
from test_faults import _nan_forward_at, cli, sft_argv, wait_for
from test_resume import make_cfg, read_jsonl

from rlhfkit.core.command_line import parse_args
from rlhfkit.core.run_files import latest_checkpoint
from rlhfkit.errors import UserError


def _files(folder):
    """Every file under `folder` with its bytes (what a refused run must not change)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_existing_run_name_is_refused_and_the_old_run_kept(tmp_path, tiny_model_dir):
    from rlhfkit.trainers.sft import train

    train(make_cfg("sft", tmp_path, tiny_model_dir, "taken", max_steps=2))
    run = tmp_path / "runs" / "taken"
    before = _files(run)
    with pytest.raises(UserError, match=f"run folder {run} already exists: continue it with --resume {run} "
                                        r"\(or resume=auto\), choose another run_name, or replace it with "
                                        "overwrite=true"):
        train(make_cfg("sft", tmp_path, tiny_model_dir, "taken", max_steps=3))
    assert _files(run) == before  # nothing overwritten, appended or deleted

    train(make_cfg("sft", tmp_path, tiny_model_dir, "taken", max_steps=3, overwrite=True))
    assert [r["iteration"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]  # the new run's alone
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step-3"]


def test_default_names_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    from rlhfkit.runtime import run_folder
    from rlhfkit.runtime.run_folder import claim_run_folder

    monkeypatch.setattr(run_folder.time, "strftime", lambda fmt: "20260101-120000")
    cfg = dataclasses.make_dataclass("C", [("output_dir", str), ("run_name", object), ("resume", object)])
    a = claim_run_folder(cfg(str(tmp_path / "runs"), None, None), "sft")
    b = claim_run_folder(cfg(str(tmp_path / "runs"), None, None), "sft")
    assert (a.path.name, b.path.name) == ("sft-20260101-120000", "sft-20260101-120000-2")
    a.release(), b.release()


def test_resume_auto_without_a_checkpoint_drops_the_dead_attempts_rows(tmp_path, tiny_model_dir):
    from rlhfkit.trainers.sft import train

    run = tmp_path / "runs" / "auto"
    run.mkdir(parents=True)  # an attempt killed before its first checkpoint: its lock, config and rows
    (run / ".lock").write_text("12345\n")
    (run / "config.yaml").write_text("max_steps: 3\n")
    (run / "metrics.jsonl").write_text('{"iteration": 0, "loss/sft": 9.0}\n{"iteration": 1, "loss/sft": 9.0}\n')
    train(make_cfg("sft", tmp_path, tiny_model_dir, "auto", resume="auto", max_steps=3))
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1, 2] and all(r["loss/sft"] != 9.0 for r in rows)


def test_a_run_that_fails_before_its_first_checkpoint_leaves_nothing(tmp_path, tiny_model_dir):
    """A reward of the wrong shape stops GRPO in its first rollout: the run folder it created, and
    the output_dir it created for it, are removed (no config.yaml, no tensorboard/)."""
    from rlhfkit.rewards import RewardError
    from rlhfkit.trainers.grpo import train

    (tmp_path / "short.py").write_text("def reward(prompts, completions, **kw):\n    return [0.0]\n")
    cfg = make_cfg("grpo", tmp_path, tiny_model_dir, "failed", reward=f"python:{tmp_path / 'short.py'}:reward",
                   tensorboard=True)
    with pytest.raises(RewardError):
        train(cfg)
    assert not (tmp_path / "runs").exists()


def test_a_run_that_fails_after_logging_steps_is_kept_and_marked_failed(tmp_path, tiny_model_dir, monkeypatch):
    import json

    from rlhfkit.runtime.faults import NonFiniteError
    from rlhfkit.trainers.sft import SFTConfig, train

    _nan_forward_at(monkeypatch, set(range(100)))
    with pytest.raises(NonFiniteError):
        train(parse_args(SFTConfig, sft_argv(tmp_path, tiny_model_dir, "diverged", max_steps=10), "rlhfkit sft"))
    run = tmp_path / "runs" / "diverged"
    assert len(read_jsonl(run / "metrics.jsonl")) == 3  # kept for diagnosis
    failed = json.loads((run / "failed.json").read_text())
    assert failed["type"] == "NonFiniteError" and failed["error"].startswith("3 optimiser steps in a row")


def test_a_refused_resume_changes_nothing(tmp_path, tiny_model_dir):
    from rlhfkit.trainers.sft import train

    done = make_cfg("sft", tmp_path, tiny_model_dir, "done", tensorboard=True)
    train(done)
    run = tmp_path / "runs" / "done"
    before = _files(run)
    for change, match in (({"max_steps": 2}, "after 4 steps, but this run is set to 2"),
                          ({"lora_r": 4}, "has shape")):
        with pytest.raises(UserError, match=match):
            train(dataclasses.replace(done, resume=str(run), **change))
        assert _files(run) == before, change  # config.yaml and tensorboard/ as they were


def _long_sft(tmp_path, tiny_model_dir, name, **over):
    return ["sft", *sft_argv(tmp_path, tiny_model_dir, name, max_steps=100_000, save_every=0, **over)]


def test_a_live_runs_folder_is_locked_against_a_second_run_and_a_resume(tmp_path, tiny_model_dir):
    """While a run trains, a second run with its name and a --resume of it are both refused (exit
    2, one line, nothing written); after the live run stops, the resume works."""
    from rlhfkit.runtime.run_folder import LOCK

    run = tmp_path / "runs" / "live"
    first = cli(_long_sft(tmp_path, tiny_model_dir, "live"))
    try:
        wait_for(lambda: len(read_jsonl(run / "metrics.jsonl")) >= 1, first)
        assert (run / LOCK).read_text().strip() == str(first.pid)
        for argv, match in ((_long_sft(tmp_path, tiny_model_dir, "live"), "in use by a running rlhfkit process"),
                            (["sft", "--resume", str(run), "max_steps=100000"], "in use by a running")):
            second = cli(argv)
            _, err = second.communicate(timeout=120)
            assert second.returncode == 2, err[-2000:]
            assert err.strip().splitlines()[-1].startswith("rlhfkit: error: ") and match in err
            assert f"(pid {first.pid})" in err
        rows = read_jsonl(run / "metrics.jsonl")
        assert [r["iteration"] for r in rows] == list(range(len(rows)))  # one writer
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 143
    done = latest_checkpoint(run).name
    resumed = cli(["sft", "--resume", str(run), f"max_steps={int(done[5:]) + 1}"])
    _, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err[-2000:]


def test_two_runs_started_together_with_one_name_get_one_folder_each_or_a_refusal(tmp_path, tiny_model_dir):
    procs = [cli(["sft", *sft_argv(tmp_path, tiny_model_dir, "twin", max_steps=4)]) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 2], [err[-1500:] for _, err in outs]
    loser = outs[[p.returncode for p in procs].index(2)][1]
    assert "run folder" in loser and ("already exists" in loser or "in use" in loser)
    rows = read_jsonl(tmp_path / "runs" / "twin" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]


def test_run_names_outside_output_dir_are_refused_before_the_model_loads(tmp_path, tiny_model_dir):
    from rlhfkit.trainers.sft import SFTConfig, train

    for name in ("../escape", str(tmp_path / "abs")):
        cfg = parse_args(SFTConfig, sft_argv(tmp_path, tiny_model_dir, name), "rlhfkit sft")
        cfg = dataclasses.replace(cfg, model=str(tmp_path / "no-such-model"))  # would fail later, when the model loads
        with pytest.raises(UserError, match="must be a folder name inside output_dir"):
            train(cfg)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "a_file").write_text("x")
    cfg = parse_args(SFTConfig, sft_argv(tmp_path, tiny_model_dir, "a_file"), "rlhfkit sft")
    with pytest.raises(UserError, match=f"run_name: {tmp_path / 'runs' / 'a_file'} is a file, not a folder"):
        train(cfg)
    cfg = parse_args(SFTConfig, sft_argv(tmp_path, tiny_model_dir, "x", output_dir=tmp_path / "runs" / "a_file"),
                     "rlhfkit sft")
    with pytest.raises(UserError, match="output_dir: .*a_file is a file, not a folder"):
        train(cfg)
