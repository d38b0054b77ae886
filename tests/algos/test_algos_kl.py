"""KL estimators (docs/pitfalls.md#kl-estimators) and KL controllers (Ziegler et al. 2019)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.algos import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    kl_abs,
    kl_estimate,
    kl_k1,
    kl_k2,
    kl_k3,
)

P = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)  # pi (we sample from it)
Q = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)  # pi_ref
KL_PQ = float((P * (P / Q).log()).sum())  # exact KL(P || Q)


def test_estimators_golden():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    # d = ref - logp = -1
    assert kl_k1(logp, ref).item() == pytest.approx(1.0)  # -d
    assert kl_k2(logp, ref).item() == pytest.approx(0.5)  # 0.5 * (-1)^2
    assert kl_k3(logp, ref).item() == pytest.approx(math.exp(-1) - 1 + 1)  # e^d - 1 - d
    assert kl_abs(logp, ref).item() == pytest.approx(1.0)  # |d|
    for kind, fn in KL_ESTIMATORS.items():
        assert torch.equal(kl_estimate(logp, ref, kind), fn(logp, ref))


def test_unknown_kind_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"'k4'.*\['abs', 'k1', 'k2', 'k3'\]"):
        kl_estimate(torch.zeros(1), torch.zeros(1), "k4")


@settings(max_examples=200, deadline=None)
@given(st.floats(-40, 0, width=32), st.floats(-40, 0, width=32))
def test_k2_k3_abs_are_never_negative_and_zero_iff_equal(a, b):
    logp, ref = torch.tensor([a]), torch.tensor([b])
    for fn in (kl_k2, kl_k3, kl_abs):
        v = fn(logp, ref).item()
        assert v >= 0.0
        if a == b:
            assert v == 0.0
    assert kl_k1(logp, ref).item() == pytest.approx(a - b, abs=1e-5)


def test_k3_is_accurate_for_tiny_log_ratios():
    # exp(d) - 1 - d ~ d^2 / 2 for small d; naive float32 exp(d) - 1 - d returns 0 or garbage
    d = torch.tensor([1e-3, 1e-4, -1e-4])
    k3 = kl_k3(torch.zeros(3), d)
    exact = torch.expm1(d.double()) - d.double()
    torch.testing.assert_close(k3.double(), exact, rtol=1e-3, atol=0)


def test_clamp_bounds_the_log_ratio_and_its_gradient():
    logp = torch.tensor([0.0, 0.0, 0.0], requires_grad=True)
    ref = torch.tensor([1000.0, 3.0, -1000.0])  # d = 1000 would overflow exp()
    k3 = kl_k3(logp, ref, clamp=5.0)
    expected = [math.exp(5) - 1 - 5, math.exp(3) - 1 - 3, math.exp(-5) - 1 + 5]
    torch.testing.assert_close(k3.detach(), torch.tensor(expected))
    k3.sum().backward()
    assert logp.grad[0] == 0 and logp.grad[2] == 0  # clamp active: no gradient
    assert logp.grad[1] == pytest.approx(-(math.exp(3) - 1))  # d k3 / d logp = -(e^d - 1)
    assert kl_k1(logp, ref, clamp=5.0).tolist() == [-5.0, -3.0, 5.0]


def test_k1_and_k3_exact_expectations_equal_kl_k2_abs_do_not():
    # E_{a ~ P}[k(a)] summed exactly over the 3 categories.
    logp, ref = P.log(), Q.log()

    def expect(fn):
        return float((P * fn(logp, ref)).sum())

    assert expect(kl_k1) == pytest.approx(KL_PQ, rel=1e-12)
    assert expect(kl_k3) == pytest.approx(KL_PQ, rel=1e-12)  # E[r] = sum Q = 1
    assert expect(kl_abs) > KL_PQ + 1e-3  # biased upward
    assert abs(expect(kl_k2) - KL_PQ) > 1e-3  # biased


def test_monte_carlo_k1_and_k3_are_unbiased():
    n = 200_000
    gen = torch.Generator().manual_seed(1234)
    a = torch.multinomial(P, n, replacement=True, generator=gen)  # a ~ P
    logp, ref = P.log()[a], Q.log()[a]
    for fn in (kl_k1, kl_k3):
        samples = fn(logp, ref)
        se = samples.std().item() / math.sqrt(n)
        assert abs(samples.mean().item() - KL_PQ) < 4 * se, fn.__name__
    # the same test catches a biased estimator: |d| is off by many standard errors
    s_abs = kl_abs(logp, ref)
    assert abs(s_abs.mean().item() - KL_PQ) > 10 * s_abs.std().item() / math.sqrt(n)


def test_gradient_of_estimates_used_as_losses():
    """E_{a~pi}[grad k(a)] (weights detached): k1 -> 0, k2 -> grad KL(pi||ref), k3 -> grad KL(ref||pi)."""
    theta0 = torch.tensor([0.3, -0.2, 0.5], dtype=torch.float64)
    ref = Q.log()

    def expected_grad(fn):
        theta = theta0.clone().requires_grad_(True)
        logpi = torch.log_softmax(theta, 0)
        (g,) = torch.autograd.grad((logpi.exp().detach() * fn(logpi, ref)).sum(), theta)
        return g

    def grad_of(f):
        theta = theta0.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(f(torch.log_softmax(theta, 0)), theta)
        return g

    grad_rev = grad_of(lambda lp: (lp.exp() * (lp - ref)).sum())  # KL(pi || ref)
    grad_fwd = grad_of(lambda lp: (ref.exp() * (ref - lp)).sum())  # KL(ref || pi)
    torch.testing.assert_close(expected_grad(kl_k1), torch.zeros(3, dtype=torch.float64))
    torch.testing.assert_close(expected_grad(kl_k2), grad_rev)
    torch.testing.assert_close(expected_grad(kl_k3), grad_fwd)
    assert not torch.allclose(grad_fwd, grad_rev)  # so k3's gradient is biased for KL(pi || ref)


# ---------------------------------------------------------------- controllers
def test_fixed_controller():
    c = FixedKLController(0.05)
    c.update(current_kl=100.0, n_steps=512)
    assert c.value == 0.05
    d = FixedKLController(1.0)
    d.load_state_dict(c.state_dict())
    assert d.value == 0.05


def test_adaptive_controller_golden():
    c = AdaptiveKLController(init_coef=0.2, target=6.0, horizon=10_000)
    # KL 9 > target 6: err = clip(9 / 6 - 1 = 0.5, -0.2, 0.2) = 0.2
    c.update(current_kl=9.0, n_steps=256)
    v1 = 0.2 * (1 + 0.2 * 256 / 10_000)  # = 0.2 * 1.00512 = 0.201024
    assert c.value == pytest.approx(v1)
    # KL 5.4 < target: err = 5.4 / 6 - 1 = -0.1 (inside the clip range)
    c.update(current_kl=5.4, n_steps=256)
    v2 = v1 * (1 - 0.1 * 256 / 10_000)
    assert c.value == pytest.approx(v2)
    # KL 0: err = clip(-1, -0.2, 0.2) = -0.2
    c.update(current_kl=0.0, n_steps=100)
    assert c.value == pytest.approx(v2 * (1 - 0.2 * 100 / 10_000))
    # at the target the coefficient does not move
    before = c.value
    c.update(current_kl=6.0, n_steps=1000)
    assert c.value == pytest.approx(before)


def test_adaptive_controller_state_dict_resume():
    a = AdaptiveKLController(0.1, target=4.0, horizon=1000)
    for kl in (8.0, 2.0, 5.0):
        a.update(kl, 64)
    b = AdaptiveKLController(0.5, target=1.0, horizon=10)
    b.load_state_dict(a.state_dict())
    a.update(7.0, 32)
    b.update(7.0, 32)
    assert b.value == a.value and b.state_dict() == a.state_dict()


def test_adaptive_controller_validation():
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(0.1, target=0.0, horizon=10)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, target=1.0, horizon=0)
    with pytest.raises(ValueError, match="finite"):
        AdaptiveKLController(0.1, 1.0, 10).update(float("nan"), 1)
