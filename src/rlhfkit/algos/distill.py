"""Distillation losses: a student learns a teacher's per-token distributions.

Notation: B batch, T response length, V vocab, K kept teacher logits (distill_topk). p_s is the
student's next-token distribution, p_t the teacher's, both at the same temperature.

- ``reverse_kl_loss``: on-policy distillation (Agarwal et al. 2024 "GKD", on-policy with beta = 1;
  the recipe NeMo-RL, verl and prime-rl use). Tokens y_t are sampled from the student; the
  per-token reverse KL KL(p_s || p_t) is estimated on them by d_t = log p_s(y_t) - log p_t(y_t)
  (k1, unbiased), and its gradient E[d_t grad log p_s(y_t)] is taken as a policy gradient with the
  per-token advantage -d_t (no credit to earlier tokens: the per-token form, discount 0). The
  teacher scores only the sampled tokens: no (B, T, V) teacher logits.
- ``generalized_jsd`` / ``jsd_loss``: GKD's generalised Jensen-Shannon divergence over whole
  distributions, on any sequences (student samples or a dataset's / the teacher's), with TRL's
  convention (trl.experimental.gkd ``generalized_jsd_loss``): mixture m = beta p_t + (1 - beta) p_s,
  JSD_beta = beta KL(p_t || m) + (1 - beta) KL(p_s || m); beta = 0 is *defined* as the forward KL
  KL(p_t || p_s) (supervised KD's) and beta = 1 as the reverse KL KL(p_s || p_t). (The mixture
  formula itself tends to 0 at both ends; JSD_beta / beta -> KL(p_t || p_s) as beta -> 0 and
  JSD_beta / (1 - beta) -> KL(p_s || p_t) as beta -> 1, which is why the ends are named so.)
- ``teacher_topk`` / ``topk_logprobs``: keep the teacher's K largest logits per position; both
  distributions are then renormalised over those K tokens (with K = V this is the full loss).

Each loss returns ``(loss, metrics)``; metrics are 0-d tensors without gradient, token means of
this call's valid tokens. Losses are normalised by ``num_tokens`` when given (the whole optimiser
batch's valid-token count: micro-batch losses then add up to the batch's, losses.aggregate_loss).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .losses import aggregate_loss
from .masks import masked_mean

__all__ = ["generalized_jsd", "jsd_loss", "log_mixture", "reverse_kl_loss", "teacher_topk", "topk_logprobs"]


def generalized_jsd(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """Per-position JSD_beta (..., ) between two distributions given as log-probs (..., V) over the
    same support: beta = 0 forward KL(p_t || p_s), beta = 1 reverse KL(p_s || p_t), else
    beta KL(p_t || m) + (1 - beta) KL(p_s || m) with m = beta p_t + (1 - beta) p_s."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta ({beta}) must be in [0, 1]")

    def kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:  # KL(p || q) over the last dim
        return (log_p.exp() * (log_p - log_q)).sum(-1)

    if beta == 0.0:
        return kl(teacher_logp, student_logp)
    if beta == 1.0:
        return kl(student_logp, teacher_logp)
    mix = log_mixture(student_logp, teacher_logp, beta)
    return beta * kl(teacher_logp, mix) + (1 - beta) * kl(student_logp, mix)


def log_mixture(student_logp: torch.Tensor, teacher_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """log m (..., V), m = beta p_t + (1 - beta) p_s, as hi + log1p(w_lo * expm1(lo - hi)) with hi, lo the
    larger and smaller of the two log-probs and w_lo the smaller one's weight: finite for any inputs
    (lo - hi <= 0), and exactly log p_s where p_t = p_s, so a student equal to its teacher has a loss
    of exactly 0 (a logsumexp rounds it to ~1e-8)."""
    teacher_higher = teacher_logp >= student_logp
    hi = torch.maximum(teacher_logp, student_logp)
    lo = torch.minimum(teacher_logp, student_logp)
    w = torch.tensor([beta, 1.0 - beta], dtype=hi.dtype, device=hi.device)
    w_lo = torch.where(teacher_higher, w[1], w[0])
    return hi + torch.log1p(w_lo * torch.expm1(lo - hi))


def teacher_topk(teacher_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (B, T, K), indices (B, T, K)) of the teacher's K largest logits per position (K <= V)."""
    return teacher_logits.topk(min(k, teacher_logits.shape[-1]), dim=-1)


def topk_logprobs(student_logits: torch.Tensor, teacher_values: torch.Tensor, indices: torch.Tensor,
                  temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(student, teacher) log-probs (B, T, K) renormalised over the teacher's kept tokens `indices`:
    student_logits (B, T, V), teacher_values (B, T, K) = the teacher's logits at `indices`."""
    s = student_logits.gather(-1, indices) / temperature
    return F.log_softmax(s.float(), dim=-1), F.log_softmax(teacher_values.float() / temperature, dim=-1)


def jsd_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.5,
    temperature: float = 1.0,
    topk_indices: torch.Tensor | None = None,
    num_tokens: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GKD's loss: the token mean of JSD_beta over the valid positions.

    student_logits: (B, T, V) with gradient. teacher_logits: (B, T, V), or (B, T, K) the kept values
    when `topk_indices` (B, T, K) is given (``teacher_topk``). mask: (B, T) bool or 0/1. Both are
    divided by `temperature` before the softmax. Positions where `mask` is 0 contribute nothing
    (their value and gradient are exactly 0). Returns (loss, {"jsd": token mean of this call})."""
    if topk_indices is None:
        s_logp = F.log_softmax(student_logits.float() / temperature, dim=-1)
        t_logp = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    else:
        s_logp, t_logp = topk_logprobs(student_logits, teacher_logits, topk_indices, temperature)
    per_token = generalized_jsd(s_logp, t_logp.detach(), beta)  # (B, T)
    valid = mask != 0
    per_token = torch.where(valid, per_token, torch.zeros_like(per_token))
    loss = aggregate_loss(per_token, valid, "token-mean", num_tokens)
    return loss, {"jsd": masked_mean(per_token.detach(), valid)}


def reverse_kl_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    teacher_logp: torch.Tensor,
    mask: torch.Tensor,
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    agg_mode: str = "token-mean",
    constant: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """On-policy reverse KL: a policy-gradient surrogate whose gradient estimates grad KL(p_s || p_t).

    logp (B, T): the student's log-probs of its own sampled tokens, with gradient; old_logp (B, T):
    the same from the scoring pass that followed sampling (no gradient); teacher_logp (B, T): the
    teacher's log-probs of those tokens. Per token d = old_logp - teacher_logp (k1 estimate of the
    reverse KL at that position, a constant) and ratio = exp(logp - old_logp) (1 on-policy):

        loss = token mean of d * ratio    (or another aggregation: agg_mode, losses.aggregate_loss)

    Its value on-policy is the k1 estimate of the mean per-token reverse KL; its gradient is
    d * grad log p_s (REINFORCE with advantage -d; a later mini-batch of the same rollout is
    importance-weighted by its ratio). Teacher = student gives d = 0: loss and gradient exactly 0.
    Returns (loss, {"reverse_kl": mean d, "ratio_dev": max |ratio - 1|}) over valid tokens."""
    valid = mask != 0
    d = (old_logp - teacher_logp).detach()
    d = torch.where(valid, d, torch.zeros_like(d))
    log_ratio = torch.where(valid, logp - old_logp.detach(), torch.zeros_like(logp))
    ratio = log_ratio.exp()
    loss = aggregate_loss(d * ratio, valid, agg_mode, num_tokens, num_seqs, constant)
    dev = (ratio.detach() - 1).abs().masked_fill(~valid, 0)
    return loss, {"reverse_kl": masked_mean(d, valid), "ratio_dev": dev.max() if dev.numel() else dev.sum()}
