"""The output layer's input is made contiguous (models/loading.py `contiguous_head_input`): generate's
prefill passes a strided (B, 1, H) view, on which torch's bf16 CPU linear copied the whole weight
once per row (3.5 GB for 64 rows of SmolLM2). Same values bit for bit; one plain matmul."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from rlhfkit.models.loading import load_causal_lm


def _ops(fn) -> list[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events()]


def test_prefill_logits_are_unchanged_and_the_weight_is_not_copied_per_row(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype="bf16", trainable=False)
    head = model.get_output_embeddings()
    torch.manual_seed(0)
    hidden = torch.randn(5, 7, head.in_features, dtype=torch.bfloat16)
    view = hidden[:, -1:, :]  # what logits_to_keep=1 hands the head
    assert not view.is_contiguous()
    with torch.no_grad():
        hooked = head(view)
        plain = torch.nn.functional.linear(view.contiguous(), head.weight, head.bias)
        ops = _ops(lambda: head(view))
        head._forward_pre_hooks.clear()
        ops_without = _ops(lambda: head(view))
    assert torch.equal(hooked, plain)
    # The batched fallback (taken for a frozen weight and a strided input) copied the weight per row.
    assert "aten::bmm" in ops_without and "aten::bmm" not in ops


def test_a_whole_prefill_forward_gives_the_same_logits_with_and_without_the_hook(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype="bf16", trainable=False)
    ids = torch.randint(3, 100, (4, 6))
    mask = torch.ones_like(ids)
    mask[:2, :2] = 0  # left padding
    with torch.no_grad():
        hooked = model(input_ids=ids, attention_mask=mask, logits_to_keep=1).logits
        model.get_output_embeddings()._forward_pre_hooks.clear()
        plain = model(input_ids=ids, attention_mask=mask, logits_to_keep=1).logits
    assert torch.equal(hooked, plain)
