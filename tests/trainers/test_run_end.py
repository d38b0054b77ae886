"""How a run ends: a later success clears an earlier failure's mark, files saved at the end do not
depend on what ran in the process, and signals outside the training loop stop with the same
message as inside it."""

from __future__ import annotations

import dataclasses
import errno
import json
import signal

import pytest
from test_faults import cli, sft_argv, wait_for
from test_resume import TRAINERS, make_cfg, read_jsonl

from rlhfkit.core.command_line import parse_args
from rlhfkit.core.run_files import CHECKPOINTS, latest_checkpoint
from rlhfkit.runtime import tracker as tracker_mod
from rlhfkit.runtime.faults import PAUSE_ENV


def test_a_successful_resume_removes_the_failed_mark_of_an_earlier_attempt(tmp_path, tiny_model_dir, monkeypatch):
    """A permission error after 2 logged steps marks the run failed (RUN/failed.json); once fixed,
    the resume finishes the run, and the folder no longer says that it failed."""
    from rlhfkit.trainers.sft import train

    real_log = tracker_mod.Tracker.log

    def log(self, it, metrics):
        if it == 2:
            raise PermissionError(errno.EACCES, "Permission denied", str(self.run_dir / "metrics.jsonl"))
        return real_log(self, it, metrics)

    cfg = make_cfg("sft", tmp_path, tiny_model_dir, "healed", max_steps=3, save_every=1)
    run = tmp_path / "runs" / "healed"
    with monkeypatch.context() as m:
        m.setattr(tracker_mod.Tracker, "log", log)
        with pytest.raises(PermissionError):
            train(cfg)
    assert (run / "failed.json").is_file() and not (run / "summary.json").exists()
    train(dataclasses.replace(cfg, resume=str(run)))
    assert (run / "summary.json").is_file() and not (run / "failed.json").exists()
    assert [r["iteration"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]


def test_sfts_saved_tokenizer_is_the_same_after_a_resume_that_runs_no_step(tmp_path, tiny_model_dir):
    """The uninterrupted run samples (ROUGE at its last step), which leaves padding set on the fast
    tokenizer; resuming the finished run samples nothing. final/tokenizer.json must not tell them
    apart (it said "padding": null after the resume only)."""
    from rlhfkit.trainers.sft import train

    cfg = make_cfg("sft", tmp_path, tiny_model_dir, "tok", max_steps=2, save_every=1)
    summary = train(cfg)
    assert "rouge_l" in summary["eval_after"]  # the run did sample
    final = tmp_path / "runs" / "tok" / "final"
    first = {p.name: p.read_bytes() for p in final.iterdir() if p.name.startswith("tokenizer")}
    assert "tokenizer.json" in first
    train(dataclasses.replace(cfg, resume=str(tmp_path / "runs" / "tok")))  # the finished run: no step
    again = {p.name: p.read_bytes() for p in final.iterdir() if p.name.startswith("tokenizer")}
    assert again == first


# ----------------------------------------------------------------------------- signals outside the loop
# Real processes, real signals; the test hook PAUSE_ENV holds a process at the named point until the
# signal has arrived (runtime/faults.py pause_point), so "during the evaluation" is exact, not timed.


def _argv(name, tmp_path, tiny_model_dir, run_name, **over) -> list[str]:
    _, kw = TRAINERS[name](tmp_path)
    kw.update(model=tiny_model_dir, dtype="fp32", output_dir=tmp_path / "runs", run_name=run_name, quiet="true",
              tensorboard="false", **over)
    return [f"{k}={v}" for k, v in kw.items()]


def _signal_at(point: str, signum: int, command: str, argv: list[str], tmp_path) -> tuple[int, str]:
    """Run `rlhfkit COMMAND ARGV`, send `signum` once it is at `point`; (exit code, stderr)."""
    marker = tmp_path / f"at-{point}"
    proc = cli([command, *argv], env={PAUSE_ENV: f"{point}:{marker}"})
    wait_for(marker.exists, proc, timeout=300)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


def test_sigterm_during_grpos_evaluation_before_training_stops_with_one_line(tmp_path, tiny_model_dir):
    """Before its first iteration a fresh run has nothing to resume: it says so, and leaves no folder
    (it exited 143 in silence, the folder left behind)."""
    argv = _argv("grpo", tmp_path, tiny_model_dir, "early", iterations=2)
    code, err = _signal_at("evaluation-before", signal.SIGTERM, "grpo", argv, tmp_path)
    assert code == 143, err[-2000:]
    assert "rlhfkit: SIGTERM: finishing the evaluation before training, then stopping" in err
    assert _last_line(err) == ("rlhfkit: stopped: SIGTERM during the evaluation before training; nothing to resume "
                               "from was saved (no iteration was done): start the run again")
    assert not (tmp_path / "runs" / "early").exists()


def test_sighup_during_grpos_evaluation_after_training_saves_and_names_the_resume(tmp_path, tiny_model_dir):
    """save_every=0: the trained weights are checkpointed before it stops; the resume runs no
    iteration, only the evaluation and the final save."""
    from rlhfkit.trainers.grpo import train
    from rlhfkit.trainers.grpo_config import GRPOConfig

    run = tmp_path / "runs" / "late"
    argv = _argv("grpo", tmp_path, tiny_model_dir, "late", iterations=2, save_every=0)
    code, err = _signal_at("evaluation-after", signal.SIGHUP, "grpo", argv, tmp_path)
    assert code == 129, err[-2000:]
    assert _last_line(err) == (f"rlhfkit: stopped: SIGHUP during the evaluation after training; checkpoint "
                               f"{run / CHECKPOINTS / 'step-2'}. Continue with: rlhfkit grpo --resume {run}")
    assert latest_checkpoint(run).name == "step-2" and not (run / "summary.json").exists()
    summary = train(parse_args(GRPOConfig, ["--resume", str(run)], "rlhfkit grpo"))
    assert "eval_after" in summary and (run / "final").is_dir()
    assert [r["iteration"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1]


def test_sigterm_during_dpos_judged_samples_after_training_names_the_resume(tmp_path, tiny_model_dir):
    run = tmp_path / "runs" / "judged"
    argv = _argv("dpo", tmp_path, tiny_model_dir, "judged", max_steps=2, save_every=1)
    code, err = _signal_at("evaluation-after", signal.SIGTERM, "dpo", argv, tmp_path)
    assert code == 143, err[-2000:]
    assert _last_line(err) == (f"rlhfkit: stopped: SIGTERM during the evaluation after training; checkpoint "
                               f"{run / CHECKPOINTS / 'step-2'}. Continue with: rlhfkit dpo --resume {run}")
    assert not (run / "summary.json").exists()


def test_sigint_during_the_final_save_finishes_it_and_says_the_run_is_complete(tmp_path, tiny_model_dir):
    run = tmp_path / "runs" / "saving"
    code, err = _signal_at("final-save", signal.SIGINT, "sft",
                           sft_argv(tmp_path, tiny_model_dir, "saving", max_steps=2), tmp_path)
    assert code == 130, err[-2000:]
    assert _last_line(err) == (f"rlhfkit: stopped: SIGINT during the final save, which was completed: the run is "
                               f"finished ({run / 'final'}, {run / 'summary.json'})")
    assert json.loads((run / "summary.json").read_text())["final"] == str(run / "final")
