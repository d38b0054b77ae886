"""Distillation losses (algos/distill.py): golden values with the arithmetic written out, the limits
of GKD's generalised JSD, top-k against full, masking, the on-policy reverse KL's gradient, and
TRL's GKD loss and gradient on the same tensors (when trl is installed)."""

import math

import pytest
import torch
import torch.nn.functional as F

from rlhfkit.algos import generalized_jsd, jsd_loss, reverse_kl_loss, teacher_topk, topk_logprobs

# Two distributions over 2 tokens, written out: p_s = (0.8, 0.2), p_t = (0.5, 0.5)
PS, PT = (0.8, 0.2), (0.5, 0.5)


def _logp(p):
    return torch.tensor([math.log(x) for x in p], dtype=torch.float64)


def _kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def test_jsd_golden_at_beta_0_half_1():
    s, t = _logp(PS), _logp(PT)
    # beta = 0: forward KL(p_t || p_s) = 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2)
    forward = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    assert generalized_jsd(s, t, 0.0).item() == pytest.approx(forward, rel=1e-12)
    # beta = 1: reverse KL(p_s || p_t) = 0.8 ln(0.8/0.5) + 0.2 ln(0.2/0.5)
    reverse = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)
    assert generalized_jsd(s, t, 1.0).item() == pytest.approx(reverse, rel=1e-12)
    # beta = 0.5: m = (0.65, 0.35); 0.5 KL(p_t || m) + 0.5 KL(p_s || m)
    m = (0.5 * 0.5 + 0.5 * 0.8, 0.5 * 0.5 + 0.5 * 0.2)
    half = 0.5 * (0.5 * math.log(0.5 / m[0]) + 0.5 * math.log(0.5 / m[1])) \
        + 0.5 * (0.8 * math.log(0.8 / m[0]) + 0.2 * math.log(0.2 / m[1]))
    assert generalized_jsd(s, t, 0.5).item() == pytest.approx(half, rel=1e-12)
    # beta = 0.25: m = 0.25 p_t + 0.75 p_s, the teacher's share is beta (TRL's convention)
    m = (0.25 * 0.5 + 0.75 * 0.8, 0.25 * 0.5 + 0.75 * 0.2)
    quarter = 0.25 * _kl(PT, m) + 0.75 * _kl(PS, m)
    assert generalized_jsd(s, t, 0.25).item() == pytest.approx(quarter, rel=1e-12)


def test_jsd_limits_name_the_ends():
    # The mixture formula tends to 0 at both ends; divided by beta (1 - beta) it tends to the
    # forward (reverse) KL, which beta = 0 (1) is defined as.
    s, t = _logp(PS), _logp(PT)
    for eps in (1e-4, 1e-5):
        assert (generalized_jsd(s, t, eps) / eps).item() == pytest.approx(_kl(PT, PS), rel=1e-3)
        assert (generalized_jsd(s, t, 1 - eps) / eps).item() == pytest.approx(_kl(PS, PT), rel=1e-3)
    with pytest.raises(ValueError, match=r"beta \(1.5\) must be in \[0, 1\]"):
        generalized_jsd(s, t, 1.5)


def _logits(B=3, T=5, V=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, T, V, generator=g) * 2, torch.randn(B, T, V, generator=g) * 2,
            torch.rand(B, T, generator=g) > 0.3)


@pytest.mark.parametrize("beta", [0.0, 0.3, 0.5, 1.0])
def test_topk_equals_full_when_k_is_vocab(beta):
    s, t, mask = _logits()
    s.requires_grad_(True)
    full, _ = jsd_loss(s, t, mask, beta, temperature=0.7)
    g_full, = torch.autograd.grad(full, s)
    values, idx = teacher_topk(t, t.shape[-1])
    topk, _ = jsd_loss(s, values, mask, beta, temperature=0.7, topk_indices=idx)
    g_topk, = torch.autograd.grad(topk, s)
    assert torch.allclose(topk, full, rtol=1e-5, atol=1e-6 * full.abs().item() + 1e-7)
    assert torch.allclose(g_topk, g_full, rtol=1e-4, atol=1e-7)


def test_topk_renormalises_over_the_teachers_kept_tokens():
    # V = 3, K = 2: the teacher keeps tokens 2 and 0 (logits 3 and 1); both renormalise over them
    s = torch.tensor([[[0.0, 5.0, 1.0]]])
    t = torch.tensor([[[1.0, -4.0, 3.0]]])
    values, idx = teacher_topk(t, 2)
    assert idx.tolist() == [[[2, 0]]]
    s_lp, t_lp = topk_logprobs(s, values, idx)
    # student over {2, 0}: softmax(1, 0); teacher: softmax(3, 1)
    assert s_lp.exp()[0, 0].tolist() == pytest.approx([math.e / (math.e + 1), 1 / (math.e + 1)], rel=1e-6)
    assert t_lp.exp()[0, 0].tolist() == pytest.approx([math.e**2 / (math.e**2 + 1), 1 / (math.e**2 + 1)], rel=1e-6)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_masked_positions_change_nothing(beta):
    s, t, mask = _logits(seed=1)
    s1 = s.clone().requires_grad_(True)
    loss1, m1 = jsd_loss(s1, t, mask, beta)
    g1, = torch.autograd.grad(loss1, s1)
    noise = torch.randn(s.shape, generator=torch.Generator().manual_seed(9)) * 50
    s2 = torch.where(mask[..., None], s, s + noise).requires_grad_(True)
    t2 = torch.where(mask[..., None], t, t - noise)
    loss2, m2 = jsd_loss(s2, t2, mask, beta)
    g2, = torch.autograd.grad(loss2, s2)
    assert loss2.item() == loss1.item() and m2["jsd"].item() == m1["jsd"].item()
    assert torch.equal(g2, g1)
    assert g2[~mask].abs().max().item() == 0.0


def test_jsd_loss_is_the_token_mean_and_split_invariant():
    s, t, mask = _logits(seed=2)
    per_token = generalized_jsd(F.log_softmax(s, -1), F.log_softmax(t, -1), 0.5)
    want = (per_token * mask).sum() / mask.sum()
    whole, _ = jsd_loss(s, t, mask, 0.5)
    assert whole.item() == pytest.approx(want.item(), rel=1e-6)
    n = mask.sum()  # the global count: micro-batch losses add up to the whole batch's
    parts = sum(jsd_loss(s[i : i + 1], t[i : i + 1], mask[i : i + 1], 0.5, num_tokens=n)[0] for i in range(3))
    assert parts.item() == pytest.approx(whole.item(), rel=1e-6)


def test_teacher_equal_to_student_gives_exactly_zero():
    s, _, mask = _logits(seed=3)
    for beta in (0.0, 0.5, 1.0):
        loss, _ = jsd_loss(s, s.clone(), mask, beta)
        assert loss.item() == 0.0
    lp = torch.randn(2, 4)
    loss, m = reverse_kl_loss(lp.clone().requires_grad_(True), lp, lp.clone(), torch.ones(2, 4))
    assert loss.item() == 0.0 and m["reverse_kl"].item() == 0.0


def test_reverse_kl_golden_and_gradient():
    # two valid tokens: d = old - teacher = (-1 - (-2), -0.5 - (-0.25)) = (1, -0.25); third masked
    old = torch.tensor([[-1.0, -0.5, -3.0]])
    teacher = torch.tensor([[-2.0, -0.25, -9.0]])
    mask = torch.tensor([[1, 1, 0]])
    logp = old.clone().requires_grad_(True)
    loss, m = reverse_kl_loss(logp, old, teacher, mask)
    assert loss.item() == pytest.approx((1.0 - 0.25) / 2)  # on-policy: ratio 1, the k1 mean
    assert m["reverse_kl"].item() == pytest.approx(0.375) and m["ratio_dev"].item() == 0.0
    g, = torch.autograd.grad(loss, logp)
    assert g[0].tolist() == pytest.approx([1.0 / 2, -0.25 / 2, 0.0])  # d / N on each valid token
    # off-policy by log-ratio 0.1 on token 0: importance-weighted by exp(0.1)
    loss, m = reverse_kl_loss(old + torch.tensor([[0.1, 0.0, 0.0]]), old, teacher, mask, num_tokens=4)
    assert loss.item() == pytest.approx((1.0 * math.exp(0.1) - 0.25) / 4)
    assert m["ratio_dev"].item() == pytest.approx(math.exp(0.1) - 1, rel=1e-6)


def test_reverse_kl_gradient_is_the_exact_reverse_kl_gradient_in_expectation():
    # One position, V = 4: sum over tokens y of p_s(y) * grad(loss | y sampled) is grad KL(p_s || p_t)
    theta = torch.tensor([0.3, -1.0, 0.7, 0.1], dtype=torch.float64, requires_grad=True)
    t_logp = torch.log_softmax(torch.tensor([1.0, 0.0, -0.5, 0.2], dtype=torch.float64), -1)
    s_logp = torch.log_softmax(theta, -1)
    expected = torch.zeros_like(theta)
    for y in range(4):
        loss, _ = reverse_kl_loss(s_logp[y].view(1, 1), s_logp[y].detach().view(1, 1), t_logp[y].view(1, 1),
                                  torch.ones(1, 1))
        g, = torch.autograd.grad(loss, theta, retain_graph=True)
        expected += s_logp[y].exp().detach() * g
    exact, = torch.autograd.grad((s_logp.exp() * (s_logp - t_logp)).sum(), theta)
    assert torch.allclose(expected, exact, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- against TRL's GKD trainer


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_matches_trl_gkd_loss_and_gradient(beta, temperature):
    gkd = pytest.importorskip("trl.experimental.gkd")
    s, t, mask = _logits(B=4, T=6, V=50, seed=4)
    labels = torch.where(mask, torch.zeros(mask.shape, dtype=torch.long), torch.full(mask.shape, -100))
    s1 = s.clone().requires_grad_(True)
    theirs = gkd.GKDTrainer.generalized_jsd_loss(s1, t, labels=labels, beta=beta, temperature=temperature)
    g_theirs, = torch.autograd.grad(theirs, s1)
    s2 = s.clone().requires_grad_(True)
    ours, _ = jsd_loss(s2, t, mask, beta, temperature=temperature)
    g_ours, = torch.autograd.grad(ours, s2)
    scale = theirs.abs().item() + 1e-3  # a scale that cannot be zero
    assert abs(ours.item() - theirs.item()) <= 1e-6 * scale
    assert torch.allclose(g_ours, g_theirs, rtol=1e-5, atol=1e-6 * g_theirs.abs().max().item())
