"""TRL's and transformers' option names, and one name per concept across rlhfkit's commands."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlhfkit.cli import main as rlhfkit_main
from rlhfkit.commands.evaluate import EvalConfig
from rlhfkit.core.command_line import parse_args, parse_values
from rlhfkit.core.config import build_config
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.grpo_config import GRPOConfig
from rlhfkit.trainers.sft_config import SFTConfig


def _values(cls, argv):
    return parse_values(cls, argv, "rlhfkit test")[0]


def test_trl_names_become_rlhfkit_options():
    argv = ["num_generations=4", "learning_rate=1e-5", "max_completion_length=32", "model_name_or_path=m",
            "per_device_train_batch_size=8", "reward_funcs=sentiment", "dataset_name=p.jsonl", "beta=0.04"]
    # TRL's batch names are kept as given: build_config reads them together (tests/core/test_trl_batch.py)
    assert _values(GRPOConfig, argv) == {"group_size": 4, "lr": "1e-5", "max_new_tokens": 32, "model": "m",
                                         "per_device_train_batch_size": 8, "reward": "sentiment", "prompts": "p.jsonl",
                                         "beta": 0.04}
    # the same dataset names mean each command's own data option
    assert _values(DPOConfig, ["dataset_name=d.jsonl", "reward_funcs=length"]) == {"prefs": "d.jsonl", "judge": "length"}
    assert _values(SFTConfig, ["dataset_name=s.jsonl", "num_train_epochs=3"]) == {"data": "s.jsonl", "epochs": 3}
    # an option a command has is never mapped: SFT's max_steps stays, GRPO's means iterations
    assert _values(SFTConfig, ["max_steps=5"]) == {"max_steps": 5}
    assert build_config(GRPOConfig, _values(GRPOConfig, ["max_steps=5"])).iterations == 5


def test_one_name_per_concept_across_commands():
    assert _values(DPOConfig, ["data=d.jsonl", "reward=length"]) == {"prefs": "d.jsonl", "judge": "length"}
    assert _values(GRPOConfig, ["data=p.jsonl", "judge=sentiment"]) == {"prompts": "p.jsonl", "reward": "sentiment"}
    assert _values(EvalConfig, ["output_dir=o", "reward=sentiment"]) == {"out_dir": "o", "rewards": "sentiment"}


def test_aliases_in_yaml_and_in_python(tmp_path):
    (tmp_path / "c.yaml").write_text("learning_rate: 2.0e-5\nnum_generations: 4\nper_device_train_batch_size: 4\n")
    cfg = parse_args(GRPOConfig, [str(tmp_path / "c.yaml")], "rlhfkit grpo")
    assert (cfg.lr, cfg.group_size, cfg.micro_batch_size) == (2e-5, 4, 4)
    assert build_config(GRPOConfig, {"learning_rate": 1e-3}).lr == 1e-3


def test_two_word_flags_as_trl_scripts_write_them():
    argv = ["--learning_rate", "1e-5", "--gradient_checkpointing", "--seed", "-3"]
    assert _values(GRPOConfig, argv) == {"lr": "1e-5", "gradient_checkpointing": True, "seed": -3}
    # `--lr=1e-4` and `--lr 1e-4` are the same thing; a flag without a value says so
    assert _values(GRPOConfig, ["--lr=1e-4"]) == _values(GRPOConfig, ["--lr", "1e-4"]) == {"lr": "1e-4"}
    with pytest.raises(ConfigError, match=r"^--lr needs a value: --lr VALUE or lr=VALUE"):
        _values(GRPOConfig, ["--lr"])
    assert _values(GRPOConfig, ["--lora", "false"]) == {"lora": False}
    # a value may hold "=" (a data spec's options); a following key=value is not taken as a value
    assert _values(GRPOConfig, ["--prompts", "hf:org/set?split=train", "--seed", "1"]) == {
        "prompts": "hf:org/set?split=train", "seed": 1}
    with pytest.raises(ConfigError, match="--prompts needs a value"):
        _values(GRPOConfig, ["--prompts", "seed=1"])


@pytest.mark.parametrize(("argv", "hint"), [
    (["num_generation=4"], "did you mean 'num_generations'? rlhfkit calls it 'group_size'"),
    (["max_completion_lenght=64"], "did you mean 'max_completion_length'? rlhfkit calls it 'max_new_tokens'"),
    (["group_sise=4"], "did you mean 'group_size'?"),
    (["bf16=true"], "use dtype=bf16"),
])
def test_did_you_mean_knows_the_aliases(argv, hint):
    with pytest.raises(ConfigError) as e:
        parse_args(GRPOConfig, argv, "rlhfkit grpo")
    assert hint in str(e.value) and str(e.value).startswith("command line: unknown config key")


def test_ppo_names_the_accumulation_it_derives():
    from rlhfkit.trainers.ppo_config import PPOConfig

    with pytest.raises(ConfigError, match="this command derives accumulation: mini_batch_size / micro_batch_size"):
        parse_args(PPOConfig, ["gradient_accumulation_steps=4"], "rlhfkit ppo")


def test_command_spelling_with_dash_or_underscore(capsys):
    assert rlhfkit_main(["online_dpo", "--help"]) == 0
    assert "usage: rlhfkit online-dpo" in capsys.readouterr().out
    assert rlhfkit_main(["reinforce-pp", "--help"]) == 0
    assert "usage: rlhfkit reinforce_pp" in capsys.readouterr().out


def test_listing_into_a_closed_pipe_ends_quietly():
    """`rlhfkit doctor --list-rules | head -1`: no BrokenPipeError traceback, the shell's 141."""
    code = ("import sys; from rlhfkit.errors import run_guarded\n"
            "def many():\n    print('x' * 1_000_000)\n    return 0\n"
            "sys.exit(run_guarded(many))")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()  # like `head -c 10`
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and err == ""


def test_help_names_the_aliases():
    from rlhfkit.core.command_line import help_text

    text = help_text(GRPOConfig, "rlhfkit grpo")
    assert "  group_size (int, default 8) (also: num_generations, rloo_k)" in text
    assert "  lr (float, default 0.0003) (also: learning_rate)" in text


def test_a_yaml_list_of_rewards_as_trl_writes_reward_funcs(tmp_path):
    (tmp_path / "c.yaml").write_text("reward_funcs: [sentiment, 'length:20']\nreward_weights: [1.0, 0.5]\n")
    cfg = parse_args(GRPOConfig, [str(tmp_path / "c.yaml")], "rlhfkit grpo")
    assert (cfg.reward, cfg.reward_weights) == ("sentiment,length:20", [1.0, 0.5])
    with pytest.raises(ConfigError, match="model=.*expected str"):
        build_config(GRPOConfig, {"model": ["a", "b"]})  # other text options still take one text


@pytest.mark.parametrize(("cls", "key", "wrong"), [
    (GRPOConfig, "use_cpu", "use_peft"),
    (GRPOConfig, "eval_steps", "max_steps"),
    (SFTConfig, "per_device_eval_batch_size", "per_device_train_batch_size"),
    (SFTConfig, "dataset_text_field", "dataset_name"),
    (GRPOConfig, "repetition_penalty", "overlong_penalty"),
    (SFTConfig, "shuffle_dataset", "eval_dataset"),
    (SFTConfig, "iterations", "eval_fraction"),
])
def test_no_did_you_mean_for_a_name_that_means_something_else(cls, key, wrong):
    """A look-alike name that means another thing is never offered; TRL names rlhfkit knows but does
    not offer say why in one line (core/aliases.UNSUPPORTED)."""
    from rlhfkit.core.aliases import UNSUPPORTED

    with pytest.raises(ConfigError) as e:
        parse_args(cls, [f"{key}=1"], "rlhfkit x")
    msg = str(e.value)
    assert wrong not in msg and "did you mean" not in msg, msg
    assert msg == f"command line: unknown config key '{key}' (TRL's {key}: {UNSUPPORTED[key]})"
    assert "\n" not in msg


def test_typo_hints_stay():
    from rlhfkit.core.aliases import edit_distance, is_typo

    assert edit_distance("clip_esp", "clip_eps") == 1  # a swap of neighbours is one edit
    assert edit_distance("eval_steps", "max_steps") == 3 and not is_typo("eval_steps", "max_steps")
    assert is_typo("lrr", "lr") and not is_typo("xy", "lr")
    with pytest.raises(ConfigError, match=r"did you mean 'eval_every'\?"):
        parse_args(SFTConfig, ["eval_evrey=3"], "rlhfkit sft")


def test_trl_names_with_the_same_meaning_map():
    from rlhfkit.trainers.rm_config import RMConfig

    assert _values(SFTConfig, ["eval_steps=5"]) == {"eval_every": 5}
    assert _values(RMConfig, ["center_rewards_coefficient=0.01"]) == {"center_coef": 0.01}
    assert _values(GRPOConfig, ["importance_sampling_level=sequence"]) == {"importance_level": "sequence"}
