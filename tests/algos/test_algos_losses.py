"""Loss aggregation (docs/pitfalls.md#loss-aggregation), PPO losses and metrics (docs/pitfalls.md#metric-definitions), DPO/IPO/cDPO, Bradley-Terry."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from rlhfkit.algos import (
    AGG_MODES,
    aggregate_loss,
    bradley_terry_loss,
    dpo_loss,
    entropy_loss,
    ppo_policy_loss,
    ppo_value_loss,
)


def log1pexp(x):  # -log sigma(x) = log(1 + e^-x), so -log sigma(x) = log1pexp(-x)
    return math.log1p(math.exp(x))


# ---------------------------------------------------------------- aggregation
PT = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
PM = torch.tensor([[1, 1, 0], [1, 0, 0]])


def test_aggregate_golden():
    # token-mean: (1 + 2 + 4) / 3 valid tokens
    assert aggregate_loss(PT, PM, "token-mean").item() == pytest.approx(7 / 3)
    assert aggregate_loss(PT, PM, "token-mean", num_tokens=14).item() == pytest.approx(7 / 14)
    # seq-mean: ((1 + 2) / 2 + 4 / 1) / 2 sequences
    assert aggregate_loss(PT, PM, "seq-mean").item() == pytest.approx((1.5 + 4.0) / 2)
    assert aggregate_loss(PT, PM, "seq-mean", num_seqs=11).item() == pytest.approx(5.5 / 11)
    # constant: (1 + 2 + 4) / 10
    assert aggregate_loss(PT, PM, "constant", constant=10).item() == pytest.approx(0.7)


def test_one_kwargs_dict_fits_every_loss():
    # Trainers build agg = dict(agg_mode=..., num_tokens=..., num_seqs=...) once and splat it
    # into every loss; aggregate_loss accepts agg_mode as an alias of mode.
    agg = {"agg_mode": "seq-mean", "num_tokens": 3, "num_seqs": 2}
    assert aggregate_loss(PT, PM, **agg).item() == pytest.approx((1.5 + 4.0) / 2)
    assert entropy_loss(PT, PM, **agg).item() == pytest.approx((1.5 + 4.0) / 2)
    with pytest.raises(ValueError, match="conflicting"):
        aggregate_loss(PT, PM, "constant", agg_mode="seq-mean", constant=1.0)


def test_aggregate_empty_mask_and_bad_mode():
    empty = torch.zeros(2, 3)
    for mode in AGG_MODES:
        assert aggregate_loss(PT, empty, mode, constant=4.0).item() == 0.0
    with pytest.raises(ValueError, match=r"valid modes: \['token-mean', 'seq-mean', 'constant'\]"):
        aggregate_loss(PT, PM, "sum")
    with pytest.raises(ValueError, match="constant"):
        aggregate_loss(PT, PM, "constant")


def _batch(seed=0, B=6, T=7):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 1, 4, 2, 6, 3])[:B]  # very different token counts per row
    mask = (torch.arange(T) < lengths[:, None]).float()
    logp = -torch.rand(B, T, generator=g) * 2
    old = logp + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g)
    return logp, old, adv, mask


SPLITS = [[[0, 1], [2]], [[3, 4], [5]]]  # 2 "processes" x 2 accumulation steps, unequal sizes


@pytest.mark.parametrize("mode", AGG_MODES)
def test_microbatch_splitting_gives_same_loss_and_gradient(mode):
    logp, old, adv, mask = _batch()
    B, T = mask.shape
    N, S, C = mask.sum(), B, B * T  # global normalisers (all-reduced over steps and processes)

    full_lp = logp.clone().requires_grad_(True)
    full, _ = ppo_policy_loss(full_lp, old, adv, mask, agg_mode=mode, constant=C)
    full.backward()

    world = len(SPLITS)
    grads, total = torch.zeros(B, T), 0.0
    for rank_rows in SPLITS:
        lp = logp.clone().requires_grad_(True)  # this rank's copy of the parameters
        rank_loss = 0.0
        for rows in rank_rows:  # gradient accumulation: losses (and grads) add up
            loss, _ = ppo_policy_loss(
                lp[rows],
                old[rows],
                adv[rows],
                mask[rows],
                agg_mode=mode,
                num_tokens=N,
                num_seqs=S,
                constant=C,
            )
            # DDP averages gradients over ranks, so each rank scales by world size.
            (loss * world).backward()
            rank_loss += loss.item()
        grads += lp.grad / world  # the all-reduce mean DDP performs
        total += rank_loss
    assert total == pytest.approx(full.item(), rel=1e-6)
    torch.testing.assert_close(grads, full_lp.grad, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean"])
def test_local_normalisers_would_break_split_invariance(mode):
    # The failure the global normaliser prevents: averaging per-micro-batch means.
    logp, old, adv, mask = _batch()
    per_token = -adv * torch.exp(logp - old)
    full = aggregate_loss(per_token, mask, mode)
    parts = [aggregate_loss(per_token[r], mask[r], mode) for r in ([0, 1], [2], [3, 4], [5])]
    assert abs(sum(parts) / len(parts) - full.item()) > 1e-3


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from(AGG_MODES), st.integers(1, 5))
def test_aggregate_split_invariance_random(seed, mode, n_parts):
    g = torch.Generator().manual_seed(seed)
    B, T = 6, 5
    x = torch.randn(B, T, generator=g, dtype=torch.float64, requires_grad=True)
    m = torch.rand(B, T, generator=g) < 0.6
    cuts = sorted(torch.randperm(B - 1, generator=g)[: n_parts - 1].add(1).tolist())
    bounds = [0, *cuts, B]
    kw = {"num_tokens": m.sum(), "num_seqs": B, "constant": 7.0}
    full = aggregate_loss(x, m, mode, constant=7.0)
    (g_full,) = torch.autograd.grad(full, x)
    split = sum(aggregate_loss(x[a:b], m[a:b], mode, **kw) for a, b in zip(bounds[:-1], bounds[1:]))
    (g_split,) = torch.autograd.grad(split, x)
    torch.testing.assert_close(split, full)
    torch.testing.assert_close(g_split, g_full)


# ---------------------------------------------------------------- PPO policy loss
def test_policy_loss_golden():
    old = torch.zeros(1, 4)
    logp = torch.tensor([[math.log(1.5), math.log(0.5), 0.0, 55.0]])
    adv = torch.tensor([[1.0, -1.0, 2.0, 3.0]])
    mask = torch.tensor([[1, 1, 1, 0]])  # last token is padding with a crazy log-prob
    loss, m = ppo_policy_loss(logp, old, adv, mask, clip_eps=0.2)
    # t0: ratio 1.5, A=1:  max(-1.5, -1.2) = -1.2   (clipped term strictly greater)
    # t1: ratio 0.5, A=-1: max(0.5, 0.8) = 0.8      (clipped term strictly greater)
    # t2: ratio 1.0, A=2:  max(-2, -2) = -2          (tie: not counted as clipped)
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 2.0) / 3)
    assert m["policy_clip_frac"] == pytest.approx(2 / 3)
    assert m["approx_kl"] == pytest.approx((0.5 * math.log(1.5) ** 2 + 0.5 * math.log(0.5) ** 2 + 0) / 3)
    assert m["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.0) / 3)
    assert m["ratio_max"] == pytest.approx(1.5)  # padding's exp(55) is not counted


def test_policy_loss_first_minibatch_ratio_is_one():
    logp, _, adv, mask = _batch()
    loss, m = ppo_policy_loss(logp, logp.clone(), adv, mask)
    assert loss.item() == pytest.approx(-(adv * mask).sum().item() / mask.sum().item(), rel=1e-6)
    assert m["ratio_mean"] == 1.0 and m["ratio_max"] == 1.0
    assert m["approx_kl"] == 0.0 and m["policy_clip_frac"] == 0.0


def test_policy_loss_garbage_on_padding_gives_finite_gradients():
    logp = torch.tensor([[-1.0, math.inf, -math.inf]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.0, math.nan]])
    adv = torch.tensor([[0.5, math.nan, 1.0]])
    loss, _ = ppo_policy_loss(logp, old, adv, torch.tensor([[1, 0, 0]]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()
    assert logp.grad[0, 1:].abs().sum() == 0


@settings(max_examples=200, deadline=None)
@given(st.floats(-0.7, 0.7), st.floats(-3, 3), st.sampled_from([None, 0.28]))
def test_policy_gradient_is_zero_exactly_where_the_clip_applies(log_ratio, a, eps_high):
    eps = 0.2
    hi = eps if eps_high is None else eps_high
    ratio = math.exp(log_ratio)
    assume(abs(a) > 1e-3 and abs(ratio - (1 - eps)) > 1e-4 and abs(ratio - (1 + hi)) > 1e-4)
    logp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(1, 1, dtype=torch.float64)
    adv = torch.tensor([[a]], dtype=torch.float64)
    loss, m = ppo_policy_loss(logp, old, adv, torch.ones(1, 1), clip_eps=eps, clip_eps_high=eps_high)
    loss.backward()
    clipped_side = (a > 0 and ratio > 1 + hi) or (a < 0 and ratio < 1 - eps)
    if clipped_side:
        assert logp.grad.item() == 0.0
        assert m["policy_clip_frac"] == 1.0
    else:  # inside the range, or outside on the side the clip does not apply
        assert logp.grad.item() == pytest.approx(-a * ratio)  # d(-A * exp(logp - old)) / d logp
        assert m["policy_clip_frac"] == 0.0


# ---------------------------------------------------------------- PPO value loss
def test_value_loss_golden():
    v = torch.tensor([[1.0, 2.0, 9.0]])
    old = torch.tensor([[0.5, 2.0, 0.0]])
    ret = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, m = ppo_value_loss(v, old, ret, mask, clip_eps=0.2)
    # t0: v - old = 0.5 -> clipped to 0.2, v_clip = 0.7; err (1-2)^2 = 1, clipped (0.7-2)^2 = 1.69
    #     -> 0.5 * max(1, 1.69) = 0.845 (clipped term strictly greater)
    # t1: v == old -> v_clip = 2; err = clipped = (2-1)^2 = 1 -> 0.5 (tie: not clipped)
    assert loss.item() == pytest.approx((0.845 + 0.5) / 2)
    assert m["value_clip_frac"] == pytest.approx(0.5)
    assert m["value_mean"] == pytest.approx((1.0 + 2.0) / 2)
    assert m["value_error"] == pytest.approx((1.0 + 1.0) / 2)
    loss_nc, m_nc = ppo_value_loss(v, old, ret, mask, clip_eps=None)
    assert loss_nc.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)
    assert m_nc["value_clip_frac"] == 0.0


@settings(max_examples=150, deadline=None)
@given(st.floats(-2, 2), st.floats(-2, 2), st.floats(-2, 2))
def test_value_gradient_is_zero_when_the_clipped_error_wins(v, old, ret):
    eps = 0.2
    assume(abs(abs(v - old) - eps) > 1e-4)
    vt = torch.tensor([[v]], dtype=torch.float64, requires_grad=True)
    loss, m = ppo_value_loss(
        vt, torch.tensor([[old]]).double(), torch.tensor([[ret]]).double(), torch.ones(1, 1)
    )
    loss.backward()
    v_clip = old + max(-eps, min(eps, v - old))
    err, cerr = (v - ret) ** 2, (v_clip - ret) ** 2
    assume(abs(err - cerr) > 1e-6)
    if cerr > err:  # clipped term active and v outside the trust region: no gradient
        assert vt.grad.item() == 0.0 and m["value_clip_frac"] == 1.0
    else:
        assert vt.grad.item() == pytest.approx(v - ret)  # d 0.5 (v - R)^2 / dv
        assert m["value_clip_frac"] == 0.0


def test_entropy_loss_uses_the_same_rule():
    ent = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert entropy_loss(ent, PM).item() == pytest.approx(7 / 3)
    assert entropy_loss(ent, PM, agg_mode="seq-mean").item() == pytest.approx(2.75)
    assert entropy_loss(ent, PM, num_tokens=7).item() == pytest.approx(1.0)


# ---------------------------------------------------------------- DPO family
LOGPS = dict(
    policy_chosen_logps=torch.tensor([-1.0]),
    policy_rejected_logps=torch.tensor([-3.0]),
    ref_chosen_logps=torch.tensor([-2.0]),
    ref_rejected_logps=torch.tensor([-2.0]),
)
# h = (-1 - (-2)) - (-3 - (-2)) = 1 - (-1) = 2


def test_dpo_sigmoid_golden():
    losses, m = dpo_loss(**LOGPS, beta=0.5)
    # beta h = 1 -> -log sigma(1) = log(1 + e^-1)
    assert losses.item() == pytest.approx(log1pexp(-1.0))
    assert m["rewards/chosen"] == pytest.approx(0.5 * 1.0)
    assert m["rewards/rejected"] == pytest.approx(0.5 * -1.0)
    assert m["rewards/margin"] == pytest.approx(1.0)
    assert m["rewards/accuracy"] == 1.0
    assert m["logps/chosen"] == -1.0 and m["logps/rejected"] == -3.0


def test_cdpo_label_smoothing_golden():
    losses, _ = dpo_loss(**LOGPS, beta=0.5, label_smoothing=0.1)
    # -(0.9) log sigma(1) - 0.1 log sigma(-1)
    assert losses.item() == pytest.approx(0.9 * log1pexp(-1.0) + 0.1 * log1pexp(1.0))


def test_ipo_golden():
    losses, _ = dpo_loss(**LOGPS, beta=0.5, loss_type="ipo")
    assert losses.item() == pytest.approx((2.0 - 1 / (2 * 0.5)) ** 2)  # (2 - 1)^2 = 1
    losses, _ = dpo_loss(**LOGPS, beta=0.1, loss_type="ipo")
    assert losses.item() == pytest.approx((2.0 - 5.0) ** 2)  # 1 / (2 * 0.1) = 5 -> 9


def test_dpo_validation():
    with pytest.raises(ValueError, match=r"valid types: \['sigmoid', 'ipo', 'hinge', 'robust'\]"):
        dpo_loss(**LOGPS, loss_type="exo_pair")
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(**LOGPS, loss_type="ipo", label_smoothing=0.1)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(**LOGPS, beta=0.0)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-20, 0), min_size=4, max_size=4), st.floats(0.01, 2.0), st.floats(-5, 5))
def test_dpo_properties(lp, beta, shift):
    pc, pr, rc, rr = (torch.tensor([x], dtype=torch.float64) for x in lp)
    h = (pc - rc) - (pr - rr)
    loss, _ = dpo_loss(pc, pr, rc, rr, beta=beta)
    swapped, _ = dpo_loss(pr, pc, rr, rc, beta=beta)
    # -log sigma(x) + log sigma(-x) = -x: swapping chosen and rejected flips the sign of h
    torch.testing.assert_close(loss - swapped, -beta * h)
    # a policy shift shared by both responses (and references) changes nothing
    torch.testing.assert_close(dpo_loss(pc + shift, pr + shift, rc, rr, beta=beta)[0], loss)
    # the gradient pushes the chosen log-prob up and the rejected one down
    pc_ = pc.clone().requires_grad_(True)
    pr_ = pr.clone().requires_grad_(True)
    dpo_loss(pc_, pr_, rc, rr, beta=beta)[0].sum().backward()
    assert pc_.grad.item() <= 0 <= pr_.grad.item()
    torch.testing.assert_close(pc_.grad, -beta * torch.sigmoid(-beta * h))


# ---------------------------------------------------------------- Bradley-Terry
def test_bradley_terry_golden():
    chosen, rejected = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0])
    loss, m = bradley_terry_loss(chosen, rejected)
    # diffs [1, -1] -> mean(log(1 + e^-1), log(1 + e^1))
    assert loss.item() == pytest.approx((log1pexp(-1.0) + log1pexp(1.0)) / 2)
    assert m == {"accuracy": 0.5, "margin": 0.0, "chosen_mean": 1.0, "rejected_mean": 1.0}
    # margin 0.5: logits [1 - 0.5, -1 - 0.5]
    loss_m, _ = bradley_terry_loss(chosen, rejected, margin=0.5)
    assert loss_m.item() == pytest.approx((log1pexp(-0.5) + log1pexp(1.5)) / 2)
    loss_v, _ = bradley_terry_loss(chosen, rejected, margin=torch.tensor([0.5, 0.0]))
    assert loss_v.item() == pytest.approx((log1pexp(-0.5) + log1pexp(1.0)) / 2)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-10, 10), st.floats(-10, 10)), min_size=1, max_size=8), st.floats(-50, 50)
)
def test_bradley_terry_shift_invariance(pairs, shift):
    c = torch.tensor([p[0] for p in pairs], dtype=torch.float64)
    r = torch.tensor([p[1] for p in pairs], dtype=torch.float64)
    loss, _ = bradley_terry_loss(c, r)
    torch.testing.assert_close(bradley_terry_loss(c + shift, r + shift)[0], loss)
    torch.testing.assert_close(loss, F.softplus(-(c - r)).mean())
