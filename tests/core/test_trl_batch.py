"""TRL 1.16's batch, generation and iteration options as the same work per optimiser step.

The arithmetic is TRL's GRPOConfig.__post_init__ (trl/trainer/grpo_config.py): with P =
per_device_train_batch_size, A = gradient_accumulation_steps, S = steps_per_generation (default A),
one process: a generation is P x S completions, an optimiser step P x A, and a generation feeds
num_iterations x S / A optimiser steps."""

from __future__ import annotations

import pytest

from rlhfkit.core.command_line import help_text, parse_args
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.grpo_config import GRPOConfig
from rlhfkit.trainers.ppo_config import PPOConfig
from rlhfkit.trainers.sft_config import SFTConfig


def _batches(cfg):
    return cfg.rollout_batch_size, cfg.mini_batch_size, cfg.micro_batch_size, cfg.update_epochs


def test_trl_defaults_sample_what_trl_samples(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    # TRL: P=8, A=1 -> S=1, generation_batch_size = 8 x 1 = 8 completions (1 prompt x 8), one step each
    cfg = GRPOConfig(per_device_train_batch_size=8, num_generations=8)
    assert _batches(cfg) == (8, 8, 8, 1)  # not rlhfkit's 64 completions x 2 epochs
    assert (cfg.optimiser_steps_per_iteration, cfg.prompts_per_iteration) == (1, 1)
    assert (cfg.warmup_steps, cfg.lr_scheduler_type) == (0, "linear")  # TRL has no warm-up; decays linearly
    err = capsys.readouterr().err
    assert err == ("rlhfkit: TRL's batch options: each optimiser step trains on 8 completions (8 per forward/backward "
                   "x 1 accumulated); each generation samples 8 completions and feeds 1 optimiser step "
                   "(num_iterations 1) (rlhfkit: rollout_batch_size=8, mini_batch_size=8, micro_batch_size=8, "
                   "update_epochs=1; TRL's defaults warmup_steps=0, lr_scheduler_type=linear)\n")


@pytest.mark.parametrize(("trl", "expected"), [
    # P=4, A=2: S defaults to A=2 -> generation 4 x 2 = 8, step 4 x 2 = 8, 1 step per generation
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2}, (8, 8, 4, 1)),
    # S=4 given: generation 4 x 4 = 16 feeds 4 / 2 = 2 steps of 8
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "steps_per_generation": 4}, (16, 8, 4, 1)),
    # generation_batch_size=32 with P=4 (one process): S = 32 / 4 = 8 -> 8 x 4 = 32 completions
    ({"per_device_train_batch_size": 4, "generation_batch_size": 32}, (32, 4, 4, 1)),
    # num_iterations=3: the same generation reused 3 times (rlhfkit's update_epochs)
    ({"per_device_train_batch_size": 8, "num_iterations": 3}, (8, 8, 8, 3)),
])
def test_each_trl_name_maps_to_the_same_work(trl, expected, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = GRPOConfig(num_generations=4, **trl)
    assert _batches(cfg) == expected
    rollout, mini, _, epochs = expected
    assert cfg.optimiser_steps_per_iteration == epochs * rollout // mini


def test_max_steps_counts_optimiser_steps_as_trl_does(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    # a generation feeds num_iterations x S / A = 2 x 4 / 2 = 4 optimiser steps: max_steps=12 -> 3 generations
    cfg = GRPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4,
                     num_iterations=2, num_generations=4, max_steps=12)
    assert (cfg.iterations, cfg.optimiser_steps_per_iteration) == (3, 4)
    # 10 is not a whole number of generations: 3 generations = 12 steps, and the line says so
    cfg = GRPOConfig(per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=4,
                     num_iterations=2, num_generations=4, max_steps=10)
    assert cfg.iterations == 3
    assert "max_steps 10 runs 3 whole generations = 12 optimiser steps" in capsys.readouterr().err
    # without TRL's batch names max_steps stays rlhfkit's iterations, as before
    assert GRPOConfig(max_steps=5).iterations == 5


def test_processes_divide_trl_global_generation_batch(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    # TRL: generation_batch_size 32 is global: S = 32 / (4 x 2) = 4, so each process samples 4 x 4 = 16
    cfg = build_config(GRPOConfig, {"per_device_train_batch_size": 4, "generation_batch_size": 32,
                                    "num_generations": 4})
    assert _batches(cfg) == (16, 4, 4, 1)
    # offline: rlhfkit's batch_size counts every process: 2 x 3 x 2 = 12
    sft = build_config(SFTConfig, {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3})
    assert (sft.batch_size, sft.micro_batch_size) == (12, 2)


def test_offline_trainers_take_trl_batch_and_defaults(capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = DPOConfig(per_device_train_batch_size=2, gradient_accumulation_steps=4)
    assert (cfg.batch_size, cfg.micro_batch_size, cfg.epochs, cfg.warmup_steps, cfg.lr_scheduler_type) == (
        2 * 4, 2, 3, 0, "linear")
    assert "each optimiser step trains on 8 examples (2 per forward/backward x 4 accumulated)" in capsys.readouterr().err
    # a value the user gives wins over TRL's default
    assert SFTConfig(per_device_train_batch_size=2, warmup_steps=5, num_train_epochs=1).warmup_steps == 5
    with pytest.raises(ConfigError, match="steps_per_generation: TRL's GRPO options; this command has no generation"):
        SFTConfig(steps_per_generation=2)


def test_conflicts_and_trl_refusals_are_one_line():
    with pytest.raises(ConfigError, match=r"micro_batch_size=4 and TRL's per_device_train_batch_size \(which set "
                                          r"micro_batch_size=8\) disagree: give one"):
        GRPOConfig(per_device_train_batch_size=8, micro_batch_size=4)
    assert GRPOConfig(per_device_train_batch_size=8, micro_batch_size=8).micro_batch_size == 8  # agreeing is fine
    with pytest.raises(ConfigError, match="generation_batch_size and steps_per_generation: give one"):
        GRPOConfig(generation_batch_size=16, steps_per_generation=2)
    with pytest.raises(ConfigError, match=r"steps_per_generation \(3\) must be a multiple of gradient_accumulation"):
        GRPOConfig(per_device_train_batch_size=8, gradient_accumulation_steps=2, steps_per_generation=3)
    with pytest.raises(ConfigError, match="per_device_train_batch_size=0: expected a whole number >= 1"):
        GRPOConfig(per_device_train_batch_size=0)


def test_the_command_line_and_yaml_read_them_together(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2", "num_generations=4"]
    assert _batches(parse_args(GRPOConfig, argv, "rlhfkit grpo")) == (8, 8, 4, 1)
    (tmp_path / "t.yaml").write_text("per_device_train_batch_size: 4\nsteps_per_generation: 4\nnum_generations: 4\n")
    assert _batches(parse_args(GRPOConfig, [str(tmp_path / "t.yaml")], "rlhfkit grpo")) == (16, 4, 4, 1)
    assert "TRL's names, read together" in help_text(GRPOConfig, "rlhfkit grpo")


def test_rlhfkit_former_generation_batch_size_is_prompts_per_generate(capsys):
    # GRPO: TRL's meaning (completions per generation); elsewhere rlhfkit's former name, with a note
    assert GRPOConfig(generation_batch_size=16, num_generations=4).rollout_batch_size == 16
    assert PPOConfig(generation_batch_size=4).prompts_per_generate == 4
    assert "generation_batch_size is now called prompts_per_generate" in capsys.readouterr().err
    # a config.yaml saved before the rename (rollout_batch_size beside it): the former name, so it resumes
    old = GRPOConfig(generation_batch_size=64, rollout_batch_size=32, mini_batch_size=32, group_size=8)
    assert (old.prompts_per_generate, old.rollout_batch_size, old.mini_batch_size) == (64, 32, 32)
    assert "read here as the former name beside rollout_batch_size" in capsys.readouterr().err


def test_warmup_ratio_and_trl_fractional_warmup_steps():
    from rlhfkit.runtime.optim import warmup_steps_of

    cfg = SFTConfig(warmup_ratio=0.1)
    assert warmup_steps_of(cfg, 25) == 3  # ceil(25 x 0.1) = ceil(2.5), transformers' rounding
    trl = SFTConfig(warmup_steps=0.1)  # TRL 1.16 / transformers 5: warmup_steps < 1 is a ratio
    assert (trl.warmup_ratio, trl.warmup_steps) == (0.1, 0)
    assert warmup_steps_of(SFTConfig(warmup_steps=7), 25) == 7
    with pytest.raises(ConfigError, match=r"warmup_ratio \(1.5\) must be in \[0, 1\)"):
        SFTConfig(warmup_ratio=1.5)
