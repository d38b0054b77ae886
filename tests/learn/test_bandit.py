"""rlhfkit.learn.bandit, the learning path's entry 2: the policy-gradient estimate, the ratio and the
clip on a categorical bandit, checked against the exact gradient worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.learn import bandit

MEANS = torch.tensor(bandit.MEANS, dtype=torch.float64)


def test_reinforce_gradient_on_every_arm_once_is_the_exact_gradient():
    """At theta = 0 the policy is uniform (1/5 per arm), so one draw of each arm is an exact expectation:
    mean_k means_k (e_k - 1/5) = means / 5 - mean(means) / 5 = pi_k (means_k - J), grad J by hand."""
    theta = torch.zeros(5, dtype=torch.float64)
    actions = torch.arange(5)
    by_hand = (MEANS - MEANS.mean()) / 5  # (0.2, 0.5, 0.8, 0.4, 0.1) - 0.4, over 5
    assert by_hand.tolist() == pytest.approx([-0.04, 0.02, 0.08, 0.0, -0.06], abs=1e-15)
    for baseline in (False, True):  # the baseline's term sums to 0 over the arms
        got = bandit.reinforce_gradient(theta, actions, MEANS[actions], baseline)
        assert torch.allclose(got, by_hand, rtol=0, atol=1e-15)
    assert bandit.expected_reward(theta, MEANS) == pytest.approx(0.4, abs=1e-15)


def test_the_ratio_surrogate_has_the_policy_gradient_at_the_old_policy():
    theta_old = torch.tensor([0.3, -0.2, 0.5, 0.0, -1.0], dtype=torch.float64)
    actions, rewards = bandit.sample(theta_old, 16, MEANS, 1.0, torch.Generator().manual_seed(3))
    t = theta_old.clone().requires_grad_(True)
    ratio = (t.log_softmax(-1)[actions] - theta_old.log_softmax(-1)[actions]).exp()
    (grad,) = torch.autograd.grad((ratio * (rewards - rewards.mean())).mean(), t)
    want = bandit.reinforce_gradient(theta_old, actions, rewards)
    assert torch.allclose(grad, want, rtol=0, atol=1e-14 * max(1.0, float(want.abs().max())))


def test_ppos_first_epoch_is_a_reinforce_step_with_a_baseline():
    """One epoch: ratio = 1, nothing clipped, the loss's gradient is minus the REINFORCE estimate."""
    theta = torch.tensor([0.1, 0.0, -0.3, 0.2, 0.0], dtype=torch.float64)
    actions, rewards = bandit.sample(theta, 32, MEANS, 1.0, torch.Generator().manual_seed(0))
    new, m = bandit.ppo_step(theta, actions, rewards, lr=0.7, epochs=1, clip_eps=0.2)
    assert m["policy_clip_frac"] == 0.0
    assert torch.allclose(new, bandit.reinforce_step(theta, actions, rewards, lr=0.7), rtol=0, atol=1e-14)


def test_the_clip_keeps_each_iteration_closer_to_the_old_policy():
    """Many epochs with a large step on one batch: unclipped, the policy runs far from pi_old; clipped, every
    ratio whose advantage asks for more stops near 1 + eps (its gradient is 0 beyond), so it stays near."""
    theta = torch.zeros(5, dtype=torch.float64)
    actions, rewards = bandit.sample(theta, 32, MEANS, 1.0, torch.Generator().manual_seed(0))
    clipped, m = bandit.ppo_step(theta, actions, rewards, lr=2.0, epochs=20, clip_eps=0.2)
    free, _ = bandit.ppo_step(theta, actions, rewards, lr=2.0, epochs=20, clip_eps=None)
    assert m["policy_clip_frac"] > 0
    assert bandit.kl(theta, clipped) < 0.1 < bandit.kl(theta, free)
    ratio = (clipped.log_softmax(-1) - theta.log_softmax(-1)).exp()
    assert float(ratio.max()) < 1.2 + 0.2  # one step past the band at most: the clip bounds the incentive


def test_kl_golden_and_train_records_every_iteration():
    old = torch.log(torch.tensor([0.5, 0.5], dtype=torch.float64))
    new = torch.log(torch.tensor([0.25, 0.75], dtype=torch.float64))
    # KL = 0.5 ln(0.5 / 0.25) + 0.5 ln(0.5 / 0.75) = 0.5 ln 2 + 0.5 ln(2/3)
    assert bandit.kl(old, new) == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), rel=1e-12)
    trace = bandit.train("ppo", iterations=5, batch=8)
    assert len(trace.reward) == len(trace.step_kl) == 5 and all(k >= 0 for k in trace.step_kl)
    with pytest.raises(ValueError, match="method must be"):
        bandit.train("a2c")
