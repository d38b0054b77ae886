"""GAE (pitfalls docs/pitfalls.md#whitening, docs/pitfalls.md#masked-gae) and group baselines (GRPO, RLOO)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlhfkit.algos import (
    discounted_reverse_cumsum,
    gae,
    gae_reference,
    group_advantages,
    leave_one_out_advantages,
    masked_whiten,
    shape_rewards,
)

BOTH = pytest.mark.parametrize("fn", [gae, gae_reference], ids=["gae", "gae_reference"])

# The worked example (docs/learn, `rlhfkit selfcheck gae`): gamma 0.9, lambda 0.95, terminal after t = 2.
R = torch.tensor([[1.0, 0.0, 2.0]])
V = torch.tensor([[2.0, 2.5, 3.0]])
ONES = torch.ones(1, 3)


@BOTH
def test_gae_worked_example(fn):
    adv, ret = fn(R, V, ONES, gamma=0.9, lam=0.95)
    delta0 = 1 + 0.9 * 2.5 - 2.0  # 1.25
    delta1 = 0 + 0.9 * 3.0 - 2.5  # 0.2
    delta2 = 2 + 0.9 * 0.0 - 3.0  # -1.0 (terminal: V(s_3) = 0)
    a2 = delta2  # -1.0
    a1 = delta1 + 0.9 * 0.95 * a2  # 0.2 - 0.855 = -0.655
    a0 = delta0 + 0.9 * 0.95 * a1  # 1.25 - 0.560025 = 0.689975
    assert (a2, round(a1, 6), round(a0, 6)) == (-1.0, -0.655, 0.689975)
    torch.testing.assert_close(adv, torch.tensor([[a0, a1, a2]]))
    torch.testing.assert_close(ret, adv + V)  # returns = advantages + values


@BOTH
def test_lambda_zero_gives_td_errors(fn):
    adv, _ = fn(R, V, ONES, gamma=0.9, lam=0.0)
    torch.testing.assert_close(adv, torch.tensor([[1 + 0.9 * 2.5 - 2.0, 0 + 0.9 * 3.0 - 2.5, 2 - 3.0]]))


@BOTH
def test_lambda_one_gives_discounted_return_minus_value(fn):
    adv, ret = fn(R, V, ONES, gamma=0.9, lam=1.0)
    g2 = 2.0
    g1 = 0.0 + 0.9 * g2  # 1.8
    g0 = 1.0 + 0.9 * g1  # 2.62
    torch.testing.assert_close(adv, torch.tensor([[g0 - 2.0, g1 - 2.5, g2 - 3.0]]))
    torch.testing.assert_close(ret, torch.tensor([[g0, g1, g2]]))  # lambda = 1: returns are MC returns


@BOTH
def test_bootstrap_value_for_truncated_segment(fn):
    # A truncated segment bootstraps from V(s_{n+1}) instead of a terminal 0.
    adv, _ = fn(R, V, ONES, gamma=0.9, lam=0.95, bootstrap_value=torch.tensor([4.0]))
    delta2 = 2 + 0.9 * 4.0 - 3.0  # 2.6
    a2 = delta2
    a1 = (0 + 0.9 * 3.0 - 2.5) + 0.855 * a2  # 0.2 + 2.223 = 2.423
    a0 = (1 + 0.9 * 2.5 - 2.0) + 0.855 * a1  # 1.25 + 2.071665 = 3.321665
    torch.testing.assert_close(adv, torch.tensor([[a0, a1, a2]]))


@BOTH
def test_padding_is_terminal_and_zero_in_outputs(fn):
    # The worked example's row right-padded with garbage that must be ignored (docs/pitfalls.md#masked-gae).
    r = torch.tensor([[1.0, 0.0, 2.0, 50.0, -7.0]])
    v = torch.tensor([[2.0, 2.5, 3.0, 99.0, 12.0]])
    m = torch.tensor([[1, 1, 1, 0, 0]])
    adv, ret = fn(r, v, m, gamma=0.9, lam=0.95)
    torch.testing.assert_close(adv, torch.tensor([[0.689975, -0.655, -1.0, 0.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.689975 + 2.0, -0.655 + 2.5, -1.0 + 3.0, 0.0, 0.0]]))


@BOTH
def test_kl_folded_into_rewards_then_gae(fn):
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    ref = torch.tensor([[-1.2, -1.5, -0.5, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    rewards, _ = shape_rewards(torch.tensor([1.0]), logp, ref, mask, kl_coef=0.1)
    # k1 = [0.2, -0.5, 0.0] -> -0.1 * k1 = [-0.02, 0.05, 0.0]; score 1.0 on t = 2
    torch.testing.assert_close(rewards, torch.tensor([[-0.02, 0.05, 1.0, 0.0]]))
    values = torch.tensor([[0.5, 0.6, 0.8, 123.0]])
    adv, ret = fn(rewards, values, mask, gamma=1.0, lam=0.95)
    d2 = 1.0 + 0.0 - 0.8  # 0.2
    d1 = 0.05 + 0.8 - 0.6  # 0.25
    d0 = -0.02 + 0.6 - 0.5  # 0.08
    a2 = d2
    a1 = d1 + 0.95 * a2  # 0.44
    a0 = d0 + 0.95 * a1  # 0.498
    torch.testing.assert_close(adv, torch.tensor([[a0, a1, a2, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[a0 + 0.5, a1 + 0.6, a2 + 0.8, 0.0]]))


def test_holes_carry_the_recursion_to_the_next_valid_token():
    # Valid tokens at t = 0, 2, 4: identical to the compacted 3-token trajectory (the worked example).
    r = torch.tensor([[1.0, 9.0, 0.0, -9.0, 2.0]])
    v = torch.tensor([[2.0, 7.0, 2.5, -7.0, 3.0]])
    m = torch.tensor([[1, 0, 1, 0, 1]])
    for fn in (gae, gae_reference):
        adv, ret = fn(r, v, m, gamma=0.9, lam=0.95)
        torch.testing.assert_close(adv, torch.tensor([[0.689975, 0.0, -0.655, 0.0, -1.0]]))
        torch.testing.assert_close(ret[m.bool()], torch.tensor([0.689975 + 2.0, -0.655 + 2.5, -1.0 + 3.0]))


def test_returns_are_computed_before_whitening():
    g = torch.Generator().manual_seed(0)
    r, v = torch.randn(4, 9, generator=g), torch.randn(4, 9, generator=g)
    m = torch.arange(9) < torch.tensor([[9], [5], [1], [7]])
    adv, ret = gae(r, v, m, 0.99, 0.95)
    white = masked_whiten(adv, m)
    torch.testing.assert_close(ret[m], (adv + v)[m])  # raw advantages ...
    assert not torch.allclose(ret[m], (white + v)[m])  # ... not whitened ones


# ---------------------------------------------------------------- vectorised vs loop
@st.composite
def gae_case(draw, arbitrary_mask=False):
    seed = draw(st.integers(0, 2**31 - 1))
    B, T = draw(st.integers(1, 5)), draw(st.integers(1, 40))
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(B, T, generator=g, dtype=torch.float64)
    v = torch.randn(B, T, generator=g, dtype=torch.float64)
    if arbitrary_mask:
        m = torch.rand(B, T, generator=g) < draw(st.floats(0.0, 1.0))
    else:
        m = torch.arange(T) < torch.randint(0, T + 1, (B, 1), generator=g)
    boot = torch.randn(B, generator=g, dtype=torch.float64) if draw(st.booleans()) else None
    gamma = draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]))
    lam = draw(st.sampled_from([0.0, 0.3, 0.95, 1.0]))
    chunk = draw(st.integers(1, 16))
    return r, v, m, gamma, lam, boot, chunk


@settings(max_examples=120, deadline=None)
@given(gae_case(arbitrary_mask=False))
def test_gae_matches_reference_right_padded(case):
    r, v, m, gamma, lam, boot, chunk = case
    adv, ret = gae(r, v, m, gamma, lam, bootstrap_value=boot, chunk_size=chunk)
    adv_ref, ret_ref = gae_reference(r, v, m, gamma, lam, bootstrap_value=boot)
    torch.testing.assert_close(adv, adv_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ret, ret_ref, rtol=1e-10, atol=1e-10)


@settings(max_examples=120, deadline=None)
@given(gae_case(arbitrary_mask=True))
def test_gae_matches_reference_arbitrary_masks(case):
    r, v, m, gamma, lam, boot, chunk = case
    adv, ret = gae(r, v, m.float(), gamma, lam, bootstrap_value=boot, chunk_size=chunk)
    adv_ref, ret_ref = gae_reference(r, v, m, gamma, lam, bootstrap_value=boot)
    torch.testing.assert_close(adv, adv_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ret, ret_ref, rtol=1e-10, atol=1e-10)


@settings(max_examples=100, deadline=None)
@given(gae_case(arbitrary_mask=True), st.sampled_from([math.nan, math.inf, -math.inf, 1e30, 0.0]))
def test_masked_rewards_and_values_never_change_results(case, junk):
    r, v, m, gamma, lam, boot, chunk = case
    r2 = torch.where(m, r, torch.full_like(r, junk))
    v2 = torch.where(m, v, torch.full_like(v, -junk if junk == junk else junk))
    for fn in (gae, gae_reference):
        adv, ret = fn(r, v, m, gamma, lam, bootstrap_value=boot)
        adv2, ret2 = fn(r2, v2, m, gamma, lam, bootstrap_value=boot)
        assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
        assert (adv[~m] == 0).all() and (ret[~m] == 0).all()


def test_float32_large_batch_matches_reference():
    g = torch.Generator().manual_seed(3)
    B, T = 16, 700
    r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    m = torch.arange(T) < torch.randint(1, T + 1, (B, 1), generator=g)
    adv, ret = gae(r, v, m, 0.99, 0.95)
    assert adv.dtype == torch.float32
    adv_ref, _ = gae_reference(r.double(), v.double(), m, 0.99, 0.95)
    torch.testing.assert_close(adv.double(), adv_ref, rtol=1e-4, atol=1e-4)


def test_long_sequence_is_numerically_sound():
    # gamma * lam = 0.5 over 4000 steps: 0.5^4000 underflows; a closed-form cumsum with
    # 1 / (gamma lam)^t factors would overflow to inf/NaN. The blocked scan stays exact.
    g = torch.Generator().manual_seed(5)
    r, v = (
        torch.randn(2, 4000, generator=g, dtype=torch.float64),
        torch.randn(2, 4000, generator=g, dtype=torch.float64),
    )
    m = torch.ones(2, 4000, dtype=torch.bool)
    adv, _ = gae(r, v, m, 1.0, 0.5)
    adv_ref, _ = gae_reference(r, v, m, 1.0, 0.5)
    assert torch.isfinite(adv).all()
    torch.testing.assert_close(adv, adv_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("discount", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("chunk", [1, 3, 32, 100])
def test_discounted_reverse_cumsum_matches_loop(discount, chunk):
    x = torch.randn(3, 37, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected = torch.zeros_like(x)
    acc = torch.zeros(3, dtype=torch.float64)
    for t in reversed(range(37)):
        acc = x[:, t] + discount * acc
        expected[:, t] = acc
    torch.testing.assert_close(
        discounted_reverse_cumsum(x, discount, chunk), expected, rtol=1e-12, atol=1e-12
    )


def test_gae_is_float32_under_bf16_autocast():
    """The chunked cumulative sum runs on matmuls, which bf16 autocast would round (0.5% error on
    returns of ~10, measured): inside a trainer's autocast block GAE must give its float32 result."""
    torch.manual_seed(0)
    r, v, m = torch.randn(4, 300), torch.randn(4, 300), torch.ones(4, 300)
    expected = gae(r, v, m, 1.0, 0.95)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = gae(r, v, m, 1.0, 0.95)
    for e, g in zip(expected, got):
        assert g.dtype == torch.float32 and torch.equal(g, e)


def test_dtypes_and_validation():
    adv, ret = gae(R.bfloat16(), V.bfloat16(), ONES, 0.9, 0.95)
    assert adv.dtype == torch.float32 and ret.dtype == torch.float32
    with pytest.raises(ValueError, match="gamma"):
        gae(R, V, ONES, 1.5, 0.95)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        gae(R, V[:, :2], ONES, 0.9, 0.95)
    with pytest.raises(ValueError, match="bootstrap_value"):
        gae(R, V, ONES, 0.9, 0.95, bootstrap_value=torch.zeros(2))


def test_gae_does_not_modify_inputs():
    r, v, m = R.clone(), V.clone(), ONES.clone()
    gae(r, v, m, 0.9, 0.95)
    assert torch.equal(r, R) and torch.equal(v, V) and torch.equal(m, ONES)


# ---------------------------------------------------------------- group baselines
def test_group_advantages_golden():
    scores = torch.tensor([1.0, 2.0, 3.0, 4.0, 4.0, 4.0])
    # group 0: mean 2, unbiased std sqrt(((1-2)^2 + 0 + (3-2)^2) / (3 - 1)) = 1
    # group 1: all equal -> 0 (no NaN)
    eps = 1e-6
    adv = group_advantages(scores, group_size=3, eps=eps)
    torch.testing.assert_close(adv, torch.tensor([-1 / (1 + eps), 0.0, 1 / (1 + eps), 0.0, 0.0, 0.0]))
    torch.testing.assert_close(
        group_advantages(scores, 3, scale_by_std=False), torch.tensor([-1.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    )


def test_group_advantages_use_unbiased_std():
    scores = torch.tensor([0.0, 2.0])
    # mean 1; unbiased std sqrt((1 + 1) / 1) = sqrt(2) (population std would be 1)
    torch.testing.assert_close(group_advantages(scores, 2, eps=0.0), torch.tensor([-1.0, 1.0]) / math.sqrt(2))


def test_leave_one_out_golden():
    scores = torch.tensor([1.0, 2.0, 3.0, 10.0, 0.0, 5.0])
    # group 0: 1 - (2 + 3) / 2 = -1.5, 2 - (1 + 3) / 2 = 0, 3 - (1 + 2) / 2 = 1.5
    # group 1: 10 - 2.5 = 7.5, 0 - 7.5 = -7.5, 5 - 5 = 0
    torch.testing.assert_close(
        leave_one_out_advantages(scores, 3), torch.tensor([-1.5, 0.0, 1.5, 7.5, -7.5, 0.0])
    )


def _loop_group(scores, G, scale, eps):
    out = []
    for i in range(0, len(scores), G):
        grp = scores[i : i + G]
        mean = sum(grp) / G
        std = math.sqrt(sum((s - mean) ** 2 for s in grp) / (G - 1)) if G > 1 else 0.0
        out += [(s - mean) / (std + eps) if scale else s - mean for s in grp]
    return out


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 6).flatmap(
        lambda G: st.tuples(
            st.just(G),
            st.lists(st.floats(-10, 10), min_size=G, max_size=4 * G).map(lambda s: s[: len(s) // G * G]),
        )
    ),
    st.booleans(),
    st.floats(-100, 100),
)
def test_group_baselines_properties(data, scale, shift):
    G, scores = data
    s = torch.tensor(scores, dtype=torch.float64)
    adv = group_advantages(s, G, scale_by_std=scale)
    torch.testing.assert_close(adv, torch.tensor(_loop_group(scores, G, scale, 1e-6), dtype=torch.float64))
    # invariance: a constant added to every score leaves advantages unchanged
    torch.testing.assert_close(group_advantages(s + shift, G, scale_by_std=scale), adv, rtol=1e-6, atol=1e-6)
    # advantages sum to 0 within each group
    torch.testing.assert_close(adv.view(-1, G).sum(1), torch.zeros(len(scores) // G, dtype=torch.float64))
    if G >= 2:
        loo = leave_one_out_advantages(s, G)
        mean = s.view(-1, G).mean(1, keepdim=True)
        torch.testing.assert_close(loo, (G / (G - 1) * (s.view(-1, G) - mean)).reshape(-1))  # identity
        torch.testing.assert_close(leave_one_out_advantages(s + shift, G), loo, rtol=1e-6, atol=1e-6)


def test_group_validation():
    with pytest.raises(ValueError, match=r"batch size \(5\) must be divisible by group_size \(2\)"):
        group_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        leave_one_out_advantages(torch.zeros(4), 1)
