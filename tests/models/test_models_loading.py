"""Model loading knobs: dtype resolution, LoRA on the top layers only, clear errors."""

from __future__ import annotations

import pytest

from rlhfkit.errors import UserError
from rlhfkit.models import loading
from rlhfkit.models.policy import add_lora

from tiny_lm import build_tiny_model


def test_auto_dtype_follows_fast_bf16(monkeypatch):
    monkeypatch.setattr(loading, "fast_bf16_available", lambda: False)
    assert loading.resolve_dtype("auto") == "fp32"
    monkeypatch.setattr(loading, "fast_bf16_available", lambda: True)
    assert loading.resolve_dtype("auto") == "bf16"
    assert loading.resolve_dtype("fp32") == "fp32"  # explicit choices are kept


def test_lora_layers_adapts_only_the_top_layers():
    model = build_tiny_model(64)  # 2 layers
    peft_model = add_lora(model, r=2, alpha=4, dropout=0.0, targets=None, top_layers=1)
    adapted = {n.split(".layers.")[1].split(".")[0] for n, _ in peft_model.named_parameters() if "lora_A" in n}
    assert adapted == {"1"}


def test_missing_model_path_is_a_one_line_user_error(tmp_path):
    with pytest.raises(UserError, match="not found: give a local Hugging Face model folder"):
        loading.resolve_model_path(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="is not a causal LM folder"):
        loading.resolve_model_path(str(tmp_path / "empty"))
