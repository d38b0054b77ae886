"""Model loading knobs: dtype resolution, LoRA on the top layers only, clear errors."""

from __future__ import annotations

import pytest

from rlhfkit.errors import UserError
from rlhfkit.models import loading
from rlhfkit.models.lora import add_lora

from tiny_lm import build_tiny_model


def test_auto_dtype_follows_fast_bf16(monkeypatch):
    monkeypatch.setattr(loading, "fast_bf16_available", lambda: False)
    assert loading.resolve_dtype("auto") == "fp32"
    monkeypatch.setattr(loading, "fast_bf16_available", lambda: True)
    assert loading.resolve_dtype("auto") == "bf16"
    assert loading.resolve_dtype("fp32") == "fp32"  # explicit choices are kept


@pytest.mark.parametrize(("isa", "fast"), [(None, True), ("ALL", True), ("AVX512_CORE_BF16", True), ("avx2", False),
                                           ("AVX512_CORE", False), ("AVX2_VNNI_2", False)])
def test_fast_bf16_follows_cpu_flags_and_the_onednn_isa_cap(monkeypatch, isa, fast):
    monkeypatch.setattr(loading.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loading, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    if isa is None:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", isa)
    assert loading.fast_bf16_available() is fast
    monkeypatch.setattr(loading, "cpu_flags", lambda: {"avx2", "fma"})  # an AVX2-only CPU: never fast
    assert loading.fast_bf16_available() is False


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
