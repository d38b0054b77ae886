"""What rlhfkit reads from an FSDP launch (runtime/fsdp2.py): the plan, and one line for what it does not run.
The sharded runs themselves: tests/scale/test_fsdp2.py."""

from __future__ import annotations

import pytest

from rlhfkit.errors import ConfigError
from rlhfkit.runtime.fsdp2 import Fsdp2Plan, layer_units, requested_plan

# What `accelerate launch --config_file configs/accelerate/fsdp2-lora.yaml` puts in each process's
# environment (accelerate 1.15, copied from a launch), less the keys rlhfkit does not read.
LORA_PRESET_ENV = {
    "ACCELERATE_MIXED_PRECISION": "bf16", "ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2",
    "FSDP_SHARDING_STRATEGY": "FULL_SHARD", "FSDP_RESHARD_AFTER_FORWARD": "true", "FSDP_OFFLOAD_PARAMS": "false",
    "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP", "FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer",
    "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT", "FSDP_CPU_RAM_EFFICIENT_LOADING": "false",
    "FSDP_ACTIVATION_CHECKPOINTING": "false",
}


def test_no_fsdp_no_plan():
    assert requested_plan({}) is None
    assert requested_plan({**LORA_PRESET_ENV, "ACCELERATE_USE_FSDP": "false"}) is None


def test_the_presets_plans():
    assert requested_plan(LORA_PRESET_ENV) == Fsdp2Plan(True, ("LlamaDecoderLayer",), "bf16")
    full = {**LORA_PRESET_ENV, "ACCELERATE_MIXED_PRECISION": "no", "FSDP_RESHARD_AFTER_FORWARD": "false",
            "FSDP_TRANSFORMER_CLS_TO_WRAP": "LlamaDecoderLayer, Qwen2DecoderLayer"}
    assert requested_plan(full) == Fsdp2Plan(False, ("LlamaDecoderLayer", "Qwen2DecoderLayer"), "no")


@pytest.mark.parametrize("change, key", [
    ({"FSDP_VERSION": "1"}, "fsdp_version"),
    ({"FSDP_OFFLOAD_PARAMS": "true"}, "fsdp_offload_params"),
    ({"FSDP_ACTIVATION_CHECKPOINTING": "true"}, "fsdp_activation_checkpointing"),
    ({"FSDP_CPU_RAM_EFFICIENT_LOADING": "true"}, "fsdp_cpu_ram_efficient_loading"),
    ({"ACCELERATE_MIXED_PRECISION": "fp16"}, "mixed_precision"),
])
def test_what_rlhfkit_does_not_run_is_one_line_naming_the_config_key(change, key):
    with pytest.raises(ConfigError) as err:
        requested_plan({**LORA_PRESET_ENV, **change})
    message = str(err.value)
    assert message.startswith(f"{key}: ") and "\n" not in message


def test_layer_units_default_to_the_models_decoder_layers(tiny_tokenizer):
    from tiny_lm import build_tiny_model

    model = build_tiny_model(len(tiny_tokenizer), layers=3)
    assert [type(m).__name__ for m in layer_units(model, ())] == ["LlamaDecoderLayer"] * 3
    with pytest.raises(ConfigError, match="^fsdp_transformer_layer_cls_to_wrap: no module of class Qwen2DecoderLayer"):
        layer_units(model, ("Qwen2DecoderLayer",))
