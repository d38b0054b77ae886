"""`micro_batch_size=auto` (runtime/batch_plan.py): golden sizes with the estimate's arithmetic written
out, the CUDA branch with a fake free-memory figure, and CPU runs that stay what they were."""

from __future__ import annotations

import json
import types

import pytest
import torch

from rlhfkit.core import devices
from rlhfkit.core.command_line import parse_args
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.estimate.memory import MemoryArgs, estimate
from rlhfkit.estimate.shape import ModelShape
from rlhfkit.runtime.batch_plan import plan_micro_batch, power_of_two_divisors, run_micro_batch, update_bytes
from rlhfkit.trainers.grpo_config import GRPOConfig
from rlhfkit.trainers.ppo_config import PPOConfig
from rlhfkit.trainers.trpo_config import TRPOConfig

# H 64, intermediate 128, 2 layers, 4 heads (d 16, no GQA), vocabulary 1000
SHAPE = ModelShape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=4, vocab=1000, tied=True)
CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 4, "vocab_size": 1000, "tie_word_embeddings": True}
# PPO, LoRA r=4 on both layers, bf16, one GPU, prompt 8 + response 8 tokens, a step of 32 of 64 rows
ARGS = MemoryArgs(model="(tiny)", method="ppo", lora_r=4, lora_layers=None, dtype="bf16", prompt_length=8,
                  max_new_tokens=8, rollout_batch_size=64, mini_batch_size=32)
# LoRA parameters T per layer: r x (in + out) = 4 x 128 for q, k, v, o; 4 x 192 for gate, up, down
T = 2 * (4 * 4 * 128 + 3 * 4 * 192)  # 8704
FIXED = T * 4 + T * 8 + (64 + 1) * 16  # gradients + AdamW moments + the value head: 105_488
# per sequence: activations L x S x H x 34 / 2 x b_c = 2 x 16 x 64 x 34, logits R x V x 8 = 8 x 1000 x 8
PER_SEQUENCE = 2 * 16 * 64 * 34 + 8 * 1000 * 8  # 133_632


def test_update_bytes_is_the_estimate_s_arithmetic():
    assert T == 8704 and FIXED == 105_488 and PER_SEQUENCE == 133_632
    for m in (1, 8, 32):
        est = estimate(MemoryArgs(**{**vars(ARGS), "micro_batch_size": m}), SHAPE)
        assert update_bytes(est) == FIXED + m * PER_SEQUENCE


def test_power_of_two_divisors():
    assert power_of_two_divisors(48) == [1, 2, 4, 8, 16]
    assert power_of_two_divisors(32) == [1, 2, 4, 8, 16, 32]
    assert power_of_two_divisors(7) == [1]


def test_the_largest_power_of_two_that_fits_90_percent_of_the_free_memory():
    need = {m: FIXED + m * PER_SEQUENCE for m in (8, 16, 32)}  # 1_174_544, 2_243_600, 4_381_712
    # 0.9 x 3_000_000 = 2_700_000 holds 16 sequences, not 32
    assert plan_micro_batch(ARGS, 3_000_000, cpu_default=8, shape=SHAPE)[0] == 16
    assert need[16] <= 0.9 * 3_000_000 < need[32]
    # 0.9 x 5_000_000 = 4_500_000 holds the whole step of 32
    size, reason = plan_micro_batch(ARGS, 5_000_000, cpu_default=8, shape=SHAPE)
    assert size == 32 and need[32] <= 0.9 * 5_000_000
    # the figure printed per sequence is the marginal one, PER_SEQUENCE / 2^30 = 0.000124 GiB
    assert reason == "auto: 0.00466 GiB free, estimate 0.00012 GiB per sequence"
    # 0.9 x 1_000_000 holds not even the floor (8): the floor, said so
    size, reason = plan_micro_batch(ARGS, 1_000_000, cpu_default=8, shape=SHAPE)
    assert size == 8 and reason.endswith("not even 8 fits 90% of it, kept 8")


def test_on_the_cpu_auto_is_the_trainer_s_number_or_the_power_of_two_below_it():
    assert plan_micro_batch(ARGS, None, cpu_default=8, shape=SHAPE) == (8, "auto: the CPU default")
    twelve = MemoryArgs(**{**vars(ARGS), "mini_batch_size": 12})
    assert plan_micro_batch(twelve, None, cpu_default=8, shape=SHAPE) == (
        4, "auto: the CPU default; 8 does not divide the 12 rows of a step")
    # on a GPU the floor of a step of 12 is 4 too, and 8 is no candidate (it does not divide 12)
    assert plan_micro_batch(twelve, 10**9, cpu_default=8, shape=SHAPE)[0] == 4


def ppo_cfg(**kw) -> PPOConfig:
    return build_config(PPOConfig, {"rollout_batch_size": 64, "mini_batch_size": 32, "max_new_tokens": 8,
                                    "lora_layers": None, "lora_r": 4, "dtype": "bf16", **kw})


def test_the_cuda_branch_asks_the_device_for_its_free_memory():
    asked = []

    def free(device):
        asked.append(device)
        return 3_000_000

    cuda = torch.device("cuda")  # a name only: nothing is allocated on it
    assert run_micro_batch(ppo_cfg(micro_batch_size="auto"), "ppo", CONFIG, 8, 1, cuda, free)[0] == 16
    assert asked == [cuda]
    assert run_micro_batch(ppo_cfg(micro_batch_size="auto"), "ppo", CONFIG, 8, 1, torch.device("cpu"), free) == (
        8, "auto: the CPU default")
    assert run_micro_batch(ppo_cfg(micro_batch_size=4), "ppo", CONFIG, 8, 1, cuda, free) == (4, None)
    assert len(asked) == 1  # a number never asks


def test_the_option_takes_a_number_or_auto():
    assert parse_args(PPOConfig, ["micro_batch_size=auto"], "rlhfkit ppo").micro_batch_size == "auto"
    assert parse_args(PPOConfig, ["micro_batch_size=4"], "rlhfkit ppo").micro_batch_size == 4
    assert build_config(GRPOConfig, {"micro_batch_size": "auto"}).micro_batch_size == "auto"
    assert build_config(GRPOConfig, {}).micro_batch_size == 16 and build_config(PPOConfig, {}).micro_batch_size == 8
    for bad, message in ((["micro_batch_size=big"], "micro_batch_size ('big') must be an integer or auto"),
                         (["micro_batch_size=0"], "micro_batch_size (0) must be >= 1"),
                         (["micro_batch_size=3"], "mini_batch_size (8) must be divisible by micro_batch_size (3)")):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            parse_args(PPOConfig, bad, "rlhfkit ppo")
    with pytest.raises(ConfigError, match="trpo takes a number"):
        parse_args(TRPOConfig, ["micro_batch_size=auto"], "rlhfkit trpo")


def test_a_run_set_up_on_cuda_plans_the_micro_batch_and_says_why(tiny_model_dir, tiny_tokenizer, monkeypatch):
    """runtime/batch_plan.py `micro_batch_of_run` as RLRun calls it, the device a CUDA name with a fake free figure."""
    from rlhfkit.runtime.batch_plan import micro_batch_of_run

    monkeypatch.setattr(devices, "free_cuda_bytes", lambda device: 2**30)
    launch = types.SimpleNamespace(world=1, device=torch.device("cuda"))
    actor = types.SimpleNamespace(policy=types.SimpleNamespace(config=types.SimpleNamespace(to_dict=lambda: CONFIG)))
    records = [{"prompt": "a b c"}, {"prompt": "a b c d e f"}]
    size, reason = micro_batch_of_run(ppo_cfg(micro_batch_size="auto"), "ppo", actor, tiny_tokenizer, records, None,
                                      launch)
    assert size == 32  # 1 GiB holds the whole step
    assert reason.startswith("auto: 1 GiB free, estimate ")
    assert micro_batch_of_run(ppo_cfg(micro_batch_size=4), "ppo", actor, tiny_tokenizer, records, None,
                              launch) == (4, None)  # a number: no reason to print or record


def test_auto_on_the_cpu_trains_exactly_as_the_number_it_stands_for(tmp_path, tiny_model_dir):
    from rlhfkit.trainers.ppo import train

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(f"Write a review of thing number {i}." for i in range(32)))

    def run(name: str, micro) -> tuple[list[dict], dict]:
        cfg = build_config(PPOConfig, dict(model=str(tiny_model_dir), prompts=str(prompts), reward="length:3",
                                           iterations=1, rollout_batch_size=8, mini_batch_size=8, max_new_tokens=8,
                                           micro_batch_size=micro, num_eval_prompts=0, dtype="fp32",
                                           output_dir=str(tmp_path / "runs"), run_name=name, quiet=True,
                                           tensorboard=False))
        train(cfg)
        folder = tmp_path / "runs" / name
        rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(("timing/", "throughput/", "memory/"))}
                for r in rows], json.loads((folder / "summary.json").read_text())

    auto_rows, auto_summary = run("auto", "auto")
    number_rows, number_summary = run("eight", 8)
    assert auto_rows == number_rows
    assert auto_summary["micro_batch_size"] == {"size": 8, "reason": "auto: the CPU default"}
    assert "micro_batch_size" not in number_summary
