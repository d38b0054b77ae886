"""A process of a 2-process run that stops: the other says so in one line (torchrun, gloo, tiny PPO).

- rank 1 killed with SIGKILL after its second iteration: rank 0 prints one line naming rank 1 and
  how it died, the newest checkpoint and the command that continues; no traceback, no notice of a
  checkpoint to come when torchrun sends it SIGTERM; failed.json holds the same line;
- rank 1 stopped by an error of its own (its reward raises there only): rank 0 names it with
  rank 1's own line;
- a bad option: every process meets it, the one line is printed once;
- `accelerate launch --cpu --num_processes 2`, the documented trap, says it started one process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_ddp import free_port, worker_env

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240
PPO = ["rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2", "max_new_tokens=6", "num_eval_prompts=0",
       "dtype=fp32", "quiet=true", "tensorboard=false", "run_name=k"]


def env() -> dict[str, str]:
    return {**worker_env(), "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}


def torchrun(args: list[str], cwd: Path) -> subprocess.Popen:
    exe = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    return subprocess.Popen([exe, "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                             str(free_port()), "-m", "rlhfkit.cli", *args], cwd=cwd, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
    try:
        return proc.communicate(timeout=TIMEOUT_S)[0]
    finally:
        proc.kill()


def rank_pid(launcher: int, rank: int) -> int | None:
    """The process id of the worker of `launcher` (torchrun) with RANK=`rank`, or None yet."""
    try:
        children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
    except OSError:
        return None
    for pid in children:
        try:
            if f"RANK={rank}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return int(pid)
        except OSError:
            continue
    return None


def rlhfkit_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("rlhfkit:")]


def test_a_killed_rank_gives_one_line_from_rank_0(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "runs" / "k"
    proc = torchrun(["ppo", f"model={tiny_model_dir}", *PPO, "iterations=200", "save_every=1", "reward=length:3"],
                    tmp_path)
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline and proc.poll() is None:  # two iterations done and checkpointed
        if (run_dir / "checkpoints" / "step-2").is_dir():
            break
        time.sleep(0.2)
    victim = rank_pid(proc.pid, 1)
    assert victim is not None and proc.poll() is None, finish(proc)
    os.kill(victim, signal.SIGKILL)
    output = finish(proc)
    assert proc.returncode != 0
    lines = rlhfkit_lines(output)
    assert len(lines) == 1, output
    assert re.fullmatch(r"rlhfkit: error: rank 1 (died \(SIGKILL\)|is gone), so the run stopped \(this process: .+\); "
                        r"the newest checkpoint is runs/k/checkpoints/step-\d+: continue with rlhfkit ppo --resume "
                        r"runs/k", lines[0]), lines[0]
    assert "Traceback" not in output.split("rlhfkit: error:")[0]  # the launcher's own report comes after
    assert "[rank0]" not in output and "finishing" not in output
    failed = json.loads((run_dir / "failed.json").read_text())
    assert failed["type"] == "PeerFailure" and "rlhfkit: error: " + failed["error"] == lines[0]


def test_an_error_on_rank_1_only_is_named_by_rank_0(tmp_path, tiny_model_dir):
    (tmp_path / "flaky.py").write_text("import os\n\ndef reward(prompts, completions, **kw):\n"
                                       "    if os.environ.get('RANK') == '1':\n        raise ValueError('boom')\n"
                                       "    return [0.5] * len(prompts)\n")
    proc = torchrun(["ppo", f"model={tiny_model_dir}", *PPO, "iterations=2",
                     f"reward=python:{tmp_path / 'flaky.py'}:reward"], tmp_path)
    output = finish(proc)
    lines = rlhfkit_lines(output)
    assert len(lines) == 1, output
    assert re.fullmatch(r"rlhfkit: error: rank 1 stopped \(reward .*ValueError: boom\), so the run stopped "
                        r"\(this process: .+\); no checkpoint was written", lines[0]), lines[0]


def test_a_bad_option_is_printed_once(tmp_path, tiny_model_dir):
    output = finish(torchrun(["ppo", f"model={tiny_model_dir}", "lr=abc"], tmp_path))
    lines = rlhfkit_lines(output)
    assert len(lines) == 1 and lines[0].startswith("rlhfkit: error: lr"), output


def test_accelerate_cpu_trap_says_it_started_one_process(tmp_path, tiny_model_dir):
    exe = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or "accelerate"
    cmd = [exe, "launch", "--cpu", "--num_processes", "2", "--main_process_port", str(free_port()), "-m",
           "rlhfkit.cli", "sft", f"model={tiny_model_dir}", "max_steps=1", "batch_size=2", "micro_batch_size=2",
           "max_eval_examples=1", "max_length=32", "dtype=fp32", "quiet=true", "tensorboard=false", "run_name=one",
           "save_every=0"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "[processes] 1, sharding: none (the launcher started one process;" in proc.stdout
    summary = json.loads((tmp_path / "runs" / "one" / "summary.json").read_text())
    assert (summary["processes"], summary["machines"], summary["sharding"]) == (1, 1, "none")
