"""Online DPO trainer tests on a tiny random Llama (seconds on CPU): the judge's pairs, step 0 at
log 2, ties, split invariance of the DPO step, exact resume."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from test_resume import assert_same_run, stop_after

from rlhfkit.commands import command_main
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.runtime.faults import Interrupted
from rlhfkit.trainers.online_dpo import judge_pairs, train
from rlhfkit.trainers.online_dpo_config import OnlineDPOConfig

VOWELS = ("def reward(prompts, completions, **kw):\n"
          "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n")


def tiny_cfg(tmp_path, tiny_model_dir, judge=VOWELS, **kw) -> OnlineDPOConfig:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Write a review of thing number {i}." for i in range(16)))
    rw = tmp_path / "judge.py"
    rw.write_text(judge)
    base = dict(model=str(tiny_model_dir), prompts=str(prompts), judge=f"python:{rw}:reward", iterations=2,
                prompts_per_iteration=4, micro_batch_size=2, max_new_tokens=6, num_eval_prompts=0, dtype="fp32",
                output_dir=str(tmp_path / "runs"), run_name="t", quiet=True, tensorboard=False)
    base.update(kw)
    return build_config(OnlineDPOConfig, base)


def rows_of(tmp_path, name="t"):
    return [json.loads(line) for line in (tmp_path / "runs" / name / "metrics.jsonl").read_text().splitlines()]


def test_judge_pairs_golden():
    # pairs (0, 1), (2, 3), (4, 5), (6, 7): second wins, first wins, tie, first wins
    chosen, rejected = judge_pairs(torch.tensor([0.1, 0.9, 0.5, 0.2, 0.3, 0.3, 1.0, -1.0]))
    assert chosen.tolist() == [1, 2, 6] and rejected.tolist() == [0, 3, 7]


def test_first_step_is_at_log2_and_the_step_is_split_invariant(tmp_path, tiny_model_dir):
    """LoRA starts at pi = pi_ref: the first DPO loss is log 2. Full fine-tuning with 1 or 4 pairs per
    micro-batch: the same samples (sampling precedes the step), the same losses and gradients."""
    train(tiny_cfg(tmp_path, tiny_model_dir, run_name="lora", iterations=1))
    first = rows_of(tmp_path, "lora")[0]
    assert first["loss/dpo"] == pytest.approx(math.log(2), abs=1e-6) and first["rewards/margin"] == 0.0
    assert first["rollout/pairs"] + 4 * first["rollout/tie_fraction"] == pytest.approx(4.0)
    runs = {}
    for micro in (1, 4):
        train(tiny_cfg(tmp_path, tiny_model_dir, run_name=f"m{micro}", micro_batch_size=micro, lora=False, lr=1e-2))
        runs[micro] = rows_of(tmp_path, f"m{micro}")
    for a, b in zip(runs[1], runs[4]):
        assert a["rollout/score_mean"] == b["rollout/score_mean"]
        for key in ("loss/dpo", "params/grad_norm", "rewards/margin", "logps/chosen"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


def test_ties_give_no_pair_and_no_step(tmp_path, tiny_model_dir):
    const = "def reward(prompts, completions, **kw):\n    return [0.5] * len(completions)\n"
    train(tiny_cfg(tmp_path, tiny_model_dir, judge=const, iterations=1))
    row = rows_of(tmp_path)[0]
    assert row["rollout/pairs"] == 0.0 and row["rollout/tie_fraction"] == 1.0 and "loss/dpo" not in row


def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path, tiny_model_dir, monkeypatch):
    kw = dict(iterations=4, prompts_per_iteration=2, num_eval_prompts=1, eval_samples_per_prompt=1, lr=1e-2,
              warmup_steps=3, save_every=0, max_new_tokens=4)
    train(tiny_cfg(tmp_path, tiny_model_dir, run_name="straight", **kw))
    cut = tiny_cfg(tmp_path, tiny_model_dir, run_name="cut", **kw)
    with monkeypatch.context() as m:
        stop_after(m, 1)
        with pytest.raises(Interrupted):
            train(cut)
    train(dataclasses.replace(cut, resume=str(tmp_path / "runs" / "cut")))
    assert_same_run(tmp_path / "runs" / "straight", tmp_path / "runs" / "cut")
    summary = json.loads((tmp_path / "runs" / "cut" / "summary.json").read_text())
    assert {"win_rate", "eval_before", "eval_after", "judge"} <= set(summary)


def test_config_errors_and_help(capsys):
    with pytest.raises(ConfigError, match=r"label_smoothing \(0.1\) applies to sigmoid/cdpo/robust, not ipo"):
        build_config(OnlineDPOConfig, {"loss_type": "ipo", "label_smoothing": 0.1})
    with pytest.raises(ConfigError, match=r"temperature \(0.0\) must be > 0 for sampled pairs"):
        build_config(OnlineDPOConfig, {"temperature": 0.0})
    assert command_main("online-dpo")(["--help"]) == 0
    out = capsys.readouterr().out
    for f in dataclasses.fields(OnlineDPOConfig):
        assert f"  {f.name} (" in out, f.name
