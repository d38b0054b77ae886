"""The fused output head (algos/head.py): log-probs and entropy straight from hidden states, with
the gradients of the plain lm_head -> log-softmax -> gather path, without keeping (N, V) logits."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import rlhfkit.algos.head as head_mod
from rlhfkit.algos import logprobs_and_entropy
from rlhfkit.algos.head import head_logprobs


def _linear(H: int, V: int, bias: bool, seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(H, V, bias=bias)
    with torch.no_grad():
        lin.weight.mul_(3.0)
    return lin


def test_golden_logprob_and_entropy():
    # hidden [1, 0] picks the first column of W: logits z = [0, ln 3] -> p = [1/4, 3/4].
    lin = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.0, 5.0], [math.log(3.0), -1.0]]))
    hidden = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    logp, ent = head_logprobs(hidden, lin, torch.tensor([[1, 0]]), with_entropy=True)
    torch.testing.assert_close(logp, torch.tensor([[math.log(0.75), math.log(0.25)]]))
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(ent, torch.tensor([[h, h]]))
    # temperature 0.5 doubles the logits: [0, 2 ln 3] -> p = [1/10, 9/10]
    logp, _ = head_logprobs(hidden, lin, torch.tensor([[1, 0]]), temperature=0.5)
    torch.testing.assert_close(logp, torch.tensor([[math.log(0.9), math.log(0.1)]]))


def test_gradient_golden_frozen_head():
    # d log p(y) / dh = (W[y] - sum_v p_v W[v]) / T. With p = [1/4, 3/4], y = 1, T = 1:
    # W[1] - (W[0] / 4 + 3 W[1] / 4) = (W[1] - W[0]) / 4 = ([ln 3, -1] - [0, 5]) / 4.
    lin = nn.Linear(2, 2, bias=False).requires_grad_(False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.0, 5.0], [math.log(3.0), -1.0]]))
    hidden = torch.tensor([[[1.0, 0.0]]], requires_grad=True)
    logp, _ = head_logprobs(hidden, lin, torch.tensor([[1]]))
    logp.sum().backward()
    torch.testing.assert_close(hidden.grad, torch.tensor([[[math.log(3.0) / 4, -6.0 / 4]]]))


def _both_paths(lin, hidden, tokens, mask, temperature, with_entropy, a, b):
    """(outputs and gradients of the fused head, the same of the plain path)."""
    results = []
    for fused in (True, False):
        h = hidden.clone().requires_grad_()
        for p in lin.parameters():
            p.grad = None
        if fused:
            logp, ent = head_logprobs(h, lin, tokens, mask, temperature, with_entropy)
        else:
            logp, ent = logprobs_and_entropy(lin(h), tokens, temperature, with_entropy)
            logp, ent = logp * mask, (ent * mask if ent is not None else None)
        loss = (logp * a).sum() + ((ent * b).sum() if ent is not None else 0.0)
        loss.backward()
        grads = [h.grad] + [p.grad for p in lin.parameters() if p.requires_grad]
        results.append((logp.detach(), None if ent is None else ent.detach(), grads))
    return results


@settings(max_examples=30, deadline=None)
@given(B=st.integers(1, 3), R=st.integers(1, 6), V=st.integers(2, 40), bias=st.booleans(), frozen=st.booleans(),
       temperature=st.sampled_from([1.0, 0.7, 1.6]), with_entropy=st.booleans(), seed=st.integers(0, 10_000))
def test_values_and_gradients_equal_the_plain_path(B, R, V, bias, frozen, temperature, with_entropy, seed):
    H = 8
    lin = _linear(H, V, bias, seed).requires_grad_(not frozen)
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, R, H, generator=g)
    tokens = torch.randint(0, V, (B, R), generator=g)
    mask = (torch.rand(B, R, generator=g) > 0.3).float()
    a, b = torch.randn(B, R, generator=g), torch.randn(B, R, generator=g)
    (lp1, e1, g1), (lp0, e0, g0) = _both_paths(lin, hidden, tokens, mask, temperature, with_entropy, a, b)
    torch.testing.assert_close(lp1, lp0, rtol=1e-5, atol=1e-5)
    if with_entropy:
        torch.testing.assert_close(e1, e0, rtol=1e-5, atol=1e-5)
    assert len(g1) == len(g0) == (1 if frozen else 2 + bias)
    for x, y in zip(g1, g0):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)


def test_masked_rows_read_zero_and_get_no_gradient():
    lin = _linear(4, 9, False, 0)
    hidden = torch.randn(2, 3, 4, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    logp, ent = head_logprobs(hidden, lin, torch.randint(0, 9, (2, 3)), mask, with_entropy=True)
    assert (logp[mask == 0] == 0).all() and (ent[mask == 0] == 0).all() and (logp[mask == 1] < 0).all()
    (logp.sum() + ent.sum()).backward()
    assert (hidden.grad[mask == 0] == 0).all() and (hidden.grad[mask == 1] != 0).any()
    every = head_logprobs(hidden, lin, torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3))[0]
    assert every.shape == (2, 3) and (every == 0).all()  # all rows masked


@pytest.mark.parametrize("frozen", [True, False])
def test_entropy_without_gradient_is_a_constant(frozen):
    """entropy_grad=False: the entropy is a logged constant and the gradient is that of log p alone."""
    lin = _linear(4, 9, False, 1).requires_grad_(not frozen)
    hidden = torch.randn(2, 3, 4)
    tokens = torch.randint(0, 9, (2, 3))
    h1 = hidden.clone().requires_grad_()
    logp, ent = head_logprobs(h1, lin, tokens, with_entropy=True, entropy_grad=False)
    assert not ent.requires_grad
    torch.testing.assert_close(ent, head_logprobs(hidden, lin, tokens, with_entropy=True)[1])
    logp.sum().backward()
    h0 = hidden.clone().requires_grad_()
    head_logprobs(h0, lin, tokens)[0].sum().backward()
    torch.testing.assert_close(h1.grad, h0.grad)


@pytest.mark.parametrize("frozen", [True, False])
def test_row_chunks_change_nothing(monkeypatch, frozen):
    lin = _linear(6, 13, True, 2).requires_grad_(not frozen)
    hidden, tokens = torch.randn(3, 5, 6), torch.randint(0, 13, (3, 5))
    mask = torch.ones(3, 5)
    a, b = torch.randn(3, 5), torch.randn(3, 5)
    whole = _both_paths(lin, hidden, tokens, mask, 0.8, True, a, b)[0]
    monkeypatch.setattr(head_mod, "HEAD_CHUNK_ELEMENTS", 4 * 13)  # 4 rows per chunk: 15 rows -> 4 chunks
    chunked = _both_paths(lin, hidden, tokens, mask, 0.8, True, a, b)[0]
    torch.testing.assert_close(chunked[0], whole[0])
    torch.testing.assert_close(chunked[1], whole[1])
    for x, y in zip(chunked[2], whole[2]):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_a_head_that_is_not_linear_goes_through_the_plain_path():
    lin = _linear(4, 7, False, 3)
    head = nn.Sequential(lin)
    hidden, tokens = torch.randn(2, 3, 4), torch.randint(0, 7, (2, 3))
    torch.testing.assert_close(head_logprobs(hidden, head, tokens)[0], head_logprobs(hidden, lin, tokens)[0])


def test_bf16_hidden_gets_a_bf16_gradient():
    lin = _linear(4, 7, False, 4).requires_grad_(False)
    hidden = torch.randn(2, 3, 4).to(torch.bfloat16).requires_grad_()
    logp, _ = head_logprobs(hidden, lin.to(torch.bfloat16), torch.randint(0, 7, (2, 3)))
    assert logp.dtype == torch.float32
    logp.sum().backward()
    assert hidden.grad.dtype == torch.bfloat16 and torch.isfinite(hidden.grad.float()).all()


def test_actor_critic_log_probs_equal_its_logits():
    """ActorCritic.forward(response_ids=...) gives what its logits give through logprobs_and_entropy."""
    from rlhfkit.models.policy import ActorCritic, ValueHead

    from tiny_lm import build_tiny_model

    lm = build_tiny_model(64)
    actor = ActorCritic(lm, ValueHead(lm.config.hidden_size))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 64, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :2] = 0
    resp, rmask = ids[:, -4:], torch.tensor([[1.0] * 4, [1.0] * 2 + [0.0] * 2, [1.0] * 3 + [0.0]])
    logits, v0 = actor.logits(ids, mask, 4, with_values=True)
    lp0, e0 = logprobs_and_entropy(logits, resp, 0.9, with_entropy=True)
    lp1, v1, e1 = actor(ids, mask, 4, response_ids=resp, response_mask=rmask, temperature=0.9, with_entropy=True)
    torch.testing.assert_close(lp1, lp0 * rmask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(e1, e0 * rmask, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(v1, v0)


@pytest.mark.parametrize("shard", ["deepspeed", "empty"])
def test_an_engine_sharded_head_goes_through_the_module(shard, monkeypatch):
    """ZeRO-3 / FSDP gather a weight in the module's own hooks: the fused path must call head(hidden)."""
    lin = _linear(4, 7, False, 5)
    hidden, tokens = torch.randn(2, 3, 4), torch.randint(0, 7, (2, 3))
    expected = head_logprobs(hidden, lin, tokens)[0]
    calls = []
    lin.register_forward_pre_hook(lambda *_: calls.append(1))
    if shard == "deepspeed":
        lin.weight.ds_id = 0  # a ZeRO-3 partitioned parameter carries ds_id
    else:
        monkeypatch.setattr(lin, "out_features", 8)  # the weight is not the module's full shape (a flat-param view)
    got = head_logprobs(hidden, lin, tokens)[0]
    assert calls, "the module's forward (and its hooks) must run"
    if shard == "deepspeed":
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_a_second_backward_through_a_trained_head_is_refused():
    """The trained-head backward builds dL/dz in its saved buffers: a retained graph must not reuse them."""
    lin = _linear(4, 7, False, 6)
    hidden = torch.randn(2, 3, 4, requires_grad=True)
    logp, _ = head_logprobs(hidden, lin, torch.randint(0, 7, (2, 3)))
    logp.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward pass"):
        logp.sum().backward()


def test_frozen_and_trained_heads_give_equal_bits_and_the_workspace_is_reused():
    """A frozen head (no weight gradient: LoRA, the reference, no-grad scoring) computes in a CPU
    workspace reused across calls; a trained head in fresh buffers. Same arithmetic: equal bits,
    which PPO's exact first-micro-batch ratio and DPO's step-0 loss of log 2 rely on."""
    from rlhfkit.algos import head as head_module

    torch.manual_seed(0)
    lin = nn.Linear(8, 50, bias=True)
    hidden = torch.randn(2, 5, 8)
    tokens = torch.randint(0, 50, (2, 5))
    trained = head_logprobs(hidden, lin, tokens, temperature=0.7, with_entropy=True)
    lin.requires_grad_(False)
    frozen = head_logprobs(hidden, lin, tokens, temperature=0.7, with_entropy=True)
    space = head_module._workspace.spaces[torch.device("cpu")]
    ptr = space.data_ptr()
    other = head_logprobs(torch.randn(2, 5, 8), lin, tokens, with_entropy=True)  # same size: same workspace
    assert head_module._workspace.spaces[torch.device("cpu")].data_ptr() == ptr
    again = head_logprobs(hidden, lin, tokens, temperature=0.7, with_entropy=True)
    for a, b, c in zip(trained, frozen, again):
        assert torch.equal(a, b) and torch.equal(b, c)  # results are not views of the workspace
    assert not torch.equal(other[0], frozen[0])
    lin.requires_grad_(True)
    head_logprobs(hidden, lin, tokens)  # a trained head lets the workspace go (it runs at the memory peak)
    assert torch.device("cpu") not in head_module._workspace.spaces


def test_entropy_is_float32_under_bf16_autocast():
    """The trainers run the head under bf16 autocast. The entropy must be the float32 sum of
    p log p over the bf16 logits, not a matmul autocast would round to bf16 (a batched matmul had
    done that: ~1e-3 relative error, and both operands copied)."""
    torch.manual_seed(0)
    lin = nn.Linear(64, 4096, bias=False).requires_grad_(False).to(torch.bfloat16)
    hidden = torch.randn(3, 5, 64).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, ent = head_logprobs(hidden, lin, torch.randint(0, 4096, (3, 5)), with_entropy=True)
    z = nn.functional.linear(hidden, lin.weight).double()  # the bf16 logits the head computes
    p = torch.softmax(z, dim=-1)
    expected = -(p * torch.log_softmax(z, dim=-1)).sum(-1)  # float64; entropy ~ 8 nats here, never ~0
    assert ent.dtype == torch.float32
    torch.testing.assert_close(ent.double(), expected, rtol=1e-6, atol=0)


def test_row_dots_golden_and_in_row_chunks():
    a = torch.tensor([[1.0, 2.0, 3.0], [0.5, -1.0, 4.0]])
    b = torch.tensor([[4.0, 5.0, 6.0], [2.0, 3.0, 0.25]])
    torch.testing.assert_close(head_mod._row_dots(a, b), torch.tensor([1 * 4 + 2 * 5 + 3 * 6, 0.5 * 2 - 3 + 1.0]))
    torch.manual_seed(1)
    a, b = torch.rand(20, 2**17), torch.rand(20, 2**17)  # 8 rows per chunk: chunks of 8, 8 and 4 rows
    torch.testing.assert_close(head_mod._row_dots(a, b), (a.double() * b.double()).sum(1).float(), rtol=1e-5, atol=0)
