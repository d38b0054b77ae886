"""What a run prints: iterations counted from 1, the ETA after a resume, unwrapped lines in files,
the closing line, the evaluation in TensorBoard, and quiet libraries."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.console import Console

from rlhfkit.diagnostics import console as console_mod
from rlhfkit.diagnostics.console import RunConsole, closing_line


def _quiet_console(total: int) -> tuple[RunConsole, io.StringIO]:
    out = io.StringIO()
    return RunConsole(total, quiet=True, console=Console(file=out, width=80)), out


def test_iterations_count_from_one_and_the_eta_counts_from_the_resumed_iteration(monkeypatch):
    rc, out = _quiet_console(5)
    monkeypatch.setattr(console_mod.time, "monotonic", lambda: 10.0)
    rc._t0 = 0.0  # a run resumed at iteration 3 (0-based): one iteration in 10 s so far, one left after it
    rc.log_iteration(3, {"rollout/reward_mean": 0.5})
    line = out.getvalue().strip()
    assert line.startswith("it 4/5 ") and line.endswith("| 10.0 s/it, ETA 0:10")  # 1 left x 10 s
    rc.log_iteration(4, {"rollout/reward_mean": 0.5})
    assert out.getvalue().strip().splitlines()[-1].startswith("it 5/5 ")  # the last is 5/5, no ETA
    assert "ETA" not in out.getvalue().strip().splitlines()[-1]


def test_long_lines_stay_one_line_in_files():
    rc, out = _quiet_console(1)
    message = "[eval] change: " + "x" * 150
    rc.print(message)
    assert out.getvalue() == message + "\n"


def test_closing_line_names_the_folder_and_the_next_commands():
    assert closing_line("runs/grpo-1") == ("[done] runs/grpo-1; next: rlhfkit doctor runs/grpo-1 | rlhfkit report "
                                          "runs/grpo-1 | rlhfkit export runs/grpo-1 --out DIR")


def test_a_run_ends_with_the_closing_line_and_logs_the_evaluation_to_tensorboard(tmp_path, tiny_model_dir, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.grpo import train
    from rlhfkit.trainers.grpo_config import GRPOConfig

    (tmp_path / "p.txt").write_text("\n".join(f"Say {i}." for i in range(8)))
    cfg = build_config(GRPOConfig, dict(
        model=str(tiny_model_dir), prompts=str(tmp_path / "p.txt"), reward="length:3", iterations=2,
        rollout_batch_size=4, group_size=2, mini_batch_size=4, micro_batch_size=4, max_new_tokens=4,
        num_eval_prompts=2, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="t", quiet=True,
        tensorboard=True))
    summary = train(cfg)
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == closing_line(tmp_path / "runs" / "t")
    events = EventAccumulator(str(tmp_path / "runs" / "t" / "tensorboard")).Reload()
    means = [(e.step, e.value) for e in events.Scalars("eval/reward_mean")]
    assert [step for step, _ in means] == [0, 2]
    want = [summary["eval_before"]["mean"], summary["eval_after"]["mean"]]
    assert [v for _, v in means] == pytest.approx(want, rel=1e-6, abs=1e-6)  # TensorBoard keeps float32

def test_the_libraries_are_quiet_unless_asked(tiny_model_dir):
    cmd = [sys.executable, "-m", "rlhfkit.cli", "generate", "--model", str(tiny_model_dir), "--prompt", "hi",
           "--max-new-tokens", "2", "--dtype", "fp32"]
    env = {k: v for k, v in os.environ.items() if k not in ("TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS")}
    quiet = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert quiet.returncode == 0, quiet.stderr
    assert "Loading weights" not in quiet.stderr and "Warning" not in quiet.stderr, quiet.stderr
    loud = subprocess.run(cmd, capture_output=True, text=True, env={**env, "RLHFKIT_VERBOSE": "1"}, timeout=300)
    assert "Loading weights" in loud.stderr
