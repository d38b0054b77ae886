"""Dropout off everywhere (docs/pitfalls.md#dropout): `disable_dropout` zeroes dropout modules, the config and the
float rates that modules copy from the config when they are built (LlamaAttention.attention_dropout
goes to scaled_dot_product_attention in train mode even after config.attention_dropout = 0).

Each tiny model sets every dropout rate its config has to 0.5; after `disable_dropout` two
train-mode forwards with different RNG states are bit-for-bit equal, and equal to eval mode.
"""

from __future__ import annotations

import pytest
import torch

from rlhfkit.models import disable_dropout, load_causal_lm

HALF = 0.5
ARCHITECTURES = {  # architecture: (config class, model class, dropout settings) -- which kinds each covers
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"attention_dropout": HALF}),  # attention (a float attribute)
    "bloom": ("BloomConfig", "BloomForCausalLM", {"hidden_dropout": HALF, "attention_dropout": HALF}),  # residual
    "opt": ("OPTConfig", "OPTForCausalLM", {"dropout": HALF, "attention_dropout": HALF, "activation_dropout": HALF,
                                             "layerdrop": HALF}),  # hidden, attention, activation, LayerDrop
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"resid_pdrop": HALF, "embd_pdrop": HALF, "attn_pdrop": HALF}),
    "phi": ("PhiConfig", "PhiForCausalLM", {"resid_pdrop": HALF, "embd_pdrop": HALF, "attention_dropout": HALF}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"hidden_dropout": HALF, "attention_dropout": HALF}),
}
SIZES = {  # the smallest shapes each config accepts (names differ per architecture)
    "llama": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2},
    "bloom": {"hidden_size": 32, "n_layer": 2, "n_head": 4},
    "opt": {"hidden_size": 32, "ffn_dim": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "word_embed_proj_dim": 32},
    "gpt2": {"n_embd": 32, "n_layer": 2, "n_head": 4, "bos_token_id": 1, "eos_token_id": 2},
    "phi": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
    "gpt_neox": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
}


def tiny(arch: str) -> torch.nn.Module:
    import transformers

    config_cls, model_cls, rates = ARCHITECTURES[arch]
    config = getattr(transformers, config_cls)(vocab_size=64, **SIZES[arch], **rates)
    torch.manual_seed(0)
    return getattr(transformers, model_cls)(config)


def train_mode_logits(model: torch.nn.Module, seed: int) -> torch.Tensor:
    ids = torch.arange(3, 19).view(2, 8)
    model.train()
    torch.manual_seed(seed)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_the_model_has_dropout_before(arch):
    """The check below is not vacuous: with the rates at 0.5, train-mode forwards differ."""
    model = tiny(arch)
    assert not torch.equal(train_mode_logits(model, 0), train_mode_logits(model, 1))


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_disable_dropout_makes_train_mode_deterministic_and_equal_to_eval(arch):
    model = disable_dropout(tiny(arch))
    a, b = train_mode_logits(model, 0), train_mode_logits(model, 1)
    assert torch.equal(a, b)
    model.eval()
    with torch.no_grad():
        ids = torch.arange(3, 19).view(2, 8)
        assert torch.equal(a, model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits)
    rates = {k: v for k, v in model.config.to_dict().items() if k in ARCHITECTURES[arch][2]}
    assert rates and set(rates.values()) == {0.0}


def test_loaded_models_come_without_dropout(tmp_path):
    """load_causal_lm (every trainer's policy, critic and reward backbone) applies it."""
    tiny("llama").save_pretrained(tmp_path)
    model = load_causal_lm(str(tmp_path))
    assert torch.equal(train_mode_logits(model, 0), train_mode_logits(model, 1))
    assert all(m.attention_dropout == 0.0 for m in model.modules() if hasattr(m, "attention_dropout"))


def test_dropout_modules_of_every_kind_and_nested_configs():
    """nn.Dropout1d/AlphaDropout are not nn.Dropout subclasses; a sub-config (text_config) is a config too."""
    from transformers import LlamaConfig

    outer = LlamaConfig(attention_dropout=HALF)
    outer.text_config = LlamaConfig(attention_dropout=HALF)
    net = torch.nn.Sequential(torch.nn.Dropout1d(HALF), torch.nn.AlphaDropout(HALF), torch.nn.Dropout(HALF))
    net.config = outer
    disable_dropout(net)
    assert [m.p for m in net] == [0.0, 0.0, 0.0]
    assert outer.attention_dropout == 0.0 and outer.text_config.attention_dropout == 0.0
