"""RunConsole (bars on a terminal, plain lines otherwise) and the metric sinks."""

from __future__ import annotations

import io
import json
import sys
import types

import pytest
from rich.console import Console

from rlhfkit.diagnostics import Finding
from rlhfkit.diagnostics import sinks as sinks_mod
from rlhfkit.diagnostics.console import RunConsole
from rlhfkit.errors import UserError

METRICS = {"rollout/reward_mean": 0.3125, "rollout/kl": 1.5, "params/policy_clip_frac": 0.05,
           "params/lr": 1e-5, "timing/rollout_s": 3.0, "text": "ignored"}
FINDING = Finding("policy_clip_frac", "critical", 7, "policy clip fraction averages 0.8 [bold]x[/bold]",
                  {"iterations": [5, 6, 7]}, "reduce the learning rate 5-10x")


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=100, color_system=None), buf


def _run(rc: RunConsole) -> None:
    for it in range(3):
        with rc.phase("rollout", total=4) as bar:
            for _ in range(4):
                bar.advance()
        with rc.phase("update", total=None) as bar:
            bar.advance(2)
        rc.log_iteration(it, METRICS)
    rc.show_findings([FINDING])
    rc.print("[rlhfkit] saved checkpoint")
    rc.close()


def test_quiet_mode_prints_one_plain_line_per_iteration():
    console, buf = _console(terminal=True)
    _run(RunConsole(3, quiet=True, console=console))
    lines = buf.getvalue().splitlines()
    its = [line for line in lines if line.startswith("it ")]
    assert len(its) == 3
    assert its[0].startswith("it 1/3 reward=0.312 kl=1.5 clip=0.05 lr=1e-05")  # counted from 1 on screen
    assert "\x1b" not in buf.getvalue()  # no progress bar escape codes
    assert "[critical] policy_clip_frac @ it 7: policy clip fraction averages 0.8 [bold]x[/bold]" in buf.getvalue()
    assert "[rlhfkit] saved checkpoint" in lines


def test_not_a_tty_has_no_bars_but_a_table():
    console, buf = _console(terminal=False)
    rc = RunConsole(3, console=console)
    assert rc.bars is False
    _run(rc)
    out = buf.getvalue()
    assert "iteration 3/3" in out and "reward" in out and "0.312" in out  # the last of 3 is 3/3
    assert "CRITICAL policy_clip_frac @ it 7" in out and "-> reduce the learning rate" in out
    assert "[bold]x[/bold]" in out and "[rlhfkit] saved checkpoint" in out  # no markup interpreted


def test_terminal_draws_bars_and_stops_them():
    console, buf = _console(terminal=True)
    rc = RunConsole(3, console=console)
    assert rc.bars is True
    _run(rc)
    assert "rollout" in buf.getvalue() and "iterations" in buf.getvalue()
    assert rc._progress is not None and not rc._progress.live.is_started
    assert rc._progress.tasks[0].completed == 3  # the overall bar followed log_iteration


def test_phase_without_with_and_default_console(capsys):
    rc = RunConsole(0)
    phase = rc.phase("scoring", total=2)
    phase.advance()
    phase.close()
    rc.log_iteration(0, {})
    rc.close()
    assert "iteration 1" in capsys.readouterr().out  # row 0 of metrics.jsonl, shown counted from 1


# ---- sinks --------------------------------------------------------------------------------------
class FakeWriter:
    instances: list[FakeWriter] = []

    def __init__(self, log_dir, purge_step=None):
        self.log_dir, self.scalars, self.closed = log_dir, [], False
        FakeWriter.instances.append(self)

    def add_scalar(self, key, value, global_step):
        self.scalars.append((key, value, global_step))

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_tensorboard_auto_when_available(tmp_path, monkeypatch):
    monkeypatch.setattr(sinks_mod, "_summary_writer_cls", lambda: FakeWriter)
    sinks = sinks_mod.make_sinks(tmp_path)
    assert len(sinks) == 1
    sinks[0].log(3, METRICS)
    sinks[0].close()
    w = FakeWriter.instances[-1]
    assert w.log_dir == str(tmp_path / "tensorboard") and w.closed
    assert ("rollout/kl", 1.5, 3) in w.scalars and all(k != "text" for k, _, _ in w.scalars)
    assert sinks_mod.make_sinks(tmp_path, tensorboard=False) == []


def test_tensorboard_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(sinks_mod, "_summary_writer_cls", lambda: None)
    assert sinks_mod.make_sinks(tmp_path) == []  # auto: silently off
    with pytest.raises(UserError, match="pip install 'rlhfkit\\[tensorboard\\]'"):
        sinks_mod.make_sinks(tmp_path, tensorboard=True)


def test_tensorboard_failure_turns_the_sink_off(tmp_path, monkeypatch, caplog):
    class Broken(FakeWriter):
        def add_scalar(self, *a, **k):
            raise OSError("disk full")

    monkeypatch.setattr(sinks_mod, "_summary_writer_cls", lambda: Broken)
    sink = sinks_mod.make_sinks(tmp_path)[0]
    sink.log(0, METRICS)
    sink.log(1, METRICS)  # no exception
    assert "disk full" in caplog.text


def _fake_wandb(monkeypatch, fail: bool = False):
    calls: dict = {}

    class Run:
        def log(self, data, step):
            calls.setdefault("log", []).append((step, data))

        def finish(self):
            calls["finished"] = True

    def init(**kwargs):
        if fail:
            raise RuntimeError("no network")
        calls["init"] = kwargs
        return Run()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    return calls


def test_wandb_offline_by_default(tmp_path, monkeypatch):
    monkeypatch.setattr(sinks_mod, "_summary_writer_cls", lambda: None)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    calls = _fake_wandb(monkeypatch)
    assert sinks_mod.make_sinks(tmp_path, wandb=False) == []  # only when asked
    (sink,) = sinks_mod.make_sinks(tmp_path, wandb=True, project="p", config={"lr": 1e-5})
    sink.log(2, {**METRICS, "loss/value": float("nan")})
    sink.close()
    assert calls["init"]["mode"] == "offline" and calls["init"]["project"] == "p"
    assert calls["init"]["config"] == {"lr": 1e-5} and calls["init"]["dir"] == str(tmp_path)
    step, data = calls["log"][0]
    assert step == 2 and data["rollout/kl"] == 1.5 and "loss/value" not in data and "text" not in data
    assert calls["finished"]


def test_wandb_mode_from_env_and_failures(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(sinks_mod, "_summary_writer_cls", lambda: None)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    calls = _fake_wandb(monkeypatch)
    sinks_mod.make_sinks(tmp_path, wandb=True)
    assert calls["init"]["mode"] == "disabled"
    _fake_wandb(monkeypatch, fail=True)
    assert sinks_mod.make_sinks(tmp_path, wandb=True) == []
    assert "no network" in caplog.text
    monkeypatch.setitem(sys.modules, "wandb", None)  # not installed
    with pytest.raises(UserError, match="pip install 'rlhfkit\\[wandb\\]'"):
        sinks_mod.make_sinks(tmp_path, wandb=True)


def test_jsonl_sink(tmp_path, monkeypatch):
    monkeypatch.setattr(sinks_mod, "_summary_writer_cls", lambda: None)
    (sink,) = sinks_mod.make_sinks(tmp_path, metrics_jsonl=True)
    sink.log(0, {"a": 1.0, "b": float("inf"), "c": "x"})
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"iteration": 0, "a": 1.0, "b": "inf"}
