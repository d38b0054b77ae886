"""Preference losses beside DPO (``losses.dpo_loss``): SimPO and ORPO (reference-free, on
length-normalised log-probs) and KTO (unpaired desirable / undesirable completions).

Notation: B pairs or examples; log pi(y) the summed log-probs of a response's tokens, |y| its
token count, avg(y) = log pi(y) / |y|; sigma the logistic function. Every loss returns
``(losses (B,), metrics)``: reduce with a sum divided by the optimiser batch's global size, so
micro-batch losses add up to its mean. Metric names follow ``dpo_loss`` (``rewards/*``,
``logps/*`` with summed log-probs) so that logs and diagnostics read the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["simpo_loss", "orpo_loss", "kto_loss", "kto_reference_point", "log1mexp"]


def _pair_metrics(r_c: torch.Tensor, r_r: torch.Tensor, lp_c: torch.Tensor, lp_r: torch.Tensor) -> dict[str, float]:
    return {
        "rewards/chosen": r_c.mean().item(),
        "rewards/rejected": r_r.mean().item(),
        "rewards/accuracy": (r_c > r_r).float().mean().item(),
        "rewards/margin": (r_c - r_r).mean().item(),
        "logps/chosen": lp_c.mean().item(),
        "logps/rejected": lp_r.mean().item(),
    }


def simpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    beta: float = 2.0,
    gamma: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SimPO, Meng et al. 2024 ("SimPO: Simple Preference Optimization with a Reference-Free
    Reward"), eq. 6:

        loss = -log sigma(beta avg(y_w) - beta avg(y_l) - gamma)

    The implicit reward beta * avg(y) needs no reference model and is length-normalised; gamma > 0
    is the target reward margin. chosen_logps, rejected_logps: (B,) summed log-probs (with grad);
    *_lengths: (B,) token counts. Metrics: ``rewards/*`` of beta * avg(y), ``logps/*`` of the sums.
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    r_c = beta * chosen_logps / chosen_lengths.clamp(min=1)
    r_r = beta * rejected_logps / rejected_lengths.clamp(min=1)
    losses = -F.logsigmoid(r_c - r_r - gamma)
    with torch.no_grad():
        metrics = _pair_metrics(r_c, r_r, chosen_logps, rejected_logps)
    return losses, metrics


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, accurate everywhere (Maechler 2012): log(-expm1(x)) near 0,
    log1p(-exp(x)) far from it. x = 0 gives -inf (probability 1: infinite odds)."""
    return torch.where(x > -0.6931471805599453, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def orpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    lam: float = 0.1,
) -> tuple[torch.Tensor, dict[str, float]]:
    """ORPO, Hong et al. 2024 ("ORPO: Monolithic Preference Optimization without Reference
    Model"), sec. 4: supervised fine-tuning on the chosen response plus an odds-ratio term,

        loss  = -avg(y_w) + lam * L_OR
        L_OR  = -log sigma(log odds(y_w) - log odds(y_l)),   odds(y) = P(y) / (1 - P(y)),
        P(y)  = exp(avg(y))                                    (the length-normalised likelihood)

    so log odds(y) = avg(y) - log(1 - exp(avg(y))) (``log1mexp``). No reference model.
    Inputs as :func:`simpo_loss`. Metrics: ``rewards/*`` of lam * avg(y) (as TRL logs them),
    ``orpo/nll`` mean -avg(y_w), ``orpo/log_odds_ratio`` mean log odds(y_w) - log odds(y_l),
    ``logps/*`` of the sums.
    """
    if not lam >= 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    avg_c = chosen_logps / chosen_lengths.clamp(min=1)
    avg_r = rejected_logps / rejected_lengths.clamp(min=1)
    log_odds = (avg_c - log1mexp(avg_c)) - (avg_r - log1mexp(avg_r))
    nll = -avg_c
    losses = nll - lam * F.logsigmoid(log_odds)
    with torch.no_grad():
        metrics = _pair_metrics(lam * avg_c, lam * avg_r, chosen_logps, rejected_logps)
        metrics.update({"orpo/nll": nll.mean().item(), "orpo/log_odds_ratio": log_odds.mean().item()})
    return losses, metrics


def kto_reference_point(log_ratio_sum: float, count: float) -> float:
    """KTO's reference point z_0 = max(0, mean log pi(y'|x) / pi_ref(y'|x)) over mismatched
    (prompt, completion) pairs of the batch, an estimate of KL(pi || pi_ref) (Ethayarajh et al.
    2024, sec. 4.1). Given the sum and the count over the whole optimiser batch (all micro-batches
    and processes), so z_0 does not depend on how the batch is split; a constant (no gradient)."""
    return max(0.0, float(log_ratio_sum) / max(float(count), 1.0))


def kto_loss(
    policy_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl: float,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KTO, Ethayarajh et al. 2024 ("KTO: Model Alignment as Prospect Theoretic Optimization"), sec. 4.1:

        r(x, y) = log pi(y|x) - log pi_ref(y|x)
        v(x, y) = lam_D sigma(beta (r - z_0))   y desirable
                  lam_U sigma(beta (z_0 - r))   y undesirable
        loss    = lam_y - v(x, y)

    z_0 = ``kl`` from :func:`kto_reference_point`. policy_logps (with grad), ref_logps: (B,) summed
    log-probs; desirable: (B,) bool. Metrics: ``rewards/chosen`` and ``rewards/rejected`` sums of
    beta * r over the desirable / undesirable examples, ``count/chosen`` and ``count/rejected``
    (sums, so the trainer can pool micro-batches into means), ``kl`` = z_0.
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    d = desirable.bool()
    r = policy_logps - ref_logps
    v_good = desirable_weight * torch.sigmoid(beta * (r - kl))
    v_bad = undesirable_weight * torch.sigmoid(beta * (kl - r))
    losses = torch.where(d, desirable_weight - v_good, undesirable_weight - v_bad)
    with torch.no_grad():
        br = beta * r
        metrics = {
            "rewards/chosen": br[d].sum().item(),
            "rewards/rejected": br[~d].sum().item(),
            "count/chosen": float(d.sum()),
            "count/rejected": float((~d).sum()),
            "kl": float(kl),
        }
    return losses, metrics
