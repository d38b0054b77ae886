"""Golden values and invariances of the policy-gradient variants (algos/policy_gradient.py):
GSPO's sequence ratio and clip, GSPO-token, truncated importance-sampling weights, DAPO's overlong
punishment, REINFORCE++'s return and ReMax's baseline."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.algos import (
    clipped_policy_loss,
    overlong_penalty,
    ppo_policy_loss,
    remax_advantages,
    reward_to_go,
    sequence_log_ratio,
    truncated_is_weights,
)

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
OLD = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-1.5, -0.2, 0.0, 0.0]])


def _logp(deltas):
    """New log-probs = OLD + deltas, as a leaf with grad; padding holds garbage that must not matter."""
    lp = (OLD + torch.tensor(deltas)).clone()
    lp[0, 3], lp[1, 2:] = 50.0, -50.0
    return lp.requires_grad_()


# ----------------------------------------------------------------------------- GSPO


def test_sequence_log_ratio_golden():
    lp = _logp([[0.3, -0.1, 0.1, 0.0], [0.2, -0.4, 0.0, 0.0]])
    # row 0: (0.3 - 0.1 + 0.1) / 3 = 0.1; row 1: (0.2 - 0.4) / 2 = -0.1 (padding ignored)
    torch.testing.assert_close(sequence_log_ratio(lp, OLD, MASK), torch.tensor([0.1, -0.1]))


def test_gspo_sequence_loss_golden_with_seq_mean():
    """Loss = (1/G) sum_i max(-A_i s_i, -A_i clip(s_i, 1 - eps, 1 + eps_high))."""
    lp = _logp([[0.3, -0.1, 0.1, 0.0], [0.2, -0.4, 0.0, 0.0]])
    adv = torch.tensor([[2.0] * 4, [-1.0] * 4]) * MASK
    loss, m = clipped_policy_loss(lp, OLD, adv, MASK, clip_eps=0.05, clip_eps_high=0.08, agg_mode="seq-mean",
                                  level="sequence")
    s0, s1 = math.exp(0.1), math.exp(-0.1)  # 1.10517, 0.90484
    l0 = max(-2.0 * s0, -2.0 * 1.08)  # A > 0 and s above 1 + 0.08: clipped, -2.16
    l1 = max(1.0 * s1, 1.0 * 0.95)  # A < 0 and s below 1 - 0.05: clipped, 0.95
    assert loss.item() == pytest.approx((l0 + l1) / 2, rel=1e-6)
    assert m["policy_clip_frac"] == 1.0  # both sequences clipped, with all their tokens
    assert m["seq_ratio_mean"] == pytest.approx((s0 + s1) / 2, rel=1e-6)
    loss.backward()
    assert lp.grad.abs().max() == 0  # a clipped sequence has no gradient at all


def test_gspo_gradient_spreads_the_sequence_ratio_over_its_tokens():
    """Unclipped: d/d logp_it of -A_i s_i / G = -A_i s_i / (|y_i| G) on every token of row i."""
    lp = _logp([[0.03, -0.01, 0.01, 0.0], [0.02, -0.04, 0.0, 0.0]])
    adv = torch.tensor([[2.0] * 4, [-1.0] * 4]) * MASK
    loss, _ = clipped_policy_loss(lp, OLD, adv, MASK, clip_eps=0.2, agg_mode="seq-mean", level="sequence")
    loss.backward()
    s0, s1 = math.exp(0.01), math.exp(-0.01)
    expected = torch.tensor([[-2.0 * s0 / 3 / 2] * 3 + [0.0], [1.0 * s1 / 2 / 2] * 2 + [0.0, 0.0]])
    torch.testing.assert_close(lp.grad, expected, rtol=1e-5, atol=1e-8)


def test_gspo_token_has_the_sequence_value_and_with_constant_advantages_its_gradient():
    deltas = [[0.03, -0.01, 0.06, 0.0], [0.02, -0.04, 0.0, 0.0]]
    adv = torch.tensor([[2.0] * 4, [-1.0] * 4]) * MASK
    out = {}
    for level in ("sequence", "sequence-token", "token"):
        lp = _logp(deltas)
        loss, m = clipped_policy_loss(lp, OLD, adv, MASK, clip_eps=0.2, agg_mode="seq-mean", level=level)
        loss.backward()
        out[level] = (loss.item(), lp.grad.clone(), m["ratio_mean"])
    assert out["sequence-token"][0] == pytest.approx(out["sequence"][0], rel=1e-6)
    torch.testing.assert_close(out["sequence-token"][1], out["sequence"][1], rtol=1e-5, atol=1e-8)
    # the token ratio is a different estimator: unequal per-token deltas give another gradient
    assert not torch.allclose(out["token"][1], out["sequence"][1], rtol=1e-3, atol=1e-6)


def test_gspo_token_keeps_per_token_advantages():
    """With A varying along a row, each token's gradient is -A_it s_i / (|y_i| G) (the value of s_i)."""
    lp = _logp([[0.0] * 4, [0.0] * 4])
    adv = torch.tensor([[1.0, -2.0, 3.0, 0.0], [0.5, 0.5, 0.0, 0.0]])
    loss, _ = clipped_policy_loss(lp, OLD, adv, MASK, agg_mode="seq-mean", level="sequence-token")
    loss.backward()
    expected = torch.tensor([[-1 / 6, 2 / 6, -3 / 6, 0.0], [-0.5 / 4, -0.5 / 4, 0.0, 0.0]])  # s = 1
    torch.testing.assert_close(lp.grad, expected)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean", "constant"])
def test_token_level_equals_ppo_policy_loss(agg):
    g = torch.Generator().manual_seed(0)
    old = torch.randn(3, 5, generator=g)
    mask = (torch.rand(3, 5, generator=g) > 0.3).float()
    adv = torch.randn(3, 5, generator=g)
    a = (old + 0.3 * torch.randn(3, 5, generator=g)).requires_grad_()
    b = a.detach().clone().requires_grad_()
    kw = dict(clip_eps=0.1, agg_mode=agg, num_tokens=7.0, num_seqs=3.0, constant=20.0, clip_eps_high=0.15)
    la, ma = clipped_policy_loss(a, old, adv, mask, level="token", **kw)
    lb, mb = ppo_policy_loss(b, old, adv, mask, **kw)
    la.backward()
    lb.backward()
    assert la.item() == lb.item() and torch.equal(a.grad, b.grad)
    assert {k: ma[k] for k in mb} == mb


@pytest.mark.parametrize("level", ["token", "sequence", "sequence-token"])
def test_loss_and_gradient_do_not_depend_on_the_row_split(level):
    """Global normalisers: micro-batches of rows add up to the whole batch's loss and gradient."""
    g = torch.Generator().manual_seed(1)
    old = torch.randn(6, 5, generator=g)
    mask = torch.ones(6, 5)
    mask[0, 2:], mask[3, 4:], mask[5, 1:] = 0, 0, 0
    adv = torch.randn(6, 1, generator=g).expand(6, 5) * mask
    weights = torch.rand(6, 5, generator=g) + 0.5
    new = old + 0.2 * torch.randn(6, 5, generator=g)
    n_tok, n_seq = mask.sum().item(), 6.0
    for agg in ("token-mean", "seq-mean"):
        grads = []
        for splits in ([6], [2, 4], [1, 1, 3, 1]):
            lp = new.clone().requires_grad_()
            total, start = 0.0, 0
            for size in splits:
                r = slice(start, start + size)
                loss, _ = clipped_policy_loss(lp[r], old[r], adv[r], mask[r], clip_eps=0.1, agg_mode=agg,
                                              num_tokens=n_tok, num_seqs=n_seq, level=level, weights=weights[r])
                loss.backward()
                total += loss.item()
                start += size
            grads.append((total, lp.grad.clone()))
        for total, grad in grads[1:]:
            assert total == pytest.approx(grads[0][0], rel=1e-6, abs=1e-8)
            torch.testing.assert_close(grad, grads[0][1], rtol=1e-5, atol=1e-8)


def test_unknown_level():
    with pytest.raises(ValueError, match="unknown importance level 'seq'"):
        clipped_policy_loss(OLD, OLD, OLD, MASK, level="seq")


# ----------------------------------------------------------------------------- truncated IS


def test_truncated_is_weights_golden():
    trainer = torch.tensor([[-1.0, -2.0, -0.5, -9.0]])
    sampler = torch.tensor([[-1.0, -3.0, -0.4, float("nan")]])  # the last token: no sampler log-prob
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    w, m = truncated_is_weights(trainer, sampler, mask, cap=2.0)
    # pi_train / pi_sampler = e^0 = 1, e^1 = 2.718 -> capped at 2, e^-0.1 = 0.9048; unknown -> 1
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, math.exp(-0.1), 1.0]]))
    assert m["is_weight_mean"] == pytest.approx((1 + 2 + math.exp(-0.1)) / 3)  # over the 3 known tokens
    assert m["is_clip_frac"] == pytest.approx(1 / 3)
    k3 = [0.0, math.exp(1) - 1 - 1, math.exp(-0.1) - 1 + 0.1]  # exp(d) - 1 - d, d = trainer - sampler
    assert m["mismatch_kl"] == pytest.approx(sum(k3) / 3, rel=1e-5)


def test_is_weight_is_exactly_one_when_the_sampler_is_the_trainer():
    lp = torch.randn(4, 7, generator=torch.Generator().manual_seed(3)) * 3
    mask = torch.ones(4, 7)
    mask[1, 3:] = 0
    w, m = truncated_is_weights(lp, lp.clone(), mask, cap=1.0)
    assert torch.equal(w, torch.ones(4, 7))
    assert (m["is_weight_mean"], m["is_clip_frac"], m["mismatch_kl"]) == (1.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="cap C must be >= 1"):
        truncated_is_weights(lp, lp, mask, cap=0.5)


def test_weights_multiply_each_tokens_loss():
    lp = _logp([[0.0] * 4, [0.0] * 4])
    adv = torch.tensor([[1.0, 1.0, 1.0, 0.0], [-2.0, -2.0, 0.0, 0.0]])
    w = torch.tensor([[2.0, 1.0, 0.5, 7.0], [1.0, 0.25, 9.0, 9.0]])  # padding weights cannot matter
    loss, _ = clipped_policy_loss(lp, OLD, adv, MASK, agg_mode="token-mean", weights=w)
    # ratio 1: l_t = -A_t w_t; token mean over 5 tokens
    assert loss.item() == pytest.approx((-(2 + 1 + 0.5) + 2 * (1 + 0.25)) / 5)


# ----------------------------------------------------------------------------- DAPO, REINFORCE++, ReMax


def test_overlong_penalty_golden():
    # L_max 16, L_cache 4: no penalty up to 12 tokens, then (12 - |y|) / 4, -1 at and beyond 16
    lengths = torch.tensor([3, 12, 13, 14, 16, 17])
    torch.testing.assert_close(overlong_penalty(lengths, 16, 4), torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))
    torch.testing.assert_close(overlong_penalty(lengths, 16, 4, factor=0.5)[2:4], torch.tensor([-0.125, -0.25]))
    with pytest.raises(ValueError, match="buffer must be in"):
        overlong_penalty(lengths, 16, 0)


def test_reward_to_go_golden():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 99.0], [0.5, -1.0, 99.0, 99.0]])  # 99 on padding must not count
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    torch.testing.assert_close(reward_to_go(rewards, mask), torch.tensor([[6.0, 5.0, 3.0, 0.0], [-0.5, -1.0, 0.0, 0.0]]))


def test_remax_advantages_golden():
    # two prompts, G = 2: baseline = the greedy completion's reward of the same prompt
    adv = remax_advantages(torch.tensor([1.0, 0.0, 0.5, 0.25]), torch.tensor([0.5, 0.0]), 2)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0.5, 0.25]))
    with pytest.raises(ValueError, match="greedy_scores"):
        remax_advantages(torch.ones(4), torch.ones(3), 2)
