"""LoRA speed paths (models/lora.py): the lean forward equals peft's forward in values and
gradients, and merged sampling computes the same logits while leaving the model untouched."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.models.lora import lora_layers, merged_lora, use_lean_forward

from tiny_lm import build_tiny_lora_model as lora_model
from tiny_lm import build_tiny_model


def test_merged_lora_gives_the_same_logits_and_restores_the_model():
    model, tok = lora_model()
    ids = torch.tensor([[5, 9, 17, 33, 40, 2]])
    bases = [layer.base_layer for layer in lora_layers(model)]
    assert len(bases) == 14  # 7 projections x 2 layers
    originals = [b.weight for b in bases]
    bits = [w.detach().clone() for w in originals]
    with torch.no_grad():
        plain = model(ids).logits
        base_only = _adapter_off_logits(model, ids)
        with merged_lora(model):
            assert all(b.weight is not w for b, w in zip(bases, originals))  # really merged, not a no-op
            merged = model(ids).logits
        after = model(ids).logits
    torch.testing.assert_close(merged, plain, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(plain, base_only, atol=1e-3)  # the adapter matters, so the check above bites
    assert all(b.weight is w for b, w in zip(bases, originals))
    assert all(torch.equal(w, b) for w, b in zip(originals, bits))  # base bits unchanged: the reference
    assert torch.equal(after, plain)  # adapters active again
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)


def _adapter_off_logits(model, ids):
    with model.disable_adapter():
        return model(ids).logits


def test_merged_lora_restores_the_weights_when_the_block_raises():
    model, _ = lora_model()
    originals = [layer.base_layer.weight for layer in lora_layers(model)]
    with torch.no_grad(), pytest.raises(RuntimeError, match="boom"):
        with merged_lora(model):
            raise RuntimeError("boom")
    assert [layer.base_layer.weight for layer in lora_layers(model)] == originals
    assert not any(layer.disable_adapters for layer in lora_layers(model))


def test_merged_lora_is_a_no_op_under_grad_and_without_lora():
    model, tok = lora_model()
    originals = [layer.base_layer.weight for layer in lora_layers(model)]
    with merged_lora(model):  # gradients on: training must see the real adapter
        assert [layer.base_layer.weight for layer in lora_layers(model)] == originals
    plain = build_tiny_model(len(tok))
    before = {n: p for n, p in plain.named_parameters()}
    with torch.no_grad(), merged_lora(plain):
        assert dict(plain.named_parameters()) == before


def test_merged_lora_merges_off_the_cpu_too():
    """A GPU samples with merged weights as the CPU does (one matmul, one launch per layer and step).
    The meta device stands in for CUDA here: any device other than the CPU."""
    model, _ = lora_model()
    model.to("meta")
    bases = [layer.base_layer for layer in lora_layers(model)]
    originals = [b.weight for b in bases]
    with torch.no_grad(), merged_lora(model):
        assert all(b.weight is not w and b.weight.is_meta for b, w in zip(bases, originals))
        assert all(layer.disable_adapters for layer in lora_layers(model))
    assert all(b.weight is w for b, w in zip(bases, originals))




# ----------------------------------------------------------------------------- lean forward


def peft_twin(model):
    """A deep copy that runs peft's own LoRA forward."""
    import copy

    from peft.tuners.lora.layer import Linear

    twin = copy.deepcopy(model)
    for layer in lora_layers(twin):
        layer.__class__ = Linear
    return twin


@pytest.fixture()
def lean_calls(monkeypatch):
    """Counts calls that took the lean path."""
    import rlhfkit.models.lora as lora

    calls = []
    real = lora.lean_lora_forward
    monkeypatch.setattr(lora, "lean_lora_forward", lambda layer, x: calls.append(1) or real(layer, x))
    return calls


def test_add_lora_installs_the_lean_forward():
    model, _ = lora_model()
    assert [type(layer).__name__ for layer in lora_layers(model)] == ["LeanLoraLinear"] * 14
    assert use_lean_forward(model) == 0  # already installed: nothing left to convert


@settings(max_examples=15, deadline=None)
@given(batch=st.integers(1, 3), length=st.integers(1, 9), seed=st.integers(0, 50))
def test_lean_forward_equals_peft_in_values_and_gradients(batch, length, seed):
    torch.manual_seed(seed)
    model, _ = lora_model(seed=seed % 3)
    twin = peft_twin(model)
    ids = torch.randint(3, 300, (batch, length))
    weights = torch.randn(batch, length, model.config.vocab_size)
    outs = {}
    for name, m in (("lean", model), ("peft", twin)):
        logits = m(ids).logits
        (logits * weights).sum().backward()
        outs[name] = (logits.detach(), {n: p.grad for n, p in m.named_parameters() if p.requires_grad})
    torch.testing.assert_close(outs["lean"][0], outs["peft"][0], atol=1e-5, rtol=1e-5)
    assert outs["lean"][1].keys() == outs["peft"][1].keys() and len(outs["lean"][1]) == 28
    for n, g in outs["lean"][1].items():
        torch.testing.assert_close(g, outs["peft"][1][n], atol=1e-4, rtol=1e-4, msg=n)


def test_lean_forward_runs_for_plain_calls_and_falls_back_otherwise(lean_calls):
    ids = torch.tensor([[5, 9, 17, 33]])
    model, _ = lora_model()
    model(ids)
    assert len(lean_calls) == 14  # every adapted projection
    lean_calls.clear()
    with model.disable_adapter():  # the LoRA reference: base weights only
        off = model(ids).logits
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids)
    assert lean_calls == []
    plain = build_tiny_model(model.config.vocab_size, seed=0).eval()  # lora_model's base, same seed
    torch.testing.assert_close(off, plain(ids).logits)
    dropout_model, _ = lora_model(dropout=0.1)  # nn.Dropout, not Identity: peft's own path
    dropout_model(ids)
    assert lean_calls == []
