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
