"""TRPO maths (algos/trpo.py): conjugate gradients, Fisher-vector products, the step scale, the
backtracking line search, and the whole step on a tiny Llama (LoRA and full weights), including
its invariance to micro-batch splitting."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import rlhfkit.algos as algos
from rlhfkit.algos import (
    backtracking_line_search,
    conjugate_gradient,
    fisher_vector_product,
    flat_params,
    line_search_evaluator,
    scale_step,
    set_flat_params_,
    summed_flat_grad,
    surrogate_advantage,
    token_kl,
    trpo_step,
)

from tiny_lm import build_tiny_model


def close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> bool:
    """Equal up to `rel` of the larger norm (a scale that is not zero for the vectors compared)."""
    scale = max(float(a.norm()), float(b.norm()), 1e-12)
    return float((a - b).norm()) <= rel * scale


# ---------------------------------------------------------------- conjugate gradients


def test_cg_first_iteration_by_hand():
    a = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    b = torch.tensor([1.0, 2.0], dtype=torch.float64)
    x, m = conjugate_gradient(lambda v: a @ v, b, iters=1)
    # r0 = p0 = b, r.r = 5; A b = (6, 7), b.Ab = 6 + 14 = 20; alpha = 5 / 20 = 1/4
    assert x.tolist() == [0.25, 0.5]
    # r1 = b - alpha A b = (1 - 1.5, 2 - 1.75) = (-0.5, 0.25): ||r1|| / ||b|| = sqrt(0.3125 / 5) = 1/4
    assert m["trpo/cg_residual"] == pytest.approx(0.25, rel=1e-12)
    assert m["trpo/cg_iterations"] == 1


def test_cg_solves_spd_systems_in_n_iterations():
    # 2 x 2: det = 11, A^-1 = [[3, -1], [-1, 4]] / 11, so x = (3 - 2, -1 + 8) / 11
    a2 = torch.tensor([[4.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    x, m = conjugate_gradient(lambda v: a2 @ v, torch.tensor([1.0, 2.0], dtype=torch.float64), iters=10)
    assert x.tolist() == pytest.approx([1 / 11, 7 / 11], abs=1e-12)
    assert m["trpo/cg_iterations"] == 2 and m["trpo/cg_residual"] < 1e-10
    # 3 x 3 by Cramer's rule: det = 4 (3*2 - 1) - 1 (1*2 - 0) = 18; the numerators are 4, 2, 26
    a3 = torch.tensor([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]], dtype=torch.float64)
    x, m = conjugate_gradient(lambda v: a3 @ v, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), iters=10)
    assert x.tolist() == pytest.approx([4 / 18, 2 / 18, 26 / 18], abs=1e-12)
    assert m["trpo/cg_iterations"] == 3 and m["trpo/cg_residual"] < 1e-10


def test_cg_and_the_step_keep_float32_under_bf16_autocast():
    """`@` of two vectors runs in bf16 under autocast; CG's dot products must not (the trainers
    call trpo_step outside autocast, a user's code may not)."""
    torch.manual_seed(0)
    m = torch.randn(50, 50)
    a = m @ m.t() + 50 * torch.eye(50)
    b = torch.randn(50)
    expected = trpo_step(b, lambda v: a @ v, lambda s: (float(b @ s), 0.0), 0.0, max_kl=0.01)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = trpo_step(b, lambda v: torch.mv(a, v), lambda s: (float(torch.dot(b, s)), 0.0), 0.0, max_kl=0.01)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=0)
    assert got[1]["trpo/cg_residual"] == pytest.approx(expected[1]["trpo/cg_residual"], rel=1e-3)


def test_cg_zero_rhs_and_non_positive_curvature_stop_at_zero():
    calls = []
    x, m = conjugate_gradient(lambda v: calls.append(v) or v, torch.zeros(3), iters=5)
    assert x.tolist() == [0.0, 0.0, 0.0] and m == {"trpo/cg_residual": 0.0, "trpo/cg_iterations": 0.0} and not calls
    x, m = conjugate_gradient(lambda v: -v, torch.ones(3), iters=5)  # negative definite: p.Ap < 0
    assert x.tolist() == [0.0, 0.0, 0.0] and m["trpo/cg_iterations"] == 0 and m["trpo/cg_residual"] == 1.0


# ---------------------------------------------------------------- step scale and line search


def test_scale_step_puts_the_quadratic_kl_on_the_boundary():
    f = torch.diag(torch.tensor([2.0, 8.0], dtype=torch.float64))
    x = torch.tensor([1.0, 1.0], dtype=torch.float64)
    step, m = scale_step(x, f @ x, max_kl=0.05)
    # x.Fx = 2 + 8 = 10: scale = sqrt(2 * 0.05 / 10) = 0.1, and 1/2 s.Fs = 1/2 (0.02 + 0.08) = 0.05
    assert m["trpo/step_scale"] == pytest.approx(0.1, rel=1e-12)
    assert step.tolist() == pytest.approx([0.1, 0.1], rel=1e-12)
    assert 0.5 * float(step @ f @ step) == pytest.approx(0.05, rel=1e-12)
    zero, m = scale_step(torch.zeros(2), torch.zeros(2), 0.05)
    assert zero.tolist() == [0.0, 0.0] and m["trpo/step_scale"] == 0.0


def quadratic_search(kl_coef: float, gain, max_kl: float = 0.25, **kw):
    """Line search on a 1-D problem: at fraction f of the full step, KL = kl_coef f^2, L = 1 + gain(f)."""
    full = torch.tensor([2.0])
    tried = []

    def evaluate(step):
        f = float(step[0]) / 2.0
        tried.append(f)
        return 1.0 + gain(f), kl_coef * f * f

    step, m = backtracking_line_search(evaluate, full, 1.0, max_kl, **kw)
    return step, m, tried


def test_line_search_accepts_the_first_step_inside_the_bound():
    # KL(f) = f^2: f = 1 gives 1 > 0.25; f = 1/2 gives 0.25 <= 0.25 (the bound itself is allowed)
    step, m, tried = quadratic_search(1.0, lambda f: 0.5 * f)
    assert tried == [1.0, 0.5] and step.tolist() == [1.0]
    assert m["trpo/step_accepted"] == 1 and m["trpo/line_search_steps"] == 2 and m["trpo/step_fraction"] == 0.5
    assert m["trpo/kl_after_step"] == 0.25 and m["trpo/surrogate_improvement"] == 0.25


def test_line_search_rejects_steps_that_break_the_bound():
    # KL(f) = 25 f^2 for f = 1, 1/2, 1/4: 25, 6.25, 1.5625, all > 0.25 -> no step, logged
    step, m, tried = quadratic_search(25.0, lambda f: 0.5 * f, max_backtracks=3)
    assert tried == [1.0, 0.5, 0.25] and step.tolist() == [0.0]
    assert m["trpo/step_accepted"] == 0 and m["trpo/line_search_steps"] == 3 and m["trpo/step_fraction"] == 0
    assert m["trpo/kl_after_step"] == 0 and m["trpo/surrogate_improvement"] == 0
    assert m["trpo/kl_last_tried"] == 1.5625


def test_line_search_rejects_no_improvement_and_non_finite_values():
    step, m, _ = quadratic_search(0.0, lambda f: -f, max_backtracks=4)  # inside the bound, but L falls
    assert step.tolist() == [0.0] and m["trpo/step_accepted"] == 0 and m["trpo/line_search_steps"] == 4
    step, m, _ = quadratic_search(0.0, lambda f: 0.0)  # L unchanged is not an improvement
    assert m["trpo/step_accepted"] == 0
    step, m, tried = quadratic_search(0.0, lambda f: math.nan if f == 1 else f)
    assert tried == [1.0, 0.5] and m["trpo/step_fraction"] == 0.5


def test_line_search_accept_ratio_and_zero_direction():
    # gain 0.75 f - 0.5 f^2 against 0.5 x f x expected (1.0): f = 1: 0.25 < 0.5; f = 1/2: 0.25 >= 0.25
    step, m, tried = quadratic_search(0.0, lambda f: 0.75 * f - 0.5 * f * f, expected_improvement=1.0,
                                      accept_ratio=0.5)
    assert tried == [1.0, 0.5] and m["trpo/step_fraction"] == 0.5

    def never(step):
        raise AssertionError("a zero direction needs no evaluation")

    step, m = backtracking_line_search(never, torch.zeros(3), 0.0, 0.01)
    assert step.tolist() == [0.0, 0.0, 0.0] and m["trpo/line_search_steps"] == 0


# ---------------------------------------------------------------- Fisher-vector products


class TinyPolicy(torch.nn.Module):
    """logits = W tanh(E[token]) + c over V = 4 tokens: 5 x 3 + 4 x 3 + 4 = 31 parameters."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(5, 3)
        self.out = torch.nn.Linear(3, 4)

    def forward(self, tokens):  # (B, T) -> (B, T, V)
        return self.out(torch.tanh(self.emb(tokens)))


def explicit_fisher(logits_fn, params, mask, temperature):
    """F = (1/N) sum_{valid t} sum_y p_t(y) grad log p_t(y) grad log p_t(y)^T: the textbook Fisher of
    the token distributions as a P x P matrix, from the Jacobian of every (token, vocabulary entry)
    log-prob (one batched backward: row j of the identity selects log-prob j)."""
    logp = torch.log_softmax(logits_fn() / temperature, dim=-1)[mask.bool()].reshape(-1)  # (N * V,)
    eye = torch.eye(logp.numel(), dtype=logp.dtype)
    grads = torch.autograd.grad(logp, params, grad_outputs=eye, is_grads_batched=True)
    jac = torch.cat([g.reshape(logp.numel(), -1) for g in grads], dim=1)  # (N * V, P)
    return (jac.T * logp.exp().detach()) @ jac / int(mask.sum())


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_fvp_equals_explicit_fisher_on_a_tiny_module(temperature):
    policy = TinyPolicy().double()
    params = list(policy.parameters())
    tokens = torch.tensor([[0, 1, 2], [3, 4, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    old = policy(tokens).detach()
    fisher = explicit_fisher(lambda: policy(tokens), params, mask, temperature)
    v = torch.randn(31, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    term = lambda: token_kl(old, policy(tokens), mask, temperature)[0]  # noqa: E731
    assert close(fisher_vector_product([term], params, damping=0.0)(v), fisher @ v, 1e-10)
    assert close(fisher_vector_product([term], params, damping=0.3)(v), fisher @ v + 0.3 * v, 1e-10)
    assert close(fisher_vector_product([term], params, 0.0, cache_graph=False)(v), fisher @ v, 1e-10)


def response_logits(model, ids, prompt_len):
    """Logits (B, R, V) that predict the response tokens ids[:, P:] (positions P - 1 .. P + R - 2)."""
    return model(input_ids=ids).logits[:, prompt_len - 1 : -1]


def test_fvp_equals_explicit_fisher_on_a_tiny_llama_with_lora():
    from rlhfkit.models.lora import add_lora

    model = add_lora(build_tiny_model(16, layers=1).eval(), r=2, alpha=4, dropout=0.0, targets=None).eval()
    params = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        for p in params:
            p.normal_(0, 0.3)  # adapters away from B = 0, so every LoRA matrix has a gradient
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 2], [7, 3, 4, 11, 2, 2, 2]])  # 3 prompt + 4 response tokens
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    old = response_logits(model, ids, 3).detach()
    fisher = explicit_fisher(lambda: response_logits(model, ids, 3), params, mask, 1.0)
    v = torch.randn(fisher.shape[0], generator=torch.Generator().manual_seed(2))
    fvp = fisher_vector_product([lambda: token_kl(old, response_logits(model, ids, 3), mask)[0]], params, 0.0)
    assert close(fvp(v), fisher @ v, 1e-4)


# ---------------------------------------------------------------- the whole step on a tiny Llama


def tiny_rollout(lora: bool):
    """A tiny Llama in float64 (vocab 16, 1 layer; LoRA r=2 or all weights) and a 4-row rollout: 3 prompt
    tokens, up to 5 response tokens (lengths 5, 2, 4, 1), advantages, pi_old's logits and log-probs.
    float64 keeps CG's amplification of rounding errors far below the tolerances of the comparisons."""
    model = build_tiny_model(16, layers=1).eval()
    if lora:
        from rlhfkit.models.lora import add_lora

        model = add_lora(model, r=2, alpha=4, dropout=0.0, targets=None).eval()
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.normal_(0, 0.3)
    model = model.double()
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 16, (4, 8), generator=gen)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 0, 0, 0, 0]])
    adv = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        old_logits = response_logits(model, ids, 3)
        old_logp = torch.log_softmax(old_logits, -1).gather(-1, ids[:, 3:, None]).squeeze(-1)
    params = [p for p in model.parameters() if p.requires_grad]
    return model, params, dict(ids=ids, mask=mask, adv=adv, old_logits=old_logits, old_logp=old_logp)


def micro_terms(model, r, rows, n_tokens):
    """(surrogate, KL, both) term callables of one micro-batch, divided by the batch's n_tokens."""

    def forward():
        logits = response_logits(model, r["ids"][rows], 3)
        logp = torch.log_softmax(logits, -1).gather(-1, r["ids"][rows, 3:, None]).squeeze(-1)
        surr = surrogate_advantage(logp, r["old_logp"][rows], r["adv"][rows], r["mask"][rows], n_tokens)[0]
        kl = token_kl(r["old_logits"][rows], logits, r["mask"][rows], 1.0, n_tokens)[0]
        return surr, kl

    return (lambda: forward()[0]), (lambda: forward()[1]), forward


def trpo_update(model, params, r, split, max_kl=0.01, damping=0.01, global_norm=True):
    """grad, an FVP probe, and trpo_step's result with the rollout cut into micro-batches `split`."""
    starts = [sum(split[:i]) for i in range(len(split))]
    batches = [torch.arange(s, s + n) for s, n in zip(starts, split)]
    terms = [micro_terms(model, r, rows, r["mask"].sum() if global_norm else None) for rows in batches]
    grad, surrogate = summed_flat_grad([t[0] for t in terms], params)
    fvp = fisher_vector_product([t[1] for t in terms], params, damping)
    probe = fvp(torch.ones_like(grad))
    evaluate = line_search_evaluator(params, [t[2] for t in terms])
    step, metrics = trpo_step(grad, fvp, evaluate, surrogate, max_kl=max_kl, cg_iters=10)
    return grad, probe, step, metrics


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_accepted_step_keeps_the_measured_kl_within_the_bound(lora):
    model, params, r = tiny_rollout(lora)
    theta_old = flat_params(params)
    grad, _, step, m = trpo_update(model, params, r, [4], max_kl=0.01)
    assert flat_params(params).equal(theta_old)  # the line search restored theta_old
    assert m["trpo/step_accepted"] == 1 and float(step.norm()) > 0
    assert set(m) >= {"trpo/kl_after_step", "trpo/line_search_steps", "trpo/cg_residual",
                      "trpo/surrogate_improvement"}
    assert float(grad @ step) > 0  # an ascent direction of the surrogate
    set_flat_params_(params, theta_old + step)  # apply it, then measure on the rollout from scratch
    with torch.no_grad():
        surr, kl = micro_terms(model, r, torch.arange(4), r["mask"].sum())[2]()
    assert float(kl) <= 0.01
    assert float(kl) == pytest.approx(m["trpo/kl_after_step"], rel=1e-9)
    assert float(surr) - float((r["adv"] * r["mask"]).sum() / r["mask"].sum()) == pytest.approx(
        m["trpo/surrogate_improvement"], rel=1e-9)


def test_full_step_kl_matches_the_quadratic_model():
    # For a small delta and little damping, the measured KL of the full step s = sqrt(2 delta / x.Fx) x
    # is close to its quadratic model 1/2 s.Fs = delta; sqrt(delta / x.Fx) would give about delta / 2.
    model, params, r = tiny_rollout(lora=True)
    kl_term, both = micro_terms(model, r, torch.arange(4), r["mask"].sum())[1:]
    grad, _ = summed_flat_grad([micro_terms(model, r, torch.arange(4), r["mask"].sum())[0]], params)
    fvp = fisher_vector_product([kl_term], params, damping=1e-6)
    x, _ = conjugate_gradient(fvp, grad, iters=10)
    full, _ = scale_step(x, fvp(x), max_kl=1e-4)
    _, kl = line_search_evaluator(params, [both])(full)
    assert 0.8e-4 <= kl <= 1.2e-4


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_step_is_invariant_to_micro_batch_splitting(lora):
    model, params, r = tiny_rollout(lora)
    ref = trpo_update(model, params, r, [4])
    for split in ([1, 3], [2, 2], [1, 1, 1, 1]):
        got = trpo_update(model, params, r, split)
        assert close(got[0], ref[0], 1e-9) and close(got[1], ref[1], 1e-9), split  # gradient, F v
        # The accepted step comes out of 10 CG iterations on an ill-conditioned damped Fisher (residual
        # still ~0.13): CG amplifies F v's last-bit differences (1e-16 here) step by step; seen 1.3e-5 with
        # LoRA on an Intel AVX-512 FP16 CPU, 1e-13 on an AMD one. A wrong split differs by far more (below).
        assert close(got[2], ref[2], 1e-4), split
        assert got[3]["trpo/line_search_steps"] == ref[3]["trpo/line_search_steps"]
    # Normalising each micro-batch by its own tokens (lengths 5, 2 | 4, 1) changes the gradient.
    per_micro = trpo_update(model, params, r, [2, 2], global_norm=False)
    assert not close(per_micro[0], ref[0], 1e-2)


def test_surrogate_and_kl_golden():
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    old = torch.log(torch.tensor([[0.25, 0.25, 0.1]]))
    adv = torch.tensor([[1.0, -1.0, 100.0]])
    mask = torch.tensor([[1, 1, 0]])
    value, m = surrogate_advantage(logp, old, adv, mask)
    # ratios 2 and 1 on the valid tokens: (2 * 1 + 1 * -1) / 2 = 0.5; the padded token (ratio 9) is ignored
    assert float(value) == pytest.approx(0.5, rel=1e-6) and m["trpo/ratio_mean"] == pytest.approx(1.5)
    assert float(surrogate_advantage(logp, old, adv, mask, num_tokens=4)[0]) == pytest.approx(0.25, rel=1e-6)
    # KL((1/2, 1/2) || (1/4, 3/4)) = 1/2 log 2 + 1/2 log(2/3), on one of two tokens; the other has KL 0
    old_logits = torch.log(torch.tensor([[[0.5, 0.5], [0.3, 0.7]]]))
    logits = torch.log(torch.tensor([[[0.25, 0.75], [0.3, 0.7]]]))
    kl, m = token_kl(old_logits, logits, torch.tensor([[1, 1]]))
    expected = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    assert float(kl) == pytest.approx(expected / 2, rel=1e-5) and m["trpo/kl_max"] == pytest.approx(expected, rel=1e-5)
    assert float(token_kl(old_logits, logits, torch.tensor([[1, 1]]), num_tokens=8)[0]) == pytest.approx(
        expected / 8, rel=1e-5)


SIGNATURES = {
    "surrogate_advantage": ["logp", "old_logp", "advantages", "mask", "num_tokens"],
    "token_kl": ["old_logits", "logits", "mask", "temperature", "num_tokens"],
    "fisher_vector_product": ["kl_terms", "params", "damping", "cache_graph"],
    "conjugate_gradient": ["fvp", "b", "iters", "tol"],
    "scale_step": ["x", "fx", "max_kl"],
    "backtracking_line_search": ["evaluate", "full_step", "surrogate_before", "max_kl", "expected_improvement",
                                 "backtrack_coef", "max_backtracks", "accept_ratio"],
    "trpo_step": ["grad", "fvp", "evaluate", "surrogate_before", "max_kl", "cg_iters", "cg_tol"],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_trpo_api_is_exported_with_stable_signatures(name):
    fn = getattr(algos, name)
    assert name in algos.__all__ and fn.__doc__ and len(fn.__doc__) > 40
    assert list(inspect.signature(fn).parameters)[: len(SIGNATURES[name])] == SIGNATURES[name]


# ---------------------------------------------------------------- Gauss-Newton FVP and the Fisher subsample


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_gauss_newton_fvp_equals_explicit_fisher_on_a_tiny_module(temperature):
    from rlhfkit.algos.trpo import gauss_newton_fvp

    policy = TinyPolicy().double()
    params = list(policy.parameters())
    tokens = torch.tensor([[0, 1, 2], [3, 4, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    fisher = explicit_fisher(lambda: policy(tokens), params, mask, temperature)
    v = torch.randn(31, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    term = lambda: (policy(tokens) / temperature, mask.double() / mask.sum())  # noqa: E731
    assert close(gauss_newton_fvp([term], params, damping=0.0)(v), fisher @ v, 1e-10)
    assert close(gauss_newton_fvp([term], params, damping=0.3)(v), fisher @ v + 0.3 * v, 1e-10)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_gauss_newton_fvp_equals_the_double_backward_fvp_on_a_tiny_llama(lora):
    from rlhfkit.algos.trpo import gauss_newton_fvp

    model, params, r = tiny_rollout(lora)
    n = r["mask"].sum()
    v = torch.randn(sum(p.numel() for p in params), dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    kl_terms = [micro_terms(model, r, rows, n)[1] for rows in (torch.arange(0, 1), torch.arange(1, 4))]
    logit_terms = [lambda rows=rows: (response_logits(model, r["ids"][rows], 3), r["mask"][rows].double() / n)
                   for rows in (torch.arange(0, 3), torch.arange(3, 4))]  # another split: sums over micro-batches
    db, gn = fisher_vector_product(kl_terms, params, 0.01), gauss_newton_fvp(logit_terms, params, 0.01)
    for _ in range(2):  # the cached graphs serve every product
        assert close(gn(v), db(v), 1e-9)


def test_fisher_rows_draws_a_seeded_sorted_subsample():
    from rlhfkit.algos.trpo import fisher_rows

    g = torch.Generator().manual_seed(7)
    state = g.get_state()
    assert fisher_rows(5, 1.0, g).tolist() == [0, 1, 2, 3, 4] and g.get_state().equal(state)  # no draw
    a = fisher_rows(16, 0.25, torch.Generator().manual_seed(7))
    assert a.equal(fisher_rows(16, 0.25, torch.Generator().manual_seed(7)))  # same seed, same rows
    assert len(a) == 4 and a.tolist() == sorted(set(a.tolist())) and 0 <= int(a.min()) and int(a.max()) < 16
    assert len(fisher_rows(10, 0.3, g)) == 3  # ceil(0.3 x 10) = 3, not 4 (0.3 x 10 = 3.0000000000000004)
    assert len(fisher_rows(3, 0.01, g)) == 1  # at least one row
    draws = {tuple(fisher_rows(16, 0.25, torch.Generator().manual_seed(s)).tolist()) for s in range(5)}
    assert len(draws) > 1  # the seed matters
    with pytest.raises(ValueError, match="fraction"):
        fisher_rows(4, 0.0, g)
