"""The shared prompt prefix (models/shared_prompts.py): the leading tokens every row's prompt starts
with (a chat template's header) run once, alone or before the distinct prompts of shared-prompt
rows, and hidden states, gradients, sampled tokens and a PPO run equal the plain computation."""

from __future__ import annotations

from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.models import shared_prompts
from rlhfkit.models.policy import response_hidden_states
from rlhfkit.models.shared_prompts import (
    MIN_PREFIX,
    common_prefix_length,
    prefix_first,
    response_hidden,
    shared_prefix_hidden,
)
from rlhfkit.models.trunk import position_ids_from_mask
from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout.core import generate

from tiny_lm import assert_same_hidden_and_grads, build_tiny_model, build_tokenizer

PAD = 2


def test_common_prefix_length_golden():
    ids = torch.tensor([[PAD, PAD, 1, 5, 6, 7],
                        [1, 5, 6, 9, 9, 9],
                        [PAD, 1, 5, 6, 8, 9]])
    mask = (torch.arange(6) >= torch.tensor([[2], [0], [1]])).long()
    assert common_prefix_length(ids, mask) == 3  # 1 5 6 in every row, after its padding
    same = torch.tensor([[1, 5, 6, 7], [1, 5, 6, 7]])
    assert common_prefix_length(same, torch.ones_like(same)) == 3  # each row keeps its last token
    assert common_prefix_length(ids[:1], mask[:1]) == 0  # one row: nothing to share
    assert common_prefix_length(torch.tensor([[1, 5], [2, 5]]), torch.ones(2, 2, dtype=torch.long)) == 0
    # pad == eos: the mask, not the token id, says where a row starts
    eos_first = torch.tensor([[PAD, PAD, 5, 6], [PAD, PAD, 5, 7]])  # row 0: one pad, then a real eos
    assert common_prefix_length(eos_first, torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])) == 1  # (eos 5) vs (eos eos)
    right_padded = torch.tensor([[1, 5, 6, 0], [1, 5, 6, 7]])
    assert common_prefix_length(right_padded, torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])) == 0  # not left padding


def test_prefix_first_moves_the_prefix_and_keeps_positions():
    ids = torch.tensor([[PAD, PAD, 1, 5, 6, 7, 40, 41],
                        [1, 5, 6, 9, 9, 9, 42, PAD]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1],
                         [1, 1, 1, 1, 1, 1, 1, 0]])
    new_ids, new_mask = prefix_first(ids, mask, prompt_width=6, prefix=3)
    assert new_ids.tolist() == [[1, 5, 6, PAD, PAD, 7, 40, 41], [1, 5, 6, 9, 9, 9, 42, PAD]]
    assert new_mask.tolist() == [[1, 1, 1, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0]]
    old_pos, new_pos = position_ids_from_mask(mask), position_ids_from_mask(new_mask)
    for r in range(2):  # every real token keeps its token id and its position
        assert sorted(zip(ids[r][mask[r].bool()].tolist(), old_pos[r][mask[r].bool()].tolist())) == sorted(
            zip(new_ids[r][new_mask[r].bool()].tolist(), new_pos[r][new_mask[r].bool()].tolist()))


def _batch(B: int, prefix: int, P: int, R: int, vocab: int, seed: int):
    """B rows whose prompts start with the same `prefix` tokens then differ, each left-padded by a
    random width, and right-padded responses of random length. Returns (ids, mask) (B, P + R)."""
    g = torch.Generator().manual_seed(seed)
    head = torch.randint(3, vocab, (prefix,), generator=g)
    ids = torch.randint(3, vocab, (B, P + R), generator=g)
    mask = torch.ones(B, P + R, dtype=torch.long)
    for i in range(B):
        n = int(torch.randint(prefix + 1, P + 1, (1,), generator=g))  # prompt length
        ids[i, P - n : P - n + prefix] = head
        ids[i, : P - n] = PAD
        mask[i, : P - n] = 0
        k = int(torch.randint(1, R + 1, (1,), generator=g))
        ids[i, P + k :] = PAD
        mask[i, P + k :] = 0
    return ids, mask


def _hidden_and_grads(model, ids, mask, R, share):
    model.zero_grad()
    hidden = response_hidden_states(model.get_decoder(), ids, mask, R, share_prefix=share)
    (hidden.sin() * mask[:, -R:, None]).sum().backward()
    return hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@settings(max_examples=12, deadline=None)
@given(B=st.integers(2, 6), prefix=st.integers(MIN_PREFIX, 8), seed=st.integers(0, 10_000))
def test_shared_prefix_forward_and_gradients_equal_the_plain_ones(B, prefix, seed):
    tok = build_tokenizer()
    model = build_tiny_model(len(tok))
    ids, mask = _batch(B, prefix, P=12, R=5, vocab=len(tok), seed=seed)
    assert common_prefix_length(ids[:, :12], mask[:, :12]) >= prefix
    assert_same_hidden_and_grads(_hidden_and_grads(model, ids, mask, 5, share=True),
                                 _hidden_and_grads(model, ids, mask, 5, share=False))


def test_the_prefix_runs_once_and_the_rest_per_row():
    """Guards against a silent fallback: the prefix pass sees one row, the second pass the rest."""
    tok = build_tokenizer()
    model = build_tiny_model(len(tok))
    ids, mask = _batch(4, 6, P=12, R=5, vocab=len(tok), seed=1)
    S = common_prefix_length(ids[:, :12], mask[:, :12])
    seen = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda mod, args, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    assert shared_prefix_hidden(model.get_decoder(), ids, mask, 5) is not None
    hook.remove()
    assert seen == [(1, S), (4, 17 - 1 - S)]
    short = _batch(4, MIN_PREFIX - 1, P=12, R=5, vocab=len(tok), seed=2)
    if common_prefix_length(short[0][:, :12], short[1][:, :12]) < MIN_PREFIX:
        assert shared_prefix_hidden(model.get_decoder(), *short, 5) is None  # too short to pay


def _grouped_batch(layout: list[int], prefix: int, P: int, R: int, vocab: int, seed: int):
    """Rows whose prompts follow `layout` (equal numbers = equal prompts, as a GRPO group or a DPO
    pair), every prompt starting with the same `prefix` tokens; left padding and response lengths
    vary. Returns (ids, mask) (B, P + R)."""
    distinct, _ = _batch(max(layout) + 1, prefix, P, R, vocab, seed)
    ids, mask = _batch(len(layout), prefix, P, R, vocab, seed + 1)  # responses of their own lengths
    ids[:, :P] = distinct[layout, :P]
    mask[:, :P] = (ids[:, :P] != PAD).long()  # random tokens are >= 3: PAD marks the padding only
    return ids, mask


def _hidden_and_grads_both(model, ids, mask, R, share):
    model.zero_grad()
    hidden = response_hidden_states(model.get_decoder(), ids, mask, R, share_prompts=share, share_prefix=share)
    (hidden.sin() * mask[:, -R:, None]).sum().backward()
    return hidden.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@settings(max_examples=12, deadline=None)
@given(layout=st.lists(st.integers(0, 3), min_size=3, max_size=8), prefix=st.integers(MIN_PREFIX, 8),
       seed=st.integers(0, 10_000))
def test_prefix_then_distinct_prompts_forward_and_gradients_equal_the_plain_ones(layout, prefix, seed):
    tok = build_tokenizer()
    model = build_tiny_model(len(tok))
    ids, mask = _grouped_batch(layout, prefix, P=12, R=5, vocab=len(tok), seed=seed)
    with mock.patch.object(shared_prompts, "MIN_PREFIX_SAVING", 0):  # tiny prompts: take the stage regardless
        shared = _hidden_and_grads_both(model, ids, mask, 5, share=True)
    assert_same_hidden_and_grads(shared, _hidden_and_grads_both(model, ids, mask, 5, share=False))


def test_the_prefix_runs_once_then_each_distinct_prompt_then_every_row():
    """Guards against a silent fallback: one row of S columns, U rows of the prompts' remaining
    P - 1 - S columns, then all B rows of the last prompt column and R - 1 response columns."""
    tok = build_tokenizer()
    model = build_tiny_model(len(tok))
    layout = [0, 0, 1, 1, 2, 2, 2]
    ids, mask = _grouped_batch(layout, 6, P=12, R=5, vocab=len(tok), seed=3)
    S = common_prefix_length(ids[:, :12], mask[:, :12])
    assert S >= 6
    seen = []
    hook = model.get_decoder().register_forward_pre_hook(
        lambda mod, args, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    pos = position_ids_from_mask(mask)
    with mock.patch.object(shared_prompts, "MIN_PREFIX_SAVING", 2 * S):  # (U - 1) S = 2 S positions saved
        response_hidden(model.get_decoder(), ids, mask, pos, 5, share_prefix=True)
    with mock.patch.object(shared_prompts, "MIN_PREFIX_SAVING", 2 * S + 1):  # one short: the prompts whole
        response_hidden(model.get_decoder(), ids, mask, pos, 5, share_prefix=True)
    response_hidden(model.get_decoder(), ids, mask, pos, 5)  # without share_prefix: the prompts whole, as before
    hook.remove()
    assert seen == [(1, S), (3, 12 - 1 - S), (7, 5), (3, 11), (7, 5), (3, 11), (7, 5)]


def test_gradient_checkpointing_falls_back_to_the_plain_forward():
    tok = build_tokenizer()
    model = build_tiny_model(len(tok))
    model.gradient_checkpointing_enable()
    model.train()
    ids, mask = _batch(3, 6, P=12, R=5, vocab=len(tok), seed=0)
    assert shared_prefix_hidden(model.get_decoder(), ids, mask, 5) is None


def test_generation_with_a_shared_prefix_samples_the_same_tokens():
    tok = build_tokenizer()
    tok.padding_side = "left"
    model = build_tiny_model(len(tok)).eval()
    head = "<|im_start|>system\nYou are a kind critic.<|im_end|>\n<|im_start|>user\n"
    texts = [head + q + "<|im_end|>\n<|im_start|>assistant\n"
             for q in ("Write a short review", "What is 3 + 4?", "Tell a story", "Hi")]
    enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    assert common_prefix_length(enc["input_ids"], enc["attention_mask"]) >= MIN_PREFIX  # the shared path runs
    params = SamplingParams(max_new_tokens=8, temperature=1.0)
    out = {}
    for share in (False, True):
        torch.manual_seed(0)
        out[share] = generate(model, tok, texts, params, share_prefix=share)
    assert torch.equal(out[True].query_ids, out[False].query_ids)  # the rollout keeps the left-padded layout
    assert torch.equal(out[True].response_ids, out[False].response_ids)
    assert out[True].completions == out[False].completions
