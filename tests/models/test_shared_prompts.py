"""Shared prompts (models/shared_prompts.py): a prompt repeated in a batch runs once, and every
result (hidden states, gradients, sampled tokens, a GRPO run) equals the plain computation."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.models.policy import response_hidden_states
from rlhfkit.models.shared_prompts import distinct_prompts, response_hidden
from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.core import generate
from rlhfkit.trainers.rl_update import shuffled_rows

from tiny_lm import assert_same_hidden_and_grads, build_tiny_model, build_tokenizer

PAD = 2


def test_distinct_prompts_golden():
    a, b, c = [5, 6, 7], [5, 6, 8], [9, 6, 7]
    ids = torch.tensor([a, a, b, a, c, b])
    rows, inverse = distinct_prompts(ids, torch.ones_like(ids))
    assert rows.tolist() == [0, 2, 4]  # first row of each distinct prompt, in batch order
    assert inverse.tolist() == [0, 0, 1, 0, 2, 1]
    assert distinct_prompts(ids[[0, 2, 4]], torch.ones(3, 3, dtype=torch.long)) is None  # nothing to share


def test_equal_tokens_with_different_masks_are_different_prompts():
    """pad == eos: a left pad and a real eos token have the same id; the mask tells them apart."""
    ids = torch.tensor([[PAD, 5, 6], [PAD, 5, 6]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert distinct_prompts(ids, mask) is None


def _batch(layout: list[int], P: int, R: int, vocab: int, seed: int = 0):
    """Rows whose prompts follow `layout` (equal numbers = equal prompts), with left padding of
    varying width and right-padded responses of varying length."""
    g = torch.Generator().manual_seed(seed)
    n_prompts = max(layout) + 1
    prompts = torch.randint(3, vocab, (n_prompts, P), generator=g)
    pads = torch.randint(0, P - 1, (n_prompts,), generator=g)
    B = len(layout)
    ids = torch.randint(3, vocab, (B, P + R), generator=g)
    mask = torch.ones(B, P + R, dtype=torch.long)
    for i, k in enumerate(layout):
        ids[i, :P] = prompts[k]
        ids[i, : pads[k]] = PAD
        mask[i, : pads[k]] = 0
        n = int(torch.randint(1, R + 1, (1,), generator=g))
        ids[i, P + n :] = PAD
        mask[i, P + n :] = 0
    return ids, mask


def _hidden_and_grads(model, ids, mask, R, share):
    model.zero_grad()
    hidden = response_hidden_states(model.get_decoder(), ids, mask, R, share)
    (hidden.sin() * mask[:, -R:, None]).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return hidden.detach(), grads


@settings(max_examples=12, deadline=None)
@given(layout=st.lists(st.integers(0, 3), min_size=2, max_size=8), seed=st.integers(0, 10_000))
def test_shared_forward_and_gradients_equal_the_plain_ones(layout, seed):
    tok = build_tokenizer()
    model = build_tiny_model(len(tok))
    ids, mask = _batch(layout, P=7, R=5, vocab=len(tok), seed=seed)
    assert_same_hidden_and_grads(_hidden_and_grads(model, ids, mask, 5, share=True),
                                 _hidden_and_grads(model, ids, mask, 5, share=False))


def test_the_prompt_pass_runs_once_per_distinct_prompt():
    """Guards against a silent fallback: the prompt pass sees U rows, the response pass all B."""
    tok = build_tokenizer()
    model = build_tiny_model(len(tok))
    ids, mask = _batch([0, 0, 0, 1, 1, 2], P=6, R=4, vocab=len(tok))
    seen = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda mod, args, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    response_hidden(model.get_decoder(), ids, mask, (mask.cumsum(1) - 1).clamp(min=0), 4)
    hook.remove()
    assert seen == [(3, 5), (6, 4)]  # 3 prompts x (P - 1) columns, then 6 rows x (last prompt token + R - 1)


def test_lora_gradients_equal_the_plain_ones():
    from rlhfkit.models.lora import add_lora

    tok = build_tokenizer()
    model = add_lora(build_tiny_model(len(tok)), r=4, alpha=8, dropout=0.0, targets=None)
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)  # non-zero B, so the adapter changes the forward
    from rlhfkit.models.policy import _unwrap

    lm = _unwrap(model)
    ids, mask = _batch([0, 1, 0, 1, 1], P=6, R=4, vocab=len(tok), seed=3)
    h0, g0 = _hidden_and_grads(lm, ids, mask, 4, share=False)
    h1, g1 = _hidden_and_grads(lm, ids, mask, 4, share=True)
    assert any("lora_A" in n for n in g0)
    # Rounding noise scales with each tensor's largest entries (up to 45 here), not with an entry's own
    # value: a fixed atol of 1e-6 left entries near 0 at 67% of their tolerance.
    assert_same_hidden_and_grads((h1, g1), (h0, g0))


def test_gradient_checkpointing_falls_back_to_the_plain_forward():
    """transformers drops the cache inside checkpointed layers, so sharing must not be used there."""
    tok = build_tokenizer()
    model = build_tiny_model(len(tok))
    model.gradient_checkpointing_enable()
    model.train()
    ids, mask = _batch([0, 0, 1], P=6, R=4, vocab=len(tok))
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    assert response_hidden(model.get_decoder(), ids, mask, pos, 4) is None
    model.eval()
    assert response_hidden(model.get_decoder(), ids, mask, pos, 4) is not None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_with_a_shared_prefill_samples_the_same_tokens(temperature):
    tok = build_tokenizer()
    model = build_tiny_model(len(tok)).eval()
    texts = ["<|im_start|>user\nWrite a short review<|im_end|>\n<|im_start|>assistant\n"] * 3 + [
        "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"] * 3
    params = SamplingParams(max_new_tokens=8, temperature=temperature)
    out = {}
    for share in (False, True):
        torch.manual_seed(0)
        out[share] = generate(model, tok, texts, params, share_prompts=share)
    assert torch.equal(out[True].response_ids, out[False].response_ids)
    assert out[True].completions == out[False].completions


def test_shuffled_rows_keeps_randperms_mini_batches_and_orders_them_by_group():
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    plain = torch.randperm(24, generator=g1)
    assert torch.equal(shuffled_rows(24, torch.Generator().manual_seed(5)), plain)  # G = 1: randperm itself
    grouped = shuffled_rows(24, g2, group_size=4, mini_batch_size=8)
    for k in range(0, 24, 8):
        chunk = grouped[k : k + 8]
        assert sorted(chunk.tolist()) == sorted(plain[k : k + 8].tolist())  # the same mini-batch
        assert (chunk // 4).tolist() == sorted((chunk // 4).tolist())  # its rows ordered by group
    assert torch.equal(torch.randperm(3, generator=g1), torch.randperm(3, generator=g2))  # same draws used
