"""At step 0 every RL path is exact: the first update micro-batch repeats the scoring pass bit for
bit (its ratio is exactly 1, so the ratio check never fires falsely), and the reference equals the
starting policy (the rollout KL is exactly 0; DPO's first loss is log 2).

The matrix runs one iteration of PPO and GRPO on the tiny Llama (2 layers) for every way the
teacher-forced pass can be computed: LoRA on the top layer only (the frozen bottom layer is a
"trunk", kept from scoring for the update or recomputed when it does not fit `trunk_cache_mb`;
GRPO keeps none), LoRA on every layer, full fine-tuning (a frozen reference copy); the shared prompt
prefix (PPO) or shared prompts (GRPO) on or off; fp32 or bf16. The cases that failed before the
fixes run by default (a recomputed trunk scored one way and updated another: 4.8e-7 in fp32 here,
5e-3 in bf16 on deeper models; a whole-model bf16 reference copy: rollout KL 4e-4 at step 0), the
rest are marked slow (about 4 s each on 2 cores).
"""

from __future__ import annotations

import json
import math

import pytest

from rlhfkit.core.config import build_config

PROMPTS = [f"Write a review of thing number {i}." for i in range(32)]
VOWELS = ("def reward(prompts, completions, **kw):\n"
          "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n")
MODELS = {  # name: settings; the tiny Llama has 2 layers
    "lora-top-kept": {"lora": True, "lora_layers": 1, "trunk_cache_mb": 512.0},
    "lora-top-recomputed": {"lora": True, "lora_layers": 1, "trunk_cache_mb": 0.0},
    "lora-all": {"lora": True},
    "full": {"lora": False},
}
FAST = {  # (command, model, share, dtype) run by default: those that failed before, and the demo's defaults
    ("ppo", "lora-top-recomputed", True, "fp32"), ("ppo", "lora-top-kept", True, "bf16"), ("ppo", "full", True, "bf16"),
    ("grpo", "full", True, "bf16"), ("grpo", "lora-top-recomputed", False, "bf16"),
}


def cases():
    for command in ("ppo", "grpo"):
        for model in MODELS:
            if command == "grpo" and model == "lora-top-kept":
                continue  # GRPO keeps no trunk: lora-top-recomputed is its trunk case
            for share in (True, False):
                for dtype in ("fp32", "bf16"):
                    marks = () if (command, model, share, dtype) in FAST else (pytest.mark.slow,)
                    name = f"{command}-{model}-{'shared' if share else 'plain'}-{dtype}"
                    yield pytest.param(command, model, share, dtype, id=name, marks=marks)


def run_rows(tmp_path, command: str, settings: dict) -> list[dict]:
    from rlhfkit.trainers import grpo, ppo
    from rlhfkit.trainers.grpo_config import GRPOConfig
    from rlhfkit.trainers.ppo_config import PPOConfig

    prompts, reward = tmp_path / "prompts.txt", tmp_path / "vowels.py"
    prompts.write_text("\n".join(PROMPTS))
    reward.write_text(VOWELS)
    base = dict(prompts=str(prompts), reward=f"python:{reward}:reward", iterations=1, rollout_batch_size=8,
                mini_batch_size=4, micro_batch_size=2, max_new_tokens=8, num_eval_prompts=0,
                output_dir=str(tmp_path / "runs"), run_name="t", quiet=True, tensorboard=False, **settings)
    if command == "ppo":
        ppo.train(build_config(PPOConfig, {**base, "kl_coef": 0.05}))
    else:
        base.pop("trunk_cache_mb", None)
        grpo.train(build_config(GRPOConfig, {**base, "group_size": 4, "beta": 0.05}))
    return [json.loads(line) for line in (tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("command, model, share, dtype", cases())
def test_first_micro_batch_ratio_is_one_and_the_rollout_kl_is_zero(tmp_path, tiny_model_dir, command, model,
                                                                    share, dtype):
    share_key = "share_prefix" if command == "ppo" else "share_prompts"
    rows = run_rows(tmp_path, command, {"model": str(tiny_model_dir), "dtype": dtype, share_key: share,
                                        **MODELS[model]})
    assert rows[0]["params/ratio_first_microbatch_maxdev"] == 0.0
    assert rows[0]["rollout/kl"] == 0.0


@pytest.mark.parametrize("lora, dtype", [(False, "fp32"), (False, "bf16"), (True, "bf16"),
                                         pytest.param(True, "fp32", marks=pytest.mark.slow)],
                         ids=["full-fp32", "full-bf16", "lora-bf16", "lora-fp32"])
def test_dpo_starts_at_log_2(tmp_path, tiny_model_dir, dtype, lora):
    """pi == pi_ref at step 0, so every pair's loss is -log sigmoid(0) = log 2: the first logged loss
    equals log 2 up to float32 rounding of the mean (relative 1e-6)."""
    from rlhfkit.trainers.dpo import train
    from rlhfkit.trainers.dpo_config import DPOConfig

    rows = []
    for i in range(16):
        rows.append({"prompt": PROMPTS[i], "chosen": ["aa ee", "oo aa ee ii"][i % 2], "rejected": ["brr", "th grr"][i % 2]})
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build_config(DPOConfig, dict(model=str(tiny_model_dir), prefs=str(prefs), max_steps=1, batch_size=8,
                                       micro_batch_size=4, num_eval_prompts=0, dtype=dtype, lora=lora,
                                       output_dir=str(tmp_path / "runs"), run_name="t", quiet=True, tensorboard=False))
    train(cfg)
    first = json.loads((tmp_path / "runs" / "t" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["loss/dpo"] == pytest.approx(math.log(2), rel=1e-6, abs=0)
    assert first["rewards/margin"] == 0.0


@pytest.mark.parametrize("command, share_key", [("ppo", "share_prefix"), ("grpo", "share_prompts")])
def test_static_cache_rollouts_give_ratio_one_at_step_zero(tmp_path, tiny_model_dir, command, share_key):
    """generation_backend=graph (rollout/static_decode.py) samples; the trainer's own pass scores, so
    step 0 stays exact (bf16, LoRA on every layer, shared prefix or prompts)."""
    rows = run_rows(tmp_path, command, {"model": str(tiny_model_dir), "dtype": "bf16", share_key: True,
                                        "generation_backend": "graph", **MODELS["lora-all"]})
    assert rows[0]["params/ratio_first_microbatch_maxdev"] == 0.0
    assert rows[0]["rollout/kl"] == 0.0
