"""How a run ends: a later success clears an earlier failure's mark, files saved at the end do not
depend on what ran in the process, and signals outside the training loop stop with the same
message as inside it."""

from __future__ import annotations

import dataclasses
import errno

import pytest
from test_resume import make_cfg, read_jsonl

from rlhfkit.runtime import tracker as tracker_mod


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
