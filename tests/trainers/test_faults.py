"""Faults: SIGTERM/SIGINT and kill -9 in real processes, non-finite steps, failing rewards, running out
of memory. The processes are real `python -m rlhfkit.cli` runs on a tiny model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from test_resume import TRAINERS, comparable, make_cfg, read_jsonl, stop_after

from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.core.run_files import CHECKPOINTS, latest_checkpoint
from rlhfkit.errors import run_guarded
from rlhfkit.rewards import RewardError
from rlhfkit.runtime.checkpoint import PAUSE_ENV
from rlhfkit.runtime.faults import Interrupted, NonFiniteError, NonFiniteGuard, guarded_step

# ----------------------------------------------------------------------------- helpers


def cli(args: list[str], env: dict | None = None) -> subprocess.Popen:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "rlhfkit.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env)


def wait_for(cond, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    t0 = time.time()
    while not cond():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (rc {proc.returncode}) before the awaited point:\n{err[-3000:]}")
        if time.time() - t0 > timeout:
            proc.kill()
            pytest.fail("timed out")
        time.sleep(0.05)


def sft_argv(tmp_path, tiny_model_dir, run_name: str, **over) -> list[str]:
    """A tiny SFT run as command-line arguments (no held-out set)."""
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Write a short review of thing {i}.",
                                        "response": "It was great, lovely coffee." if i % 2 else "Boring."}) + "\n"
                            for i in range(12)))
    kw = dict(model=tiny_model_dir, data=data, max_eval_examples=0, batch_size=2, micro_batch_size=2, max_length=64,
              lr=1e-2, dtype="fp32", output_dir=tmp_path / "runs", run_name=run_name, quiet="true",
              tensorboard="false", max_steps=4)
    kw.update(over)
    return [f"{k}={v}" for k, v in kw.items()]


# ----------------------------------------------------------------------------- signals


def test_sigterm_finishes_the_step_writes_a_checkpoint_and_exits_143(tmp_path, tiny_model_dir):
    from rlhfkit.trainers.grpo import train
    from rlhfkit.trainers.grpo_config import GRPOConfig

    _, kw = TRAINERS["grpo"](tmp_path)
    kw.update(model=tiny_model_dir, dtype="fp32", output_dir=tmp_path / "runs", run_name="term", quiet="true",
              tensorboard="false", iterations=500, save_every=0, num_eval_prompts=0)
    argv = [f"{k}={v}" for k, v in kw.items()]
    run = tmp_path / "runs" / "term"
    proc = cli(["grpo", *argv])
    wait_for(lambda: len(read_jsonl(run / "metrics.jsonl")) >= 1, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    done = len(read_jsonl(run / "metrics.jsonl"))
    assert 1 <= done < 500
    assert latest_checkpoint(run).name == f"step-{done}"  # the step it was in finished, then was saved
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"rlhfkit: stopped: SIGTERM after {done} iteration") and f"--resume {run}" in last
    cont = parse_args(GRPOConfig, ["--resume", str(run), f"iterations={done + 1}"], "rlhfkit grpo")
    train(cont)
    assert [r["iteration"] for r in read_jsonl(run / "metrics.jsonl")] == list(range(done + 1))


def test_sigint_through_the_cli_exits_130_with_a_resume_hint(tmp_path, tiny_model_dir, monkeypatch, capsys):
    from rlhfkit.cli import main

    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stop_after(monkeypatch, 0, signal.SIGINT)
    assert main(["sft", *sft_argv(tmp_path, tiny_model_dir, "int", save_every=0)]) == 130
    run = tmp_path / "runs" / "int"
    err = capsys.readouterr().err
    assert f"rlhfkit: stopped: SIGINT after 1 step; checkpoint {run / CHECKPOINTS / 'step-1'}" in err
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers  # put back


def test_kill_9_while_writing_a_checkpoint_keeps_the_previous_one(tmp_path, tiny_model_dir):
    """SIGKILL after every file of step-2 is written, before the rename: step-1 stays the newest
    complete checkpoint, and resuming from it gives exactly the uninterrupted run."""
    from rlhfkit.trainers.sft import SFTConfig, train

    argv = sft_argv(tmp_path, tiny_model_dir, "killed", save_every=1, max_steps=3)
    run = tmp_path / "runs" / "killed"
    tmp = run / CHECKPOINTS / ".tmp-step-2"
    proc = cli(["sft", *argv], env={PAUSE_ENV: "2"})
    wait_for(lambda: (tmp / "meta.json").is_file(), proc)
    proc.kill()
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert latest_checkpoint(run).name == "step-1"
    assert sorted(p.name for p in (run / CHECKPOINTS).iterdir()) == [".tmp-step-2", "step-1"]

    train(parse_args(SFTConfig, ["--resume", str(run)], "rlhfkit sft"))
    assert sorted(p.name for p in (run / CHECKPOINTS).iterdir()) == ["step-2", "step-3"]  # keep_checkpoints=2
    train(parse_args(SFTConfig, sft_argv(tmp_path, tiny_model_dir, "straight", save_every=1, max_steps=3),
                     "rlhfkit sft"))
    straight = read_jsonl(tmp_path / "runs" / "straight" / "metrics.jsonl")
    assert comparable(read_jsonl(run / "metrics.jsonl")) == comparable(straight)


# ----------------------------------------------------------------------------- non-finite steps


def test_guarded_step_skips_a_non_finite_step_entirely():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: (s + 1) / 4)

    class Acc:
        num_processes = 1

        @staticmethod
        def clip_grad_norm_(params, max_norm):
            return torch.nn.utils.clip_grad_norm_(list(params), max_norm)

    before = [p.detach().clone() for p in model.parameters()]
    guard = NonFiniteGuard(2, advice="lower lr", log=lambda msg: None)
    (model(torch.ones(1, 3)).sum() * float("nan")).backward()
    norm, skipped = guarded_step(model.parameters(), opt, sched, Acc, 1.0, loss=float("nan"), guard=guard,
                                 where="step 0")
    assert skipped and norm != norm  # NaN
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters()) and not opt.state and sched.last_epoch == 0
    guard.check()  # 1 in a row: go on
    model(torch.ones(1, 3)).sum().backward()
    _, skipped = guarded_step(model.parameters(), opt, sched, Acc, 1.0, loss=1.0, guard=guard, where="step 1")
    assert not skipped and guard.streak == 0 and sched.last_epoch == 1
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    for i in (2, 3):  # a finite loss but an infinite gradient counts too
        (model(torch.ones(1, 3)).sum() * float("inf")).backward()
        guarded_step(model.parameters(), opt, sched, Acc, 1.0, loss=1.0, guard=guard, where=f"step {i}")
    with pytest.raises(NonFiniteError, match=r"2 optimiser steps in a row .*last at step 3.*lower lr"):
        guard.check()


def _nan_forward_at(monkeypatch, bad_calls):
    """Make ResponseNLL return NaN on the given forward calls; returns the trainable weights seen
    at the start of every call."""
    from rlhfkit.trainers.sft import ResponseNLL

    real, seen = ResponseNLL.forward, []

    def forward(self, input_ids, attention_mask, labels):
        seen.append([p.detach().clone() for p in self.parameters() if p.requires_grad])
        nll, mask = real(self, input_ids, attention_mask, labels)
        return (nll * float("nan") if len(seen) - 1 in bad_calls else nll), mask

    monkeypatch.setattr(ResponseNLL, "forward", forward)
    return seen


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_nan_loss_skips_one_step_logs_a_finding_and_training_goes_on(tmp_path, tiny_model_dir, monkeypatch):
    from rlhfkit.trainers.sft import SFTConfig, train

    seen = _nan_forward_at(monkeypatch, {1})  # one forward per step: step 1 is NaN
    train(parse_args(SFTConfig, sft_argv(tmp_path, tiny_model_dir, "nan", lora_dropout=0), "rlhfkit sft"))
    run = tmp_path / "runs" / "nan"
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["params/skipped_steps"] for r in rows] == [0, 1, 0, 0]
    assert rows[1]["loss/sft"] == "nan"  # logged as it was, not hidden
    assert rows[1]["params/lr"] == rows[0]["params/lr"] < rows[2]["params/lr"]  # the schedule did not move
    assert not _same(seen[0], seen[1]) and _same(seen[1], seen[2]) and not _same(seen[2], seen[3])
    findings = read_jsonl(run / "diagnostics.jsonl")
    assert any(f["rule"] == "non_finite" and f["iteration"] == 1 for f in findings)


def test_non_finite_steps_in_a_row_stop_the_run_with_a_diagnosis(tmp_path, tiny_model_dir, monkeypatch):
    from rlhfkit.trainers.sft import SFTConfig, train

    seen = _nan_forward_at(monkeypatch, set(range(100)))
    cfg = parse_args(SFTConfig, sft_argv(tmp_path, tiny_model_dir, "diverged", max_steps=10), "rlhfkit sft")
    with pytest.raises(NonFiniteError, match=r"3 optimiser steps in a row .*lower lr \(now 0.01\).*dtype=fp32.*"
                       r"no checkpoint was written"):
        train(cfg)
    assert len(seen) == 3 and _same(seen[0], seen[2])  # nothing was ever applied
    rows = read_jsonl(tmp_path / "runs" / "diverged" / "metrics.jsonl")
    assert [r["params/skipped_steps"] for r in rows] == [1, 1, 1]  # the last step is logged before stopping


def test_a_resumed_run_reports_no_finding_twice(tmp_path, tiny_model_dir, monkeypatch):
    """NaN steps at 0 and 2: an uninterrupted run reports the problem once (same severity and score
    at step 2 is not news). Stopped after step 1 and resumed, the rules replay the kept rows, so
    the resumed run does not report it again at step 2 either."""
    from rlhfkit.trainers.sft import SFTConfig, train

    def cfg(name, **over):
        return parse_args(SFTConfig, sft_argv(tmp_path, tiny_model_dir, name, save_every=0, **over), "rlhfkit sft")

    with monkeypatch.context() as m:
        _nan_forward_at(m, {0, 2})
        train(cfg("straight"))
    with monkeypatch.context() as m:
        _nan_forward_at(m, {0})
        stop_after(m, 1)
        with pytest.raises(Interrupted):
            train(cfg("cut"))
    with monkeypatch.context() as m:
        _nan_forward_at(m, {0})  # the resumed run's first step is step 2
        train(cfg("cut", resume=tmp_path / "runs" / "cut"))
    runs = tmp_path / "runs"
    straight = read_jsonl(runs / "straight" / "diagnostics.jsonl")
    assert [(f["rule"], f["iteration"]) for f in straight] == [("non_finite", 0)]
    assert read_jsonl(runs / "cut" / "diagnostics.jsonl") == straight
    assert comparable(read_jsonl(runs / "cut" / "metrics.jsonl")) == comparable(read_jsonl(runs / "straight" /
                                                                                          "metrics.jsonl"))


def test_rl_update_skips_only_the_non_finite_optimiser_step(tmp_path, tiny_model_dir, monkeypatch):
    import rlhfkit.trainers.ppo as ppo

    real, calls = ppo.micro_batch_loss, []

    def loss_with_nan(*args, **kw):
        loss, st = real(*args, **kw)
        calls.append(1)
        return (loss * float("nan") if len(calls) == 3 else loss), st  # micro-batch 3 = optimiser step 2

    monkeypatch.setattr(ppo, "micro_batch_loss", loss_with_nan)
    ppo.train(make_cfg("ppo", tmp_path, tiny_model_dir, "rlnan", iterations=2, num_eval_prompts=0))
    rows = read_jsonl(tmp_path / "runs" / "rlnan" / "metrics.jsonl")
    assert [r["params/skipped_steps"] for r in rows] == [1, 0]
    assert rows[0]["params/grad_norm"] == "nan" and rows[1]["params/grad_norm"] != "nan"


# ----------------------------------------------------------------------------- rewards and memory


@pytest.mark.parametrize("body, match", [
    ("    if any('number 1' in p for p in prompts):\n        raise ValueError('boom')\n    return [0.5] * len(prompts)\n",
     r"reward '.*' failed on sample \d+ \(prompt='Write a review of thing number 1.*', completion='.*'\): "
     r"ValueError: boom"),
    ("    return [float('inf') if 'number 1' in p else 0.5 for p in prompts]\n",
     r"reward '.*' gave inf for sample \d+ \(prompt='Write a review of thing number 1.*', completion='.*'\)"),
], ids=["raises", "inf"])
def test_a_failing_reward_names_the_prompt_and_completion(body, match, tmp_path, tiny_model_dir):
    """A reward that raises or returns inf for one prompt stops the run with that sample in the message."""
    from rlhfkit.trainers.grpo import train
    from rlhfkit.trainers.grpo_config import GRPOConfig

    (tmp_path / "prompts.txt").write_text("\n".join(f"Write a review of thing number {i}." for i in (0, 1, 2, 3)))
    (tmp_path / "bad.py").write_text("def reward(prompts, completions, **kw):\n" + body)
    cfg = build_config(GRPOConfig, dict(
        model=str(tiny_model_dir), prompts=str(tmp_path / "prompts.txt"), reward=f"python:{tmp_path / 'bad.py'}:reward",
        iterations=2, rollout_batch_size=8, group_size=4, mini_batch_size=4, micro_batch_size=2, max_new_tokens=4,
        num_eval_prompts=0, dtype="fp32", output_dir=str(tmp_path / "runs"), run_name="r", quiet=True,
        tensorboard=False))
    with pytest.raises(RewardError, match=match):
        train(cfg)


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.2 GiB total capacity)"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                 "you tried to allocate 85899345920 bytes. Error code 12 (Cannot allocate memory)"),
    MemoryError(),
], ids=["cuda", "cpu", "python"])
def test_out_of_memory_is_one_line_naming_the_knobs(error, capsys):
    def run():
        raise error

    assert run_guarded(run) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlhfkit: error: out of memory (")
    for knob in ("micro_batch_size", "max_new_tokens", "dtype=bf16", "gradient_checkpointing=true", "lora=true"):
        assert knob in err


def test_other_runtime_errors_are_not_mistaken_for_memory():
    def run():
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="shapes"):
        run_guarded(run)


@pytest.mark.parametrize("arg", ["lr=inf", "kl_coef=inf", "max_grad_norm=-inf", "lr=.inf", "lr=1e400"])
def test_non_finite_options_are_refused(arg):
    from rlhfkit.errors import ConfigError
    from rlhfkit.trainers.ppo_config import PPOConfig

    key = arg.split("=")[0]
    with pytest.raises(ConfigError, match=rf"{key}=.*: expected float \(a finite number\)"):
        parse_args(PPOConfig, [arg], "rlhfkit ppo")


def test_non_finite_options_are_refused_in_yaml(tmp_path):
    from rlhfkit.errors import ConfigError
    from rlhfkit.trainers.sft import SFTConfig

    (tmp_path / "c.yaml").write_text("lr: .inf\n")
    with pytest.raises(ConfigError, match=r"c.yaml: lr=inf: expected float \(a finite number\)"):
        parse_args(SFTConfig, [str(tmp_path / "c.yaml")], "rlhfkit sft")


def _nan_weights_after(monkeypatch, steps: int):
    """After optimiser step `steps` (1-based), the first trainable tensor becomes NaN while the loss
    and gradient norm stay finite (what lr=inf did): only the weights show it."""
    real, count = torch.optim.AdamW.step, []

    def step(self, *a, **kw):
        out = real(self, *a, **kw)
        count.append(1)
        if len(count) >= steps:
            with torch.no_grad():
                self.param_groups[0]["params"][0].fill_(float("nan"))
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", step)


@pytest.mark.parametrize("save_every", [0, 1])
def test_non_finite_weights_are_never_saved(save_every, tmp_path, tiny_model_dir, monkeypatch, capsys):
    """NaN weights after step 2: no checkpoint of them, no final/, exit 2; with save_every=1 the
    step-1 checkpoint stays the newest and the message says to resume from it, without one it
    says to start again (no --resume advice where there is nothing to resume)."""
    from rlhfkit.cli import main

    _nan_weights_after(monkeypatch, 2)
    rc = main(["sft", *sft_argv(tmp_path, tiny_model_dir, "nanw", save_every=save_every)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    run = tmp_path / "runs" / "nanw"
    assert rc == 2 and not (run / "final").exists() and not (run / "summary.json").exists()
    assert "trained tensors hold NaN/inf" in err and "nothing saved" in err
    if save_every:
        assert latest_checkpoint(run).name == "step-1" and f"--resume {run}" in err
        assert "after 2 steps" in err
    else:
        assert latest_checkpoint(run) is None and "--resume" not in err and "no checkpoint was written" in err
        assert "after 4 steps" in err


# ----------------------------------------------------------------------------- a full disk


def test_a_resume_on_a_full_disk_cleans_leftovers_before_it_cuts_the_logs(tmp_path, tiny_model_dir, monkeypatch,
                                                                          capsys):
    import errno
    import pathlib

    from rlhfkit.cli import main

    full_disk = OSError(errno.ENOSPC, "No space left on device")

    # warmup_steps=1: the resumed run (3 steps) would otherwise warn that its warm-up (4) outlasts it
    assert main(["sft", *sft_argv(tmp_path, tiny_model_dir, "full", max_steps=2, warmup_steps=1)]) == 0
    run = tmp_path / "runs" / "full"
    leftover = run / CHECKPOINTS / ".tmp-step-3"
    leftover.mkdir()
    (leftover / "state.pt").write_bytes(b"x" * 1000)  # what a crash in a checkpoint write left
    metrics = (run / "metrics.jsonl").read_text()
    real = pathlib.Path.write_text
    seen_leftover = []

    def full(self, text, *a, **kw):
        if self.name.endswith(".tmp"):  # the cut logs' temporary files: the disk is still full
            seen_leftover.append(leftover.exists())
            raise full_disk
        return real(self, text, *a, **kw)

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    capsys.readouterr()
    assert main(["sft", "--resume", str(run), "max_steps=3"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("rlhfkit:")]
    assert err == [f"rlhfkit: error: no space left on device writing {run / 'metrics.jsonl'}; free space, then "
                   f"--resume {run}"]
    assert seen_leftover == [False]  # cleaned before the logs were cut
    assert (run / "metrics.jsonl").read_text() == metrics
    assert [json.loads(x)["iteration"] for x in metrics.splitlines()] == [0, 1]


# ----------------------------------------------------------------------------- signals: SIGHUP, during writes, twice


def test_sighup_stops_with_a_checkpoint_like_sigterm(tmp_path, tiny_model_dir, monkeypatch, capsys):
    """A closed terminal (SIGHUP) must not lose a save_every=0 run: checkpoint, exit 128 + 1."""
    from rlhfkit.cli import main

    stop_after(monkeypatch, 0, signal.SIGHUP)
    assert main(["sft", *sft_argv(tmp_path, tiny_model_dir, "hup", save_every=0)]) == 129
    run = tmp_path / "runs" / "hup"
    assert latest_checkpoint(run).name == "step-1"
    assert f"rlhfkit: stopped: SIGHUP after 1 step; checkpoint {run / CHECKPOINTS / 'step-1'}" in capsys.readouterr().err


def _signal_while_writing(monkeypatch, step: int):
    """SIGTERM arrives while checkpoint step-`step` is being written."""
    import rlhfkit.runtime.checkpointer as checkpointer

    real = checkpointer.write_checkpoint

    def write(run_dir, at, **kw):
        if at == step:
            signal.raise_signal(signal.SIGTERM)
        return real(run_dir, at, **kw)

    monkeypatch.setattr(checkpointer, "write_checkpoint", write)


@pytest.mark.parametrize("max_steps, save_every, at", [(4, 1, 1), (2, 2, 2), (3, 2, 3)],
                         ids=["periodic", "last-periodic", "final"])
def test_a_signal_during_a_checkpoint_write_stops_right_after_it(max_steps, save_every, at, tmp_path,
                                                                 tiny_model_dir, monkeypatch):
    """The signal is not lost and costs no further step: the run stops once step-`at` is written
    (a periodic one, the last step's, or the final one after the loop), exit 143, no summary."""
    from rlhfkit.trainers.sft import SFTConfig, train

    _signal_while_writing(monkeypatch, at)
    cfg = parse_args(SFTConfig, sft_argv(tmp_path, tiny_model_dir, "sigw", max_steps=max_steps,
                                         save_every=save_every), "rlhfkit sft")
    with pytest.raises(Interrupted) as stopped:
        train(cfg)
    run = tmp_path / "runs" / "sigw"
    assert stopped.value.exit_code == 143 and f"--resume {run}" in str(stopped.value)
    assert latest_checkpoint(run).name == f"step-{at}"
    assert len(read_jsonl(run / "metrics.jsonl")) == at and not (run / "summary.json").exists()


def test_a_second_signal_stops_at_once_naming_the_checkpoint_that_remains(tmp_path, capfd):
    from rlhfkit.runtime.faults import StopSignals

    signals = StopSignals(lambda: f"the newest checkpoint is {tmp_path}/checkpoints/step-3")
    with signals:
        signals._handle(signal.SIGTERM, None)
        with pytest.raises(SystemExit) as stopped:
            signals._handle(signal.SIGTERM, None)
    assert stopped.value.code == 143
    assert capfd.readouterr().err.strip().splitlines()[-1] == (
        f"rlhfkit: SIGTERM again: stopping at once; the newest checkpoint is {tmp_path}/checkpoints/step-3")
