"""Golden values of the preference losses beside DPO (algos/preference.py): SimPO, ORPO, KTO."""

from __future__ import annotations

import math

import pytest
import torch

from rlhfkit.algos import kto_loss, kto_reference_point, log1mexp, orpo_loss, simpo_loss


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_simpo_golden():
    # pair 1: avg(y_w) = -6 / 3 = -2, avg(y_l) = -12 / 4 = -3 -> 2 * -2 - 2 * -3 - 1 = 1
    # pair 2: avg(y_w) = -4 / 2 = -2, avg(y_l) = -2 / 2 = -1 -> -4 + 2 - 1 = -3
    chosen, rejected = torch.tensor([-6.0, -4.0]), torch.tensor([-12.0, -2.0])
    losses, m = simpo_loss(chosen, rejected, torch.tensor([3.0, 2.0]), torch.tensor([4.0, 2.0]), beta=2.0, gamma=1.0)
    torch.testing.assert_close(losses, torch.tensor([math.log1p(math.exp(-1.0)), math.log1p(math.exp(3.0))]))
    assert m["rewards/chosen"] == pytest.approx((-4.0 - 4.0) / 2)  # beta * avg(y_w)
    assert m["rewards/rejected"] == pytest.approx((-6.0 - 2.0) / 2)
    assert m["rewards/accuracy"] == 0.5 and m["rewards/margin"] == pytest.approx((2.0 - 2.0) / 2)
    assert m["logps/chosen"] == pytest.approx(-5.0) and m["logps/rejected"] == pytest.approx(-7.0)


def test_simpo_needs_no_reference_and_normalises_length():
    """Doubling a response's length with the same per-token log-prob leaves its reward unchanged."""
    a, _ = simpo_loss(torch.tensor([-2.0]), torch.tensor([-3.0]), torch.tensor([2.0]), torch.tensor([2.0]))
    b, _ = simpo_loss(torch.tensor([-4.0]), torch.tensor([-3.0]), torch.tensor([4.0]), torch.tensor([2.0]))
    assert a.item() == pytest.approx(b.item())


def test_orpo_golden():
    # avg(y_w) = -1 / 2 = -0.5: P = e^-0.5, log odds = -0.5 - log(1 - e^-0.5)
    # avg(y_l) = -3 / 3 = -1.0: P = e^-1,   log odds = -1 - log(1 - e^-1)
    lo_w = -0.5 - math.log(1 - math.exp(-0.5))  # 0.43275
    lo_l = -1.0 - math.log(1 - math.exp(-1.0))  # -0.54132
    ratio = lo_w - lo_l
    losses, m = orpo_loss(torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([2.0]), torch.tensor([3.0]), lam=0.1)
    expected = 0.5 + 0.1 * math.log1p(math.exp(-ratio))  # NLL of y_w per token + lambda * -log sigma(ratio)
    assert losses.item() == pytest.approx(expected, rel=1e-6)
    assert m["orpo/log_odds_ratio"] == pytest.approx(ratio, rel=1e-6)
    assert m["orpo/nll"] == pytest.approx(0.5)
    assert m["rewards/chosen"] == pytest.approx(0.1 * -0.5) and m["rewards/rejected"] == pytest.approx(0.1 * -1.0)


def test_orpo_gradient_includes_the_sft_term():
    """lam = 0 leaves plain SFT on the chosen response: d loss / d log pi(y_w) = -1 / |y_w|."""
    chosen = torch.tensor([-4.0], requires_grad=True)
    rejected = torch.tensor([-1.0], requires_grad=True)
    loss, _ = orpo_loss(chosen, rejected, torch.tensor([4.0]), torch.tensor([2.0]), lam=0.0)
    loss.sum().backward()
    assert chosen.grad.item() == pytest.approx(-0.25) and rejected.grad.item() == 0.0


def test_log1mexp_is_accurate_near_zero_and_far_from_it():
    x = torch.tensor([-1e-7, -1e-3, -0.5, -0.6931, -0.6932, -2.0, -30.0], dtype=torch.float32)
    exact = torch.log(-torch.expm1(x.double()))
    torch.testing.assert_close(log1mexp(x).double(), exact, rtol=1e-6, atol=1e-12)


def test_kto_golden():
    # r = log pi - log pi_ref = [1.0, -0.5, 0.3]; labels desirable, undesirable, undesirable
    policy = torch.tensor([-9.0, -10.5, -4.7])
    ref = torch.tensor([-10.0, -10.0, -5.0])
    desirable = torch.tensor([True, False, False])
    z0, beta, lam_d, lam_u = 0.2, 0.1, 1.0, 2.0
    losses, m = kto_loss(policy, ref, desirable, z0, beta, lam_d, lam_u)
    expected = [lam_d * (1 - _sigmoid(beta * (1.0 - z0))),  # desirable: lam_D - lam_D sigma(beta (r - z0))
                lam_u * (1 - _sigmoid(beta * (z0 + 0.5))),  # undesirable: lam_U - lam_U sigma(beta (z0 - r))
                lam_u * (1 - _sigmoid(beta * (z0 - 0.3)))]
    torch.testing.assert_close(losses, torch.tensor(expected))
    assert m["rewards/chosen"] == pytest.approx(0.1 * 1.0)  # sums, pooled by the trainer
    assert m["rewards/rejected"] == pytest.approx(0.1 * (-0.5 + 0.3))
    assert (m["count/chosen"], m["count/rejected"], m["kl"]) == (1.0, 2.0, 0.2)


def test_kto_gradient_pushes_desirable_up_and_undesirable_down():
    policy = torch.tensor([-9.0, -10.5], requires_grad=True)
    losses, _ = kto_loss(policy, torch.tensor([-10.0, -10.0]), torch.tensor([True, False]), 0.0, beta=0.5)
    losses.sum().backward()
    s1, s2 = _sigmoid(0.5 * 1.0), _sigmoid(0.5 * 0.5)
    # d/dr [1 - sigma(b r)] = -b s (1 - s); d/dr [1 - sigma(-b r)] = b s (1 - s)
    torch.testing.assert_close(policy.grad, torch.tensor([-0.5 * s1 * (1 - s1), 0.5 * s2 * (1 - s2)]))


def test_kto_reference_point_is_a_clamped_batch_mean():
    assert kto_reference_point(3.0, 4.0) == 0.75
    assert kto_reference_point(-3.0, 4.0) == 0.0  # a KL estimate below 0 is noise: clamped
    assert kto_reference_point(0.0, 0.0) == 0.0
