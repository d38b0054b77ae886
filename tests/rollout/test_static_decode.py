"""The static-cache decode loop (rollout/static_decode.py, `generation_backend=graph`), run here
without capture (the same code the CUDA graph replays): greedy tokens equal HF generate's, draws
follow softmax(z / T), finished rows leave their bucket, each row continues from its own cache
rows after a move. On CUDA (marked `gpu`) the captured step gives this one's tokens."""

from __future__ import annotations

import contextlib

import pytest
import torch

from rlhfkit.rollout import SamplingParams
from rlhfkit.rollout import decode as decode_mod
from rlhfkit.rollout import static_decode as static_mod
from rlhfkit.rollout.core import generate
from rlhfkit.rollout.decode import lean_generate
from rlhfkit.rollout.static_decode import cache_columns, next_bucket, static_decode

from test_decode import (
    PROMPTS,
    ForwardSpy,
    assert_same_rollout,
    batch_of,
    chi_square,
    chi_square_limit,
    greedy_stop_ids,
    policy_probs,
    small_vocab_model,
    spread,
)
from tiny_lm import build_tiny_lora_model, build_tiny_model, build_tokenizer


@pytest.fixture(scope="module")
def tiny():
    tok = build_tokenizer()
    tok.padding_side = "left"
    torch.manual_seed(0)
    return spread(build_tiny_model(len(tok), seed=0)).eval(), tok


@pytest.mark.parametrize("options", [{}, {"share_prefix": True}, {"share_prompts": True}, {"batch_size": 3}])
def test_greedy_tokens_equal_hf_generate_with_left_padded_prompts(tiny, options):
    model, tok = tiny
    params = SamplingParams(max_new_tokens=12, temperature=0.0, stop_ids=greedy_stop_ids(model, tok))
    hf = generate(model, tok, PROMPTS, params, **options)
    static = lean_generate(model, tok, PROMPTS, params, decoder=static_decode, **options)
    assert_same_rollout(static, hf)
    assert hf.query_mask.sum(1).unique().numel() == 3  # three prompt lengths: real left padding
    assert hf.stopped.any() and not hf.stopped.all()  # rows stop at different steps: the bucket moves


@pytest.mark.parametrize("merged", [True, False])
def test_greedy_tokens_with_lora_equal_hf_generate(monkeypatch, merged):
    model, tok = build_tiny_lora_model(seed=1)
    tok.padding_side = "left"
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_ids=(2,))
    hf = generate(model, tok, PROMPTS, params)
    if not merged:  # the adapters run as peft's layers in every step
        monkeypatch.setattr(decode_mod, "merged_lora", lambda m: contextlib.nullcontext(m))
    assert_same_rollout(lean_generate(model, tok, PROMPTS, params, decoder=static_decode, share_prompts=True), hf)
    assert hf.response_ids.unique().numel() > 3  # not one repeated token


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_first_and_second_tokens_follow_the_policy_softmax(temperature):
    """Pearson's chi-square at significance 1e-4 (fixed seed: deterministic): the first token of
    each prompt's 6000 rows against softmax(z / T), and the second token of the rows that drew the
    same first token against the policy's softmax after prompt + that token (a plain forward)."""
    model = small_vocab_model()
    V = model.config.vocab_size
    prompts = [[1, 3, 4, 5], [1, 6]]  # the second is left-padded by 2 columns
    copies = 6000
    ids, mask = batch_of(prompts, copies)
    torch.manual_seed(0)
    tokens = torch.stack(static_decode(model, ids, mask, 2, (V + 1,), temperature))  # no stop: 2 tokens each
    stat, df = 0.0, 0
    for k, prompt in enumerate(prompts):
        block = tokens[k * copies : (k + 1) * copies]
        first = torch.bincount(block[:, 0], minlength=V)
        stat, df = stat + chi_square(first, policy_probs(model, prompt, temperature)), df + V - 1
        for x in first.nonzero().flatten().tolist():
            rows = block[block[:, 0] == x]
            if len(rows) >= 200:  # enough draws for the chi-square approximation
                second = torch.bincount(rows[:, 1], minlength=V)
                stat, df = stat + chi_square(second, policy_probs(model, prompt + [x], temperature)), df + V - 1
    assert df >= 6 * (V - 1)
    assert stat < chi_square_limit(df), (stat, df)
    wrong = chi_square(torch.bincount(tokens[:copies, 0], minlength=V), policy_probs(model, prompts[0], 0.3))
    assert wrong > 4 * chi_square_limit(V - 1)  # the check has power: the wrong temperature is rejected


def test_next_bucket_halves_to_a_power_of_two():
    assert next_bucket(13, 24) == 24  # 13 rows need more than half of 24: stay
    assert next_bucket(12, 24) == 16  # half or fewer: the smallest power of two that holds them
    assert next_bucket(5, 24) == 8
    assert next_bucket(3, 4) == 4 and next_bucket(2, 4) == 2 and next_bucket(1, 2) == 1


def test_finished_rows_leave_their_bucket():
    """Golden batch sizes: after the prefill of all rows, the forward of step t runs the bucket
    that `next_bucket` gives for the rows whose response is longer than t tokens."""
    spy = ForwardSpy(small_vocab_model(vocab=5))
    ids, mask = batch_of([[1, 3, 4], [2], [4, 4, 1, 3, 2]], copies=8)
    torch.manual_seed(4)
    out = static_decode(spy, ids, mask, max_new_tokens=9, stop_ids=(3,), temperature=1.0)
    lengths = torch.tensor([len(r) for r in out])
    assert (lengths < 9).any() and (lengths == 9).any()
    expected, size = [], 24
    for t in range(1, int(lengths.max())):
        size = next_bucket(int((lengths > t).sum()), size)
        expected.append((size, 1))
    assert spy.calls[0] == tuple(ids.shape)
    assert spy.calls[1:] == expected
    assert expected[-1][0] < 24  # the batch did move to a smaller bucket


def test_rows_continue_from_their_own_cache_after_moving_bucket():
    """Greedy: each row's tokens are those of the row decoded alone with the lean loop, though
    other rows stopped and the rest moved (with their cache rows) into smaller buckets."""
    torch.manual_seed(0)
    model = spread(build_tiny_model(40, seed=0)).eval()
    prompts = [[1, 3, 4], [2], [4, 4, 1, 3, 2], [5, 6], [7], [9, 8, 7, 6]]
    ids, mask = batch_of(prompts, copies=1)
    free = decode_mod.decode(model, ids, mask, max_new_tokens=10, stop_ids=(99,), temperature=0.0)
    stops = (int(free[0][1]), int(free[1][2]), int(free[2][3]))
    out = static_decode(model, ids, mask, max_new_tokens=10, stop_ids=stops, temperature=0.0)
    alone = [decode_mod.decode(model, *batch_of([p], 1), 10, stops, 0.0)[0] for p in prompts]
    assert [r.tolist() for r in out] == [r.tolist() for r in alone]
    assert len({len(r) for r in out}) > 2  # rows finished at different steps


def test_graph_backend_is_selectable_and_samples_like_the_hf_backend(tiny):
    from types import SimpleNamespace

    from rlhfkit.rollout import backends

    graph = backends.make_backend(SimpleNamespace(generation_backend="graph"), "unused")
    assert isinstance(graph, backends.GraphBackend)
    model, tok = tiny
    params = SamplingParams(max_new_tokens=8, temperature=0.0, stop_ids=greedy_stop_ids(model, tok))
    assert_same_rollout(graph.generate(model, tok, PROMPTS, params, seed=3, share_prefix=True),
                        backends.HFBackend().generate(model, tok, PROMPTS, params, seed=3, share_prefix=True))
    ids = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    turns = graph.generate_ids(model, tok, ids["input_ids"], ids["attention_mask"], params)
    hf = backends.HFBackend.generate_ids(model, tok, ids["input_ids"], ids["attention_mask"], params)
    assert len(turns) == len(hf) and all(g.tolist() == h[: len(g)].tolist() for g, h in zip(turns, hf))


@pytest.mark.gpu
def test_captured_steps_give_the_uncaptured_tokens_on_cuda(monkeypatch):
    """fp32, LoRA merged, shared prompts, rows stopping at different steps (several buckets), twice
    (the second call re-records with the new merged weights): CUDA graphs or not, the same tokens."""
    model, tok = build_tiny_lora_model(seed=1)
    model = model.to("cuda")
    tok.padding_side = "left"
    params = SamplingParams(max_new_tokens=10, temperature=0.0, stop_ids=(2,))
    captured = [lean_generate(model, tok, PROMPTS, params, decoder=static_decode, share_prompts=True)
                for _ in range(2)]
    monkeypatch.setattr(static_mod, "step_for", lambda device: static_mod.decode_step)
    eager = lean_generate(model, tok, PROMPTS, params, decoder=static_decode, share_prompts=True)
    assert_same_rollout(captured[0], eager)
    assert_same_rollout(captured[1], eager)
    assert_same_rollout(generate(model, tok, PROMPTS, params), eager)


def test_cache_columns_round_up_to_a_multiple_of_64():
    assert [cache_columns(n) for n in (1, 64, 65, 130)] == [64, 64, 128, 192]
