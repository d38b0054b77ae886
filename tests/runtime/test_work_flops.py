"""The least-work FLOP counts of bench/work_flops.py (the floors of bench/bench_grpo_dpo.py): golden counts
worked by hand on a tiny decoder, and the shared-prompt and per-row sums against rlhfkit.estimate.flops."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.estimate.flops import forward_flops, sampling_flops
from rlhfkit.estimate.shape import ModelShape

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import work_flops  # noqa: E402

# hidden 4, 2 heads of 2 (q 4 wide), 1 kv head (k, v 2 wide), MLP 8, one layer, vocabulary 10.
TINY = ModelShape(hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, vocab=10, tied=True)
# Per token: q 2*4*4 = 32, k 2*4*2 = 16, v 16, o 32, gate 2*4*8 = 64, up 64, down 64: 288.
PROJ, PAIR, HEAD = 288, 4 * 2 * 2, 2 * 4 * 10  # attention per (query, key) pair 4 heads d = 16; head 80


def test_sampling_by_hand():
    # Prompt of 2 tokens, response of 3: the prefill runs 2 tokens (3 causal pairs) and the head once
    # (token 0); steps t = 1, 2 run one token each against 2 + t keys, and the head.
    prefill = 2 * PROJ + 3 * PAIR + HEAD
    steps = (PROJ + HEAD + 3 * PAIR) + (PROJ + HEAD + 4 * PAIR)
    assert work_flops.sampling(TINY, [(2, [3])]) == prefill + steps == 1552


def test_shared_prompt_forward_by_hand():
    # Prompt of 2 run once, responses of 1 and 2 tokens: 5 tokens through the projections; pairs: the
    # prompt's own 3, row 1's token sees 3 keys, row 2's tokens 3 and 4; the head at the 3 response tokens.
    want = 5 * PROJ + (3 + 3 + 3 + 4) * PAIR + 3 * HEAD
    assert work_flops.teacher_forced(TINY, [(2, [1, 2])], lora_r=0, lora_layers=None, train=False) == want == 1888


def test_prefix_shared_by_every_prompt_runs_once_per_call_by_hand():
    # Two prompts of 3 tokens sharing their first 2, one response token each, one forward call: the
    # prefix's 2 tokens once, each prompt's third token and response token: 6 tokens. Pairs: the
    # prefix's own 3; per row the third prompt token sees 3 keys and the response token 4.
    groups = [(3, [1]), (3, [1])]
    want = 6 * PROJ + (3 + 2 * (3 + 4)) * PAIR + 2 * HEAD
    assert work_flops.teacher_forced(TINY, groups, 0, None, False, prefix=2) == want == 2160
    # Two calls (one prompt each): nothing shared between them.
    assert work_flops.teacher_forced(TINY, groups, 0, None, False, prefix=2, calls=2) == 2 * forward_flops(TINY, [4], 1)
    # Sampling: each prompt's prefill (3 tokens, 6 pairs, the head) with the prefix (2 tokens, 3 pairs) once;
    # one-token responses need no decode step.
    assert work_flops.sampling(TINY, groups, prefix=2) == 4 * PROJ + 9 * PAIR + 2 * HEAD == 1456


def test_dpo_step_shares_each_prompt_between_its_two_responses():
    # A pair's prompt, counted once, with its two responses; with one row it is the plain count.
    pairs = [(2, 1, 2), (3, 2, 2)]
    want = sum(work_flops.teacher_forced(TINY, [(p, [c, r])], 2, None, True) for p, c, r in pairs)
    assert work_flops.dpo_step(TINY, [(0, pairs[:1]), (0, pairs[1:])], 2, None) == want
    one = work_flops.teacher_forced(TINY, [(3, [2])], 0, None, False)
    assert one == forward_flops(TINY, [5], 2)


def test_common_prefix_of_left_padded_prompts():
    query_ids = torch.tensor([[0, 5, 6, 7], [5, 6, 8, 9], [0, 0, 5, 6]])
    query_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]])
    assert work_flops.common_prefix(query_ids, query_mask) == 2
    assert work_flops.common_prefix(query_ids[:2], query_mask[:2]) == 2
    assert work_flops.common_prefix(torch.tensor([[1, 2], [3, 2]]), torch.ones(2, 2)) == 0


def test_prompt_groups_reads_left_padded_prompts():
    pad = 0
    query_ids = torch.tensor([[pad, 5, 6], [pad, 5, 6], [7, 8, 9]])
    query_mask = torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1]])
    response_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])
    assert work_flops.prompt_groups(query_ids, query_mask, response_mask) == [(2, [2, 3]), (3, [1])]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.lists(st.integers(1, 30), min_size=1, max_size=4)),
                min_size=1, max_size=4))
def test_sampling_is_each_prompt_prefilled_once_plus_each_rows_decode(groups):
    # sampling_flops counts rows decoding to the same length, each with its prompt's prefill; one row per
    # call gives its decode, and a prompt's prefill counts once however many rows share it.
    shape = TINY
    want = 0
    for prompt, lengths in groups:
        want += sampling_flops(shape, [prompt], 1)["prefill"]
        want += sum(sampling_flops(shape, [prompt], r)["decode"] for r in lengths)
    assert work_flops.sampling(shape, groups) == want


def test_full_fine_tuning_rollout_counts_a_plain_forward_and_a_full_backward():
    # lora_r=None is full fine-tuning (bench/gpu.py's grpo-full part): the log-prob pass is the plain forward of
    # the shared-prompt test above, 1888, and the update a forward and a backward with every weight trained.
    out = work_flops.grpo_rollout(TINY, [(2, [1, 2])], [(2, [1, 2])], None, None, epochs=1)
    assert out["log-prob pass"] == 1888
    # Backward, full: 2x the projections and attention (input and weight gradients), the trained head 2x its
    # forward: 2 * (5 * PROJ + 13 * PAIR) + 2 * 3 * HEAD = 2 * (1440 + 208) + 480 = 3776.
    assert out["update"] == 1888 + 3776
