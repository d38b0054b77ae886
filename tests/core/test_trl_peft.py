"""TRL's peft_config=LoraConfig(...) as rlhfkit's lora options; what rlhfkit cannot honour is refused."""

from __future__ import annotations

import pytest
from peft import LoraConfig

from rlhfkit.core.command_line import parse_args
from rlhfkit.errors import ConfigError
from rlhfkit.trainers.dpo_config import DPOConfig
from rlhfkit.trainers.grpo_config import GRPOConfig
from rlhfkit.trainers.sft_config import SFTConfig


def test_a_lora_config_sets_the_lora_options():
    peft = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    cfg = GRPOConfig(peft_config=peft, learning_rate=1e-5)
    assert (cfg.lora, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_target_modules, cfg.lr) == (
        True, 8, 16, 0.05, ["q_proj", "v_proj"], 1e-5)
    assert DPOConfig(peft_config=None).lora is False  # TRL: no peft_config = full fine-tuning
    assert SFTConfig(peft_config=LoraConfig(r=4)).lora_r == 4


@pytest.mark.parametrize(("peft", "refused"), [
    (LoraConfig(use_dora=True), "use_dora=True"),
    (LoraConfig(bias="all"), "bias='all'"),
    (LoraConfig(use_rslora=True), "use_rslora=True"),
    (LoraConfig(modules_to_save=["lm_head"]), "modules_to_save="),
])
def test_what_rlhfkit_cannot_honour_is_one_line(peft, refused):
    with pytest.raises(ConfigError) as e:
        GRPOConfig(peft_config=peft)
    msg = str(e.value)
    assert msg.startswith("GRPOConfig: peft_config: rlhfkit trains plain LoRA") and refused in msg
    assert "\n" not in msg


def test_peft_config_disagreeing_with_lora_r_and_yaml(tmp_path):
    with pytest.raises(ConfigError, match=r"peft_config's r \(8\) and lora_r=4 disagree"):
        GRPOConfig(peft_config=LoraConfig(r=8), lora_r=4)
    with pytest.raises(ConfigError, match="expected a peft LoraConfig"):
        GRPOConfig(peft_config="lora")
    (tmp_path / "c.yaml").write_text("peft_config:\n  r: 32\n  lora_alpha: 64\n  target_modules: [q_proj]\n")
    cfg = parse_args(GRPOConfig, [str(tmp_path / "c.yaml")], "rlhfkit grpo")
    assert (cfg.lora_r, cfg.lora_alpha, cfg.lora_target_modules) == (32, 64, ["q_proj"])
    (tmp_path / "d.yaml").write_text("peft_config:\n  r: 32\n  use_dora: true\n")
    with pytest.raises(ConfigError, match="cannot honour use_dora=True"):
        parse_args(GRPOConfig, [str(tmp_path / "d.yaml")], "rlhfkit grpo")
