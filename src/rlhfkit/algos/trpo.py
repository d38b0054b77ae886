"""Trust Region Policy Optimization maths (Schulman et al. 2015) for a causal LM's response tokens.

Notation: B batch, T response length, V vocab, P trainable parameters as one flat vector (the
LoRA adapters, or every weight under full fine-tuning), N valid response tokens of the batch.

The problem (paper eq. 14): maximise the importance-weighted surrogate advantage

    L(theta)  = (1/N) sum_{i,t} m_it rho_it A_it,   rho_it = pi_theta(y_it | s_it) / pi_old(y_it | s_it)

subject to the mean token KL of the full next-token distributions

    KL(theta) = (1/N) sum_{i,t} m_it KL(pi_old(. | s_it) || pi_theta(. | s_it)) <= delta  (max_kl).

One update (paper section 6 and Appendix C):
  1. g = grad L(theta_old)                                         `surrogate_advantage`, `summed_flat_grad`
  2. x ~= (F + lambda I)^-1 g by conjugate gradients; F, the Hessian of KL at theta_old, is the
     Fisher information of the token distributions, used only through products F v
     (double backward, or the Gauss-Newton form J^T (diag p - p p^T) J v; no explicit matrix),
     optionally estimated on a subsample of the rollout's sequences    `conjugate_gradient`,
                                                  `fisher_vector_product`, `gauss_newton_fvp`, `fisher_rows`
  3. s = sqrt(2 delta / x^T (F + lambda I) x) x: the step whose quadratic KL model
     1/2 s^T (F + lambda I) s equals delta                         `scale_step`
  4. theta_old + b^k s for k = 0, 1, ...: the first that raises L and keeps the measured KL
     <= delta is accepted; none of them -> no step                 `backtracking_line_search`
`trpo_step` runs 2-4.

Micro-batches: every sum above is a sum over micro-batches when each micro-batch's surrogate
and KL are divided by the global N (``num_tokens``), as `aggregate_loss` does for every loss:
gradient, Fisher-vector products and so the step do not depend on the split.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .losses import aggregate_loss
from .masks import masked_mean

__all__ = [
    "flat_grad",
    "flat_params",
    "set_flat_params_",
    "summed_flat_grad",
    "surrogate_advantage",
    "token_kl",
    "fisher_vector_product",
    "gauss_newton_fvp",
    "fisher_rows",
    "conjugate_gradient",
    "scale_step",
    "backtracking_line_search",
    "line_search_evaluator",
    "trpo_step",
]

Term = Callable[[], torch.Tensor]  # one micro-batch's share of a batch quantity (a scalar with graph)
# one micro-batch's tempered logits z (B, T, V) with graph, and each token's weight in the mean (B, T): mask / N
LogitTerm = Callable[[], tuple[torch.Tensor, torch.Tensor]]
Evaluate = Callable[[torch.Tensor], tuple[float, float]]  # step (P,) -> (surrogate, KL) at theta_old + step


# ----------------------------------------------------------------------------- flat parameter vectors


def flat_grad(output: torch.Tensor, params: Sequence[torch.Tensor], create_graph: bool = False,
              retain_graph: bool | None = None, grad_outputs: torch.Tensor | None = None) -> torch.Tensor:
    """d output / d params as one flat vector (P,); zeros for parameters ``output`` does not use.
    With ``grad_outputs`` u (shaped like a non-scalar ``output``): the vector-Jacobian product u^T J."""
    grads = torch.autograd.grad(output, list(params), grad_outputs=grad_outputs, create_graph=create_graph,
                                retain_graph=retain_graph, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


def flat_params(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The parameters as one detached flat vector (P,) (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in params]).clone()


@torch.no_grad()
def set_flat_params_(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy the flat vector (P,) into the parameters, in order (in place)."""
    i = 0
    for p in params:
        p.copy_(flat[i : i + p.numel()].view_as(p))
        i += p.numel()
    if i != flat.numel():
        raise ValueError(f"flat vector has {flat.numel()} values for {i} parameters")


def summed_flat_grad(terms: Sequence[Term], params: Sequence[torch.Tensor]) -> tuple[torch.Tensor, float]:
    """(sum of the flat gradients (P,), sum of the values) of micro-batch terms, one backward each.

    Each term is one micro-batch's share of the batch quantity (normalised by the global N), so
    the sums are the batch's gradient and value. Each graph is freed after its backward.
    """
    total, value = None, 0.0
    for term in terms:
        out = term()
        g = flat_grad(out, params)
        total = g if total is None else total + g
        value += float(out.detach())
    if total is None:
        raise ValueError("no micro-batch terms given")
    return total, value


# ----------------------------------------------------------------------------- objective and constraint


def surrogate_advantage(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                        num_tokens: float | torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The surrogate advantage L (paper eq. 14), to MAXIMISE: sum m * exp(logp - old_logp) * A / N.

    logp (with grad), old_logp, advantages, mask: (B, T). N = ``num_tokens`` (pass the whole
    batch's valid-token count when summing micro-batches), else mask.sum(). At theta = theta_old
    the value is the mean advantage and the gradient sum m A grad(logp) / N, the policy gradient.
    Metrics: ``trpo/ratio_mean`` over this call's valid tokens.
    """
    m = mask if mask.dtype == torch.bool else mask != 0
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    # Padding may hold garbage log-probs: select (not multiply) so exp cannot overflow there.
    ratio = torch.exp(torch.where(m, logp - old_logp, zero))
    adv = torch.where(m, advantages.to(logp.dtype), zero)
    value = aggregate_loss(ratio * adv, m, "token-mean", num_tokens)
    with torch.no_grad():
        metrics = {"trpo/ratio_mean": float(masked_mean(ratio, m)) if m.any() else 1.0}
    return value, metrics


def token_kl(old_logits: torch.Tensor, logits: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0,
             num_tokens: float | torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean KL(pi_old || pi) of the full next-token distributions over valid response tokens.

        KL_t = sum_v p_old(v) (log p_old(v) - log p(v)),  p = softmax(logits / T)   (exact, not sampled)

    old_logits (B, T, V) are a constant (detached); logits (B, T, V) carry the graph; mask (B, T).
    Divided by ``num_tokens`` (the batch's valid tokens) when given, else by mask.sum(). Computed
    in fp32 at least. With logits = old_logits the value is 0 and its Hessian in the parameters is the
    Fisher information that `fisher_vector_product` multiplies by. Metrics: ``trpo/kl_max``, the
    largest token KL of this call.
    """
    dtype = torch.promote_types(logits.dtype, torch.float32)  # bf16/fp16 logits -> fp32; fp64 stays
    old_logp = torch.log_softmax(old_logits.detach().to(dtype) / temperature, dim=-1)
    logp = torch.log_softmax(logits.to(dtype) / temperature, dim=-1)
    per_token = (old_logp.exp() * (old_logp - logp)).sum(-1)  # (B, T)
    m = mask if mask.dtype == torch.bool else mask != 0
    value = aggregate_loss(per_token, m, "token-mean", num_tokens)
    with torch.no_grad():
        kl_max = float(torch.where(m, per_token, torch.zeros_like(per_token)).max()) if m.any() else 0.0
    return value, {"trpo/kl_max": kl_max}


# ----------------------------------------------------------------------------- natural-gradient direction


def fisher_vector_product(kl_terms: Sequence[Term], params: Sequence[torch.Tensor], damping: float = 0.1,
                          cache_graph: bool = True) -> Callable[[torch.Tensor], torch.Tensor]:
    """A function v (P,) -> (F + damping I) v (P,), F the Hessian of sum(kl_terms) at theta_old.

    Each term returns one micro-batch's share of the mean token KL (`token_kl` with the global
    ``num_tokens``), with pi_old the current parameters: then the Hessian is exactly the Fisher
    information of the token distributions (the KL's first derivative, and with it the term in the
    second derivatives of the logits, vanishes at theta_old). Pearlmutter's trick, per micro-batch:
    H v = grad((grad KL) . v), a double backward; no P x P matrix is formed. The terms run under
    the math attention kernel (the fused ones cannot be differentiated twice).

    ``cache_graph=True`` runs each term's forward and first backward once and keeps their graphs
    for every product (memory: the activations of all micro-batches); False recomputes them for
    each product (memory: one micro-batch; CG's iterations cost a forward each). ``damping``
    (lambda) keeps the system well conditioned where F is near singular (paper Appendix C).
    """
    params = list(params)

    def kl_grad(term: Term) -> torch.Tensor:  # (P,), with its graph for the second backward
        # Fused attention kernels (flash, memory-efficient, CPU flash) have no double backward; the
        # math kernel computes the same attention from plain matmuls and softmax, twice differentiable.
        with sdpa_kernel([SDPBackend.MATH]):
            return flat_grad(term(), params, create_graph=True)

    cached = [kl_grad(t) for t in kl_terms] if cache_graph else None

    def fvp(v: torch.Tensor) -> torch.Tensor:
        out = damping * v
        for i, term in enumerate(kl_terms):
            g = cached[i] if cached is not None else kl_grad(term)
            out = out + flat_grad((g * v).sum(), params, retain_graph=cached is not None)
        return out

    return fvp


def gauss_newton_fvp(logit_terms: Sequence[LogitTerm], params: Sequence[torch.Tensor], damping: float = 0.1,
                     ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The same v (P,) -> (F + damping I) v as `fisher_vector_product`, from the Fisher's closed form.

    With z_t = logits / T of token t (V,), p_t = softmax(z_t) and J_t = dz_t / dtheta (V x P),

        F v = sum_t w_t J_t^T (diag(p_t) - p_t p_t^T) J_t v,     w_t = m_t / N

    (the Hessian of the token KL at theta_old, where the KL's gradient in z, and with it every
    second derivative of the network, drops out). Per micro-batch the forward runs once, keeping
    z's graph and, for J v, the graph of one vector-Jacobian product J^T u with a placeholder u
    (linear in u, so d(J^T u . v)/du = J v); each product is then one pass back to u and one
    ordinary backward, instead of differentiating the KL twice. Memory: both graphs of every
    micro-batch. Each term returns (z (B, T, V) with graph, weights w (B, T)); fused attention has
    no double backward, so the forward runs under the math kernel.
    """
    params = list(params)
    parts = []
    for term in logit_terms:
        with sdpa_kernel([SDPBackend.MATH]):
            z, w = term()
        p = torch.softmax(z.detach(), dim=-1)
        u = torch.zeros_like(z, requires_grad=True)
        jtu = flat_grad(z, params, create_graph=True, grad_outputs=u)  # (P,), linear in u
        parts.append((z, w.to(z.dtype).unsqueeze(-1), p, u, jtu))

    def fvp(v: torch.Tensor) -> torch.Tensor:
        out = damping * v
        for z, w, p, u, jtu in parts:
            jv = torch.autograd.grad(jtu, u, grad_outputs=v, retain_graph=True)[0]  # J v: (B, T, V)
            h = w * p * (jv - (p * jv).sum(-1, keepdim=True))  # w (diag p - p p^T) J v
            out = out + flat_grad(z, params, retain_graph=True, grad_outputs=h)
        return out

    return fvp


def fisher_rows(batch_size: int, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """The rows (sorted, int64) of a batch that estimate the Fisher: ceil(fraction x B) of them drawn
    without replacement, all of them (and no draw) for fraction >= 1.

    F is an expectation over the rollout's states; a subsample estimates it unbiasedly, while the
    gradient and the line search (which enforces the KL bound) still see the whole batch.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if fraction >= 1:
        return torch.arange(batch_size, device=generator.device)
    k = max(1, math.ceil(fraction * batch_size - 1e-9))  # 0.3 x 10 is 3.0000000000000004
    return torch.randperm(batch_size, generator=generator, device=generator.device)[:k].sort().values


def conjugate_gradient(fvp: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, iters: int = 10,
                       tol: float = 1e-10) -> tuple[torch.Tensor, dict[str, float]]:
    """x with A x ~= b for a symmetric positive definite A known only through v -> A v (Hestenes-Stiefel 1952).

    b: (P,). At most ``iters`` products A p; stops early once ||r|| <= tol ||b|| (r = b - A x,
    updated recursively). Exact after P iterations in exact arithmetic; TRPO uses ~10 and relies
    on the line search. A direction with p^T A p <= 0 (not positive definite, or NaN) stops with
    the current x. Metrics: ``trpo/cg_residual`` = ||r|| / ||b|| (0 when b = 0),
    ``trpo/cg_iterations``.
    """
    x = torch.zeros_like(b)
    r, p = b.clone(), b.clone()  # dot products by torch.dot: under autocast `@` would round them to bf16
    rr = float(torch.dot(r, r))
    b_norm = math.sqrt(rr)
    done = 0
    for _ in range(iters):
        if math.sqrt(rr) <= tol * b_norm:  # also b = 0
            break
        ap = fvp(p)
        p_ap = float(torch.dot(p, ap))
        if not p_ap > 0:
            break
        alpha = rr / p_ap
        x = x + alpha * p
        r = r - alpha * ap
        rr_new = float(torch.dot(r, r))
        p = r + (rr_new / rr) * p
        rr = rr_new
        done += 1
    residual = math.sqrt(rr) / b_norm if b_norm > 0 else 0.0
    return x, {"trpo/cg_residual": residual, "trpo/cg_iterations": float(done)}


def scale_step(x: torch.Tensor, fx: torch.Tensor, max_kl: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Full step s = sqrt(2 delta / x^T F x) x along the CG direction x (paper Appendix C).

    x, fx = F x (the damped product): (P,). Then 1/2 s^T F s = delta: the quadratic model of the
    KL sits exactly on the trust-region boundary. A zero, negative or non-finite x^T F x gives a
    zero step. Metrics: ``trpo/step_scale`` (the factor), ``trpo/step_norm`` (||s||).
    """
    xfx = float(torch.dot(x, fx))
    if not (xfx > 0 and math.isfinite(xfx)):
        return torch.zeros_like(x), {"trpo/step_scale": 0.0, "trpo/step_norm": 0.0}
    scale = math.sqrt(2.0 * max_kl / xfx)
    step = scale * x
    return step, {"trpo/step_scale": scale, "trpo/step_norm": float(step.norm())}


# ----------------------------------------------------------------------------- line search and the update


def backtracking_line_search(evaluate: Evaluate, full_step: torch.Tensor, surrogate_before: float, max_kl: float,
                             expected_improvement: float | None = None, backtrack_coef: float = 0.5,
                             max_backtracks: int = 10, accept_ratio: float = 0.0,
                             ) -> tuple[torch.Tensor, dict[str, float]]:
    """The first of s, b s, b^2 s, ... (``max_backtracks`` candidates, b = ``backtrack_coef``) that
    improves the surrogate and satisfies the KL bound; a zero step when none does.

    ``evaluate(step)`` returns (surrogate L, mean KL) at theta_old + step as floats, measured on
    the rollout (one forward pass serves both), and leaves the parameters as they were. A
    candidate is accepted when KL <= max_kl, L - surrogate_before > 0 and, with
    ``expected_improvement`` (g . s) and ``accept_ratio`` > 0, the improvement is at least
    accept_ratio x the first-order prediction (f g . s for fraction f); non-finite values reject.
    Metrics: ``trpo/step_accepted`` (1/0), ``trpo/line_search_steps`` (candidates evaluated),
    ``trpo/step_fraction`` (f, 0 for no step), ``trpo/kl_after_step`` and
    ``trpo/surrogate_improvement`` (of the accepted step; 0 for no step), ``trpo/kl_last_tried``.
    """
    metrics = {"trpo/step_accepted": 0.0, "trpo/line_search_steps": 0.0, "trpo/step_fraction": 0.0,
               "trpo/kl_after_step": 0.0, "trpo/surrogate_improvement": 0.0, "trpo/kl_last_tried": 0.0}
    if not bool(full_step.any()):  # no direction (zero gradient): nothing to search
        return torch.zeros_like(full_step), metrics
    for k in range(max_backtracks):
        frac = backtrack_coef**k
        step = frac * full_step
        surrogate, kl = evaluate(step)
        improvement = surrogate - surrogate_before
        metrics["trpo/line_search_steps"], metrics["trpo/kl_last_tried"] = float(k + 1), float(kl)
        wanted = 0.0 if expected_improvement is None else accept_ratio * frac * expected_improvement
        if math.isfinite(surrogate) and math.isfinite(kl) and kl <= max_kl and improvement > 0 \
                and improvement >= wanted:
            metrics.update({"trpo/step_accepted": 1.0, "trpo/step_fraction": frac, "trpo/kl_after_step": float(kl),
                            "trpo/surrogate_improvement": float(improvement)})
            return step, metrics
    return torch.zeros_like(full_step), metrics


def line_search_evaluator(params: Sequence[torch.Tensor], terms: Sequence[Callable[[], tuple[torch.Tensor, torch.Tensor]]],
                          ) -> Evaluate:
    """``evaluate`` for `backtracking_line_search`: sets theta_old + step, sums the micro-batch
    terms' (surrogate share, KL share) without gradients, and restores theta_old.

    theta_old is read now, so build it before the search. Each term returns its micro-batch's
    (surrogate, KL) divided by the global N, like the terms of the gradient and the FVP.
    """
    params = list(params)
    theta_old = flat_params(params)

    def evaluate(step: torch.Tensor) -> tuple[float, float]:
        set_flat_params_(params, theta_old + step)
        try:
            with torch.no_grad():
                pairs = [term() for term in terms]
        finally:
            set_flat_params_(params, theta_old)
        return sum(float(s) for s, _ in pairs), sum(float(k) for _, k in pairs)

    return evaluate


def trpo_step(grad: torch.Tensor, fvp: Callable[[torch.Tensor], torch.Tensor], evaluate: Evaluate,
              surrogate_before: float, max_kl: float = 0.01, cg_iters: int = 10, cg_tol: float = 1e-10,
              backtrack_coef: float = 0.5, max_backtracks: int = 10, accept_ratio: float = 0.0,
              ) -> tuple[torch.Tensor, dict[str, float]]:
    """Steps 2-4 of one TRPO update: CG direction, scaled full step, backtracking line search.

    grad: g = grad L(theta_old) (P,); fvp: v -> (F + lambda I) v; evaluate: see
    `backtracking_line_search`. Returns the accepted parameter change (P,) (zeros when the line
    search rejects every candidate; apply it with ``set_flat_params_(params, theta_old + step)``)
    and the metrics of `conjugate_gradient`, `scale_step` and `backtracking_line_search`, plus
    ``trpo/expected_improvement`` (g . s, the first-order gain of the full step).
    """
    x, metrics = conjugate_gradient(fvp, grad, cg_iters, cg_tol)
    full_step, scale_metrics = scale_step(x, fvp(x), max_kl)
    expected = float(torch.dot(grad, full_step))
    step, search_metrics = backtracking_line_search(evaluate, full_step, surrogate_before, max_kl, expected,
                                                    backtrack_coef, max_backtracks, accept_ratio)
    return step, {**metrics, **scale_metrics, "trpo/expected_improvement": expected, **search_metrics}
