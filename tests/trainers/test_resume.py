"""Exact resume for every trainer: 4 steps straight == 2 steps, stopped by SIGTERM, resumed, 2 more.

Every metric but timing/throughput must be bit-for-bit equal (torch is deterministic on CPU), as
must the logged samples and the before/after evaluation. The runs are tiny, but they exercise what
a resume must restore: LoRA dropout (SFT: the global torch RNG), the data order, torch.Generator
shuffles, an adaptive KL coefficient, the lr warm-up, AdamW moments and the held-out evaluation.
"""

from __future__ import annotations

import dataclasses
import json
import signal

import pytest
import torch

from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.core.run_files import latest_checkpoint
from rlhfkit.runtime import tracker as tracker_mod
from rlhfkit.runtime.faults import Interrupted

VOWELS = ("def reward(prompts, completions, **kw):\n"
          "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n")
GOOD = ["It was great, lovely coffee.", "Kind staff and lovely music.", "I loved the ending."]
BAD = ["Terrible and boring.", "I hated the film.", "Boring music, terrible ending."]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _prefs(tmp_path):
    return _write(tmp_path / "prefs.jsonl", [
        {"prompt": f"Write a short review of thing {i}.", "chosen": GOOD[i % 3], "rejected": BAD[(i + 1) % 3],
         "split": "test" if i >= 12 else "train"} for i in range(16)])


def _prompts(tmp_path):
    (tmp_path / "prompts.txt").write_text("\n".join(f"Write a review of thing number {i}." for i in range(32)))
    return str(tmp_path / "prompts.txt")


def _reward(tmp_path):
    (tmp_path / "vowels.py").write_text(VOWELS)
    return f"python:{tmp_path / 'vowels.py'}:reward"


def sft_cfg(tmp_path):
    from rlhfkit.trainers.sft import SFTConfig

    data = _write(tmp_path / "sft.jsonl", [
        {"prompt": f"Write a short review of thing {i}.", "response": GOOD[i % 3] if i % 2 else BAD[i % 3],
         "split": "test" if i >= 12 else "train"} for i in range(16)])
    # lora_dropout > 0: the dropout masks come from the global torch RNG, which must be restored
    return SFTConfig, dict(data=data, max_steps=4, batch_size=2, micro_batch_size=1, max_length=64, eval_every=2,
                           lora_dropout=0.1, lr=1e-2, warmup_steps=3)


def rm_cfg(tmp_path):
    from rlhfkit.trainers.rm import RMConfig

    return RMConfig, dict(data=_prefs(tmp_path), max_steps=4, batch_size=4, micro_batch_size=2, max_length=64,
                          eval_every=2, lr=1e-2, warmup_steps=3, stats_pairs=4)


def dpo_cfg(tmp_path):
    from rlhfkit.trainers.dpo_config import DPOConfig

    return DPOConfig, dict(prefs=_prefs(tmp_path), epochs=2, max_steps=4, batch_size=4, micro_batch_size=2,
                           num_eval_prompts=2, eval_samples_per_prompt=1, max_new_tokens=4, lr=1e-2,
                           warmup_steps=3)


def ppo_cfg(tmp_path):
    from rlhfkit.trainers.ppo_config import PPOConfig

    return PPOConfig, dict(prompts=_prompts(tmp_path), reward="length:3", iterations=4, rollout_batch_size=8,
                           mini_batch_size=4, micro_batch_size=2, max_new_tokens=6, num_eval_prompts=2,
                           adaptive_kl=True, kl_target=0.01, kl_horizon=100, lr=1e-2, warmup_steps=10)


def grpo_cfg(tmp_path):
    from rlhfkit.trainers.grpo_config import GRPOConfig

    return GRPOConfig, dict(prompts=_prompts(tmp_path), reward=_reward(tmp_path), iterations=4, rollout_batch_size=8,
                            group_size=4, mini_batch_size=4, micro_batch_size=2, max_new_tokens=6, beta=0.05,
                            num_eval_prompts=2, lr=1e-2, warmup_steps=10)


TRAINERS = {"sft": sft_cfg, "rm": rm_cfg, "dpo": dpo_cfg, "ppo": ppo_cfg, "grpo": grpo_cfg}


def _train(name):
    import importlib

    return importlib.import_module(f"rlhfkit.trainers.{name}").train


def make_cfg(name, tmp_path, tiny_model_dir, run_name, **over):
    cls, kw = TRAINERS[name](tmp_path)
    kw.update(model=str(tiny_model_dir), dtype="fp32", output_dir=str(tmp_path / "runs"), run_name=run_name,
              quiet=True, tensorboard=False)
    kw.update(over)
    return build_config(cls, kw)


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def comparable(rows):
    """Rows without wall-clock measurements (everything else must match exactly)."""
    return [{k: v for k, v in r.items() if not k.startswith(("timing/", "throughput/"))} for r in rows]


def stop_after(monkeypatch, iteration, signum=signal.SIGTERM):
    """Send `signum` to this process right after `iteration` is logged, as a user would."""
    real_log = tracker_mod.Tracker.log

    def log(self, it, metrics):
        out = real_log(self, it, metrics)
        if it == iteration:
            signal.raise_signal(signum)
        return out

    monkeypatch.setattr(tracker_mod.Tracker, "log", log)


def assert_same_run(a, b):
    assert comparable(read_jsonl(b / "metrics.jsonl")) == comparable(read_jsonl(a / "metrics.jsonl"))
    assert read_jsonl(b / "samples.jsonl") == read_jsonl(a / "samples.jsonl")
    assert read_jsonl(b / "diagnostics.jsonl") == read_jsonl(a / "diagnostics.jsonl")  # no repeated findings
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    for key in ("eval_before", "eval_after", "held_out", "win_rate", "score_stats"):
        assert sb.get(key) == sa.get(key), key


@pytest.mark.parametrize("name", list(TRAINERS))
def test_stop_and_resume_equals_an_uninterrupted_run(name, tmp_path, tiny_model_dir, monkeypatch):
    train = _train(name)
    straight = make_cfg(name, tmp_path, tiny_model_dir, "straight", save_every=0)
    train(straight)
    runs = tmp_path / "runs"
    rows = read_jsonl(runs / "straight" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]
    assert len({r.get("params/lr") for r in rows}) > 1, "the lr warm-up must be visible in the compared rows"

    cut = make_cfg(name, tmp_path, tiny_model_dir, "cut", save_every=0)
    with monkeypatch.context() as m:
        stop_after(m, 1)
        with pytest.raises(Interrupted) as stopped:
            train(cut)
    assert stopped.value.exit_code == 128 + signal.SIGTERM
    assert f"--resume {runs / 'cut'}" in str(stopped.value)
    assert latest_checkpoint(runs / "cut").name == "step-2"  # save_every=0: written only because it was stopped
    assert not (runs / "cut" / "summary.json").exists()
    assert len(read_jsonl(runs / "cut" / "metrics.jsonl")) == 2

    train(dataclasses.replace(cut, resume=str(runs / "cut")))
    assert_same_run(runs / "straight", runs / "cut")


def test_a_finished_run_continues_with_more_iterations_from_the_command_line(tmp_path, tiny_model_dir):
    """`rlhfkit ppo --resume RUN iterations=4` after a 2-iteration run: the saved config.yaml is
    the base, the override extends the run, and rows 0-3 equal a 4-iteration run's."""
    from rlhfkit.trainers.ppo import train
    from rlhfkit.trainers.ppo_config import PPOConfig

    runs = tmp_path / "runs"
    train(make_cfg("ppo", tmp_path, tiny_model_dir, "straight"))
    train(make_cfg("ppo", tmp_path, tiny_model_dir, "short", iterations=2, save_every=5))
    assert latest_checkpoint(runs / "short").name == "step-2"  # the end-of-run checkpoint
    cfg = parse_args(PPOConfig, ["--resume", str(runs / "short"), "iterations=4"], "rlhfkit ppo")
    assert (cfg.iterations, cfg.resume, cfg.model, cfg.save_every) == (4, str(runs / "short"),
                                                                       str(tiny_model_dir), 5)
    train(cfg)
    # Each iteration logged once; the evaluation before training is the first part's, the one
    # after it sees the same model as the uninterrupted run's.
    straight, short = runs / "straight", runs / "short"
    assert comparable(read_jsonl(short / "metrics.jsonl")) == comparable(read_jsonl(straight / "metrics.jsonl"))
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (straight, short))
    assert sb["eval_before"] == sa["eval_before"] and sb["eval_after"] == sa["eval_after"]
    assert [p.name for p in sorted((short / "checkpoints").iterdir())] == ["step-2", "step-4"]


def test_resume_auto_starts_fresh_then_continues(tmp_path, tiny_model_dir, monkeypatch):
    from rlhfkit.trainers.sft import train

    cfg = make_cfg("sft", tmp_path, tiny_model_dir, "auto", resume="auto", save_every=0)
    with monkeypatch.context() as m:
        stop_after(m, 0)
        with pytest.raises(Interrupted):
            train(cfg)  # nothing to resume: a fresh run
    assert latest_checkpoint(tmp_path / "runs" / "auto").name == "step-1"
    train(cfg)  # the same command again continues it
    rows = read_jsonl(tmp_path / "runs" / "auto" / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3]


def test_resume_errors_are_one_line(tmp_path, tiny_model_dir):
    from rlhfkit.errors import ConfigError, UserError
    from rlhfkit.trainers.sft import SFTConfig, train

    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="has no complete checkpoint"):
        train(make_cfg("sft", tmp_path, tiny_model_dir, "x", resume=str(tmp_path / "empty")))
    train(make_cfg("sft", tmp_path, tiny_model_dir, "done"))  # 4 steps, then the end-of-run checkpoint
    with pytest.raises(UserError, match="after 4 steps, but this run is set to 2"):
        train(make_cfg("sft", tmp_path, tiny_model_dir, "done", resume=str(tmp_path / "runs" / "done"), max_steps=2))
    with pytest.raises(UserError, match="is not a run folder"):
        parse_args(SFTConfig, ["--resume", str(tmp_path / "nowhere")], "rlhfkit sft")
    with pytest.raises(ConfigError, match="--resume needs a run folder"):
        parse_args(SFTConfig, ["--resume"], "rlhfkit sft")
    for bad in ("save_every=-1", "keep_checkpoints=0", "max_nonfinite_steps=0"):
        with pytest.raises(ConfigError, match=bad.split("=")[0]):
            parse_args(SFTConfig, [bad], "rlhfkit sft")


def test_lr_weight_decay_and_eps_overrides_apply_on_resume(tmp_path, tiny_model_dir):
    """`--resume RUN lr=... weight_decay=... adam_eps=...`: the optimiser takes the new values, not
    the checkpoint's, and params/lr shows the new lr on the warm-up schedule at once."""
    from rlhfkit.trainers.sft import SFTConfig, train

    runs = tmp_path / "runs"
    train(make_cfg("sft", tmp_path, tiny_model_dir, "over", max_steps=2, warmup_steps=8))
    seen = []
    real = torch.optim.AdamW.step

    def step(self, *a, **kw):
        seen.append([(g["lr"], g["weight_decay"], g["eps"]) for g in self.param_groups])
        return real(self, *a, **kw)

    cfg = parse_args(SFTConfig, ["--resume", str(runs / "over"), "max_steps=4", "lr=1e-3", "weight_decay=0.5",
                                 "adam_eps=1e-6"], "rlhfkit sft")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.optim.AdamW, "step", step)
        train(cfg)
    rows = read_jsonl(runs / "over" / "metrics.jsonl")
    # warm-up factor (s + 1) / 8 after optimiser step s (0-based): steps 2 and 3 -> 4/8, 5/8 of 1e-3
    assert [r["params/lr"] for r in rows[2:]] == pytest.approx([1e-3 * 4 / 8, 1e-3 * 5 / 8], rel=1e-12)
    # the optimiser stepped with lr 1e-3 x 3/8 (the factor in force after 2 steps), then 4/8
    assert [s[0] for s in seen] == [(pytest.approx(1e-3 * 3 / 8, rel=1e-12), 0.5, 1e-6),
                                    (pytest.approx(1e-3 * 4 / 8, rel=1e-12), 0.5, 1e-6)]


def test_the_judged_evaluation_is_logged_once_however_often_a_run_is_resumed(tmp_path, tiny_model_dir):
    """dpo logs its after-training judged samples (2 prompts x 1 sample) once: resuming the finished
    run, or extending it, replaces them instead of adding a second copy."""
    from rlhfkit.trainers.dpo import train

    cfg = make_cfg("dpo", tmp_path, tiny_model_dir, "judged", max_steps=2)
    run = tmp_path / "runs" / "judged"
    train(cfg)
    first = read_jsonl(run / "samples.jsonl")
    assert len(first) == 2
    train(dataclasses.replace(cfg, resume=str(run)))  # the finished run again
    assert read_jsonl(run / "samples.jsonl") == first
    train(dataclasses.replace(cfg, resume=str(run), max_steps=3))  # one step more
    rows = read_jsonl(run / "samples.jsonl")
    assert len(rows) == 2 and {r["iteration"] for r in rows} == {3}


def test_a_truncated_newest_checkpoint_is_skipped_with_a_notice_naming_the_file(tmp_path, tiny_model_dir, capsys):
    from rlhfkit.trainers.sft import train

    cfg = make_cfg("sft", tmp_path, tiny_model_dir, "damaged", max_steps=3, save_every=1)
    train(cfg)
    run = tmp_path / "runs" / "damaged"
    weights = run / "checkpoints" / "step-3" / "trainable.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # a full disk or a bad copy
    capsys.readouterr()
    train(dataclasses.replace(cfg, resume=str(run), max_steps=4))
    out = "".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "".join(f"[resume] skipping step-3: {weights} has 1000 bytes".split()) in out
    assert "resumingfromstep-2instead" in out
    assert [r["iteration"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2, 3]


def test_resuming_another_commands_run_or_with_another_model_is_one_line(tmp_path, tiny_model_dir):
    """`rlhfkit sft --resume DPO_RUN` names the run's command (not "unknown config key 'judge'"),
    and model= on resume is refused before anything loads (it kept the old before-evaluation)."""
    from rlhfkit.errors import ConfigError, UserError
    from rlhfkit.trainers.dpo import train as train_dpo
    from rlhfkit.trainers.sft import SFTConfig
    from rlhfkit.trainers.sft import train as train_sft

    runs = tmp_path / "runs"
    train_dpo(make_cfg("dpo", tmp_path, tiny_model_dir, "pref", max_steps=1))
    with pytest.raises(ConfigError, match=f"resume: {runs / 'pref'} is a dpo run, not a sft run: continue it with "
                                          f"rlhfkit dpo --resume {runs / 'pref'}"):
        parse_args(SFTConfig, ["--resume", str(runs / "pref")], "rlhfkit sft")
    from rlhfkit import api  # the Python API gives the command line's message, not "missing [...lora...]"

    with pytest.raises(ConfigError, match=f"resume: {runs / 'pref'} is a dpo run, not a sft run: continue it with "
                                          f"rlhfkit dpo --resume {runs / 'pref'}"):
        api.train(make_cfg("sft", tmp_path, tiny_model_dir, "pref", resume=str(runs / "pref")))

    done = make_cfg("sft", tmp_path, tiny_model_dir, "m", max_steps=1)
    train_sft(done)
    other = tmp_path / "other-model"
    with pytest.raises(UserError, match=f"resume: model={other}, but {runs / 'm'} trains {tiny_model_dir}: a run "
                                        "continues with its own model"):
        train_sft(dataclasses.replace(done, resume=str(runs / "m"), model=str(other), max_steps=2))
    train_sft(dataclasses.replace(done, resume=str(runs / "m"), model=str(tiny_model_dir) + "/", max_steps=2))
