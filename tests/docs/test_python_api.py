"""docs/python-api.md: every example runs as written (a tiny model in place of the default one),
in order, in one namespace, and does what the page says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "python-api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def test_the_examples_run_and_record_what_the_page_says(tmp_path, monkeypatch, tiny_model_dir):
    blocks = BLOCK.findall(PAGE.read_text(encoding="utf-8"))
    assert len(blocks) == 7
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for code in blocks:
            code = code.replace('"smollm2-135m-instruct"', repr(str(tiny_model_dir)))
            exec(compile(code, str(PAGE), "exec"), namespace)  # noqa: S102
    printed = out.getvalue()
    for run in ("grpo-python", "grpo-chat", "grpo-two-rewards", "sft-python", "dpo-python"):
        assert (tmp_path / "runs" / run / "final").is_dir(), run
    assert "{'reward/exact_answer': " in printed and "'reward/length:8': " in printed
    assert "<not recorded: the callable exact_answer cannot be imported back" in printed
    assert "<not recorded: a Dataset object (32 rows, columns prompt, answer)" in printed
    assert "rollout_batch_size (10) must be divisible by group_size (4)" in printed
    assert "8 8 4 1 0 8\n" in printed  # TRL's names: the same work per step, and the LoraConfig


def test_a_module_level_reward_is_recorded_by_import_path_and_read_back(tmp_path):
    from rlhfkit.core.config import build_config, save_config
    from rlhfkit.rewards.builtins import sentiment
    from rlhfkit.trainers.grpo_config import GRPOConfig

    cfg = build_config(GRPOConfig, {"reward": sentiment, "prompts": [{"prompt": "hi"}]})
    save_config(cfg, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved["reward"] == "python:rlhfkit.rewards.builtins:sentiment"
    assert saved["prompts"] == "<not recorded: 1 records in memory; save them to a file to record them>"
    reloaded = build_config(GRPOConfig, {"reward": saved["reward"]})
    from rlhfkit.rewards import get_rewards, score_batch

    assert score_batch(get_rewards(reloaded.reward), ["p"], ["I love it"]) == sentiment(["p"], ["I love it"])


def test_train_refuses_what_is_not_a_config():
    from rlhfkit import train

    with pytest.raises(TypeError, match="train\\(\\) takes an rlhfkit config"):
        train({"model": "x"})
