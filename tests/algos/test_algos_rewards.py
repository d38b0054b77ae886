"""Reward shaping: KL penalty per token, score on the last valid token (pitfalls docs/pitfalls.md#score-placement, docs/pitfalls.md#eos-policy)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.algos import kl_estimate, shape_rewards

LOGP = torch.tensor([[-1.0, -2.0, -0.5, -9.0], [-0.3, -0.7, -4.0, -4.0]])
REF = torch.tensor([[-1.5, -1.0, -0.5, -1.0], [-0.2, -0.9, -1.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
SCORES = torch.tensor([2.0, -1.0])


def test_golden_k1_score_on_last_valid_token():
    rewards, metrics = shape_rewards(SCORES, LOGP, REF, MASK, kl_coef=0.1)
    # k1 = logp - ref on valid tokens: row0 [0.5, -1.0, 0.0], row1 [-0.1, 0.2]
    # reward = -0.1 * k1, plus the score at the last valid index (2 for row0, 1 for row1)
    expected = torch.tensor(
        [
            [-0.05, 0.1, 0.0 + 2.0, 0.0],
            [0.01, -0.02 + -1.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(rewards, expected)
    kl_sums = [0.5 - 1.0 + 0.0, -0.1 + 0.2]  # per-sequence summed KL: -0.5, 0.1
    assert metrics["kl"] == pytest.approx(sum(kl_sums) / 2)
    assert metrics["non_score_reward"] == pytest.approx(-0.1 * sum(kl_sums) / 2)
    assert metrics["score_mean"] == pytest.approx((2.0 - 1.0) / 2)
    assert all(isinstance(v, float) for v in metrics.values())


def test_left_padding_and_holes_put_score_on_last_valid_token():
    mask = torch.tensor([[0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 1.0, 0.0]])
    rewards, _ = shape_rewards(SCORES, LOGP, LOGP, mask, kl_coef=1.0)  # ref == logp: KL 0
    assert rewards.tolist() == [[0.0, 0.0, 0.0, 2.0], [0.0, 0.0, -1.0, 0.0]]


def test_no_stop_penalty_and_score_clip():
    stopped = torch.tensor([True, False])
    rewards, metrics = shape_rewards(
        torch.tensor([10.0, 3.0]),
        LOGP,
        LOGP,
        MASK,
        kl_coef=0.0,
        stopped=stopped,
        no_stop_penalty=-5.0,
        score_clip=4.0,
    )
    # row 0 stopped: clip(10, -4, 4) = 4; row 1 never stopped: the penalty -5 replaces its score
    assert rewards[0, 2].item() == 4.0 and rewards[1, 1].item() == -5.0
    assert rewards.abs().sum().item() == 9.0  # nothing anywhere else
    assert metrics["score_mean"] == pytest.approx((4.0 - 5.0) / 2)
    assert metrics["score_raw_mean"] == pytest.approx((10.0 + 3.0) / 2)
    assert metrics["stopped_frac"] == 0.5
    # penalty without stop information is a user error
    with pytest.raises(ValueError, match="stopped"):
        shape_rewards(SCORES, LOGP, REF, MASK, 0.1, no_stop_penalty=-1.0)


def test_row_without_valid_tokens_gets_nothing():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    rewards, _ = shape_rewards(SCORES, LOGP, REF, mask, kl_coef=0.1)
    assert (rewards[1] == 0).all()


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "abs"])
def test_estimator_choice_is_used(kind):
    rewards, _ = shape_rewards(torch.zeros(2), LOGP, REF, MASK, kl_coef=0.5, kl_estimator=kind)
    expected = torch.where(MASK.bool(), -0.5 * kl_estimate(LOGP, REF, kind), torch.zeros(()))
    torch.testing.assert_close(rewards, expected)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1.0), st.sampled_from([math.nan, math.inf, 1e6]))
def test_row_sums_and_masked_positions(seed, coef, junk):
    g = torch.Generator().manual_seed(seed)
    B, T = 4, 6
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = (torch.arange(T) < lengths[:, None]).float()
    logp, ref = -torch.rand(B, T, generator=g) * 3, -torch.rand(B, T, generator=g) * 3
    scores = torch.randn(B, generator=g)
    rewards, _ = shape_rewards(scores, logp, ref, mask, kl_coef=coef)
    assert (rewards[mask == 0] == 0).all()
    k1_sum = ((logp - ref) * mask).sum(1)
    expected = torch.where(lengths > 0, -coef * k1_sum + scores, torch.zeros(()))
    torch.testing.assert_close(rewards.sum(1), expected, rtol=1e-5, atol=1e-5)
    # garbage log-probs at padding change nothing
    dirty = torch.where(mask.bool(), logp, torch.full_like(logp, junk))
    torch.testing.assert_close(shape_rewards(scores, dirty, ref, mask, kl_coef=coef)[0], rewards)


def test_inputs_are_not_modified():
    scores, logp = SCORES.clone(), LOGP.clone()
    shape_rewards(scores, logp, REF, MASK, 0.1, score_clip=0.5)
    assert torch.equal(scores, SCORES) and torch.equal(logp, LOGP)
