"""Policy-gradient variants on top of the clipped ratio loss: GSPO (sequence-level ratio), DAPO's
overlong reward shaping, REINFORCE++ returns, the ReMax baseline, and the truncated
importance-sampling (TIS) correction for rollouts whose sampler is not the trainer.

Notation: B batch, T response length, G group size, |y_i| the valid tokens of row i.
Each function is pure torch; losses return ``(loss, metrics)`` with python-float metrics over
the valid tokens of *this* call (one micro-batch), like ``ppo_policy_loss`` (0-d tensors with
``tensor_metrics=True``).
"""

from __future__ import annotations

import torch

from .advantages import discounted_reverse_cumsum
from .kl import kl_k3
from .losses import _bool, aggregate_loss, read_metrics
from .masks import masked_mean

__all__ = [
    "IMPORTANCE_LEVELS",
    "sequence_log_ratio",
    "clipped_policy_loss",
    "truncated_is_weights",
    "overlong_penalty",
    "reward_to_go",
    "remax_advantages",
]



def _token_log_ratio(log_ratio: torch.Tensor, seq_lr: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """PPO: each token's own log-ratio. log_ratio, own: (B, T); seq_lr: (B,). Returns (B, T)."""
    return log_ratio


def _sequence_log_ratio(log_ratio: torch.Tensor, seq_lr: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """GSPO: the row's length-normalised sequence log-ratio on every token. Returns (B, T)."""
    return seq_lr[:, None].expand_as(log_ratio)


def _sequence_token_log_ratio(log_ratio: torch.Tensor, seq_lr: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """GSPO-token: the value of the sequence log-ratio, the gradient of the token's own log-prob
    (`own`: logp with padding zeroed). Returns (B, T)."""
    return seq_lr.detach()[:, None] + own - own.detach()


# importance level (rlhfkit.core.choices.IMPORTANCE_LEVELS) -> log rho from (log_ratio, seq_lr, own)
IMPORTANCE_RATIOS = {"token": _token_log_ratio, "sequence": _sequence_log_ratio,
                     "sequence-token": _sequence_token_log_ratio}
IMPORTANCE_LEVELS = tuple(IMPORTANCE_RATIOS)


def sequence_log_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log s_i = (1 / |y_i|) sum_t (logp_it - old_logp_it): the log of GSPO's length-normalised
    sequence ratio s_i = (pi(y_i) / pi_old(y_i))^(1 / |y_i|) (Zheng et al. 2025, "Group Sequence
    Policy Optimization").
    logp (with grad), old_logp, mask: (B, T). Returns (B,); 0 for a row without valid tokens."""
    m = _bool(mask)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    return masked_mean(torch.where(m, logp - old_logp, zero), m, dim=-1)


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    agg_mode: str = "token-mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    constant: float | None = None,
    clip_eps_high: float | None = None,
    level: str = "token",
    weights: torch.Tensor | None = None,
    tensor_metrics: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped surrogate with the importance ratio taken per token or per sequence:

        l_it = w_it * max(-A_it rho_it, -A_it clip(rho_it, 1 - eps, 1 + eps_high))

    - ``level="token"``: rho_it = pi(y_it) / pi_old(y_it) (PPO, Schulman et al. 2017, eq. 7; equal
      to ``ppo_policy_loss`` when ``weights`` is None).
    - ``level="sequence"``: rho_it = s_i = exp(sequence_log_ratio) on every token of row i: GSPO
      (Zheng et al. 2025) clips whole sequences; its gradient is s_i A_i (1/|y_i|)
      sum_t grad log pi(y_it). With ``agg_mode="seq-mean"`` the loss is GSPO's
      (1/G) sum_i max(-A_i s_i, -A_i clip(s_i)) exactly.
    - ``level="sequence-token"``: GSPO-token (same paper), rho_it = sg[s_i] * pi(y_it) / sg[pi(y_it)]:
      the value of s_i, the gradient of one token, so per-token advantages A_it keep their own
      weight; with A constant along a row and ``seq-mean`` its gradient equals GSPO's.

    ``weights`` (B, T), no grad: per-token importance weights multiplying the loss (the truncated
    IS correction, :func:`truncated_is_weights`); None = 1. Aggregated with ``aggregate_loss``.

    logp (with grad), old_logp, advantages, mask: (B, T). Metrics (token means over the mask):
    ``policy_clip_frac`` share of tokens whose clipped term is strictly greater (for the
    sequence levels a clipped sequence counts with all its tokens), ``approx_kl`` token k2 of the
    per-token log-ratio, ``ratio_mean``/``ratio_max`` of rho, and ``seq_ratio_mean``, the mean
    sequence ratio s_i over rows with a valid token.
    """
    if level not in IMPORTANCE_RATIOS:
        raise ValueError(f"unknown importance level {level!r}; choose one of: {', '.join(IMPORTANCE_RATIOS)}")
    eps_hi = clip_eps if clip_eps_high is None else clip_eps_high
    m = _bool(mask)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    log_ratio = torch.where(m, logp - old_logp, zero)  # padding neutralised before exp
    seq_lr = masked_mean(log_ratio, m, dim=-1)  # (B,)
    log_rho = IMPORTANCE_RATIOS[level](log_ratio, seq_lr, torch.where(m, logp, zero))
    rho = torch.where(m, torch.exp(log_rho), zero)
    adv = torch.where(m, advantages.to(logp.dtype), zero)
    unclipped = -adv * rho
    clipped = -adv * torch.clamp(rho, 1.0 - clip_eps, 1.0 + eps_hi)
    per_token = torch.maximum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * weights.detach().to(per_token.dtype)
    loss = aggregate_loss(per_token, m, agg_mode, num_tokens, num_seqs, constant)
    with torch.no_grad():
        n = m.sum().clamp(min=1)
        rows = m.any(-1)
        metrics = {
            "policy_clip_frac": ((clipped > unclipped) & m).sum().div(n),
            "approx_kl": (0.5 * log_ratio**2).sum().div(n),
            "ratio_mean": rho.sum().div(n),
            "ratio_max": rho.max() if rho.numel() else 0.0,
            # 1 without a valid row; a masked sum, not a boolean index (that would read the count on the host)
            "seq_ratio_mean": torch.where(rows.any(), torch.where(rows, seq_lr.exp(), zero).sum()
                                          / rows.sum().clamp(min=1), 1.0),
        }
    return loss, read_metrics(metrics, tensor_metrics)


def truncated_is_weights(
    trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor, cap: float,
    tensor_metrics: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance-sampling weights for tokens drawn by a sampler that is not the trainer
    (vLLM's kernels, an older copy of the weights): w_t = min(pi_train(y_t) / pi_sampler(y_t), C)
    (Ionides 2008's truncation; Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training", applied to the trainer's log-probs of the sampled tokens).

    trainer_logp: (B, T) log-probs of the rollout under the trainer's pi_old (the teacher-forced
    pass); sampler_logp: (B, T) the sampler's own log-probs of the same tokens, NaN where the
    sampler gave none (that token gets w = 1). Both at the sampling temperature; no grad.
    Returns ``(weights (B, T), metrics)``: w is 1 on padding. Metrics over the valid tokens with a
    sampler log-prob: ``is_weight_mean`` (after truncation), ``is_clip_frac`` share with
    pi_train / pi_sampler strictly above C, ``mismatch_kl`` the k3 estimate of
    KL(pi_sampler || pi_train) per token (the tokens come from the sampler).
    """
    if not cap >= 1.0:
        raise ValueError(f"the truncation cap C must be >= 1, got {cap}")
    known = _bool(mask) & ~torch.isnan(sampler_logp)
    zero = torch.zeros((), dtype=trainer_logp.dtype, device=trainer_logp.device)
    log_w = torch.where(known, trainer_logp - torch.nan_to_num(sampler_logp), zero)
    raw = torch.exp(log_w)
    weights = raw.clamp(max=cap)
    n = known.sum().clamp(min=1)
    k3 = torch.where(known, kl_k3(torch.nan_to_num(sampler_logp), trainer_logp), zero)
    metrics = {
        "is_weight_mean": torch.where(known.any(), torch.where(known, weights, zero).sum().div(n), 1.0),
        "is_clip_frac": ((raw > cap) & known).sum().div(n),
        "mismatch_kl": k3.sum().div(n),
    }
    return weights, read_metrics(metrics, tensor_metrics)


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, sec. 3.4), added to a completion's reward:

        0                                   |y| <= L_max - L_cache
        ((L_max - L_cache) - |y|) / L_cache   L_max - L_cache < |y| <= L_max
        -1                                  L_max < |y|

    times ``factor``; L_max = ``max_length`` (the generation limit), L_cache = ``buffer`` >= 1.
    The penalty falls linearly from 0 to -1 over the last L_cache tokens before the limit.
    lengths: (B,) response tokens (the stop token included). Returns (B,) float32.
    """
    if not 1 <= buffer <= max_length:
        raise ValueError(f"buffer must be in [1, max_length={max_length}], got {buffer}")
    n = lengths.to(torch.float32)
    start = float(max_length - buffer)
    ramp = (start - n) / buffer
    pen = torch.where(n <= start, torch.zeros_like(n), torch.where(n <= max_length, ramp, torch.full_like(n, -1.0)))
    return factor * pen


def reward_to_go(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """G_t = sum_{s >= t} r_s over the valid tokens of a row (undiscounted return, as REINFORCE++
    uses it: Hu 2025, gamma = 1). Masked positions add nothing and read 0.
    rewards, mask: (B, T). Returns (B, T)."""
    m = _bool(mask)
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    r = torch.where(m, rewards, zero)
    return torch.where(m, discounted_reverse_cumsum(r, 1.0), zero)


def remax_advantages(scores: torch.Tensor, greedy_scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """ReMax (Li et al. 2023, "ReMax: a simple, effective, and efficient RL method for aligning
    LLMs"): A_i = r(x, y_i) - r(x, y_greedy), the baseline being the reward
    of the greedy completion of the same prompt. scores: (B,) in consecutive groups of G samples
    per prompt; greedy_scores: (B / G,), one per prompt. Returns (B,)."""
    if scores.dim() != 1 or scores.shape[0] != greedy_scores.shape[0] * group_size:
        raise ValueError(f"scores {tuple(scores.shape)} must be (B,) = greedy_scores {tuple(greedy_scores.shape)} "
                         f"x group_size {group_size}")
    dtype = torch.promote_types(scores.dtype, torch.float32)
    return scores.to(dtype) - greedy_scores.to(dtype).repeat_interleave(group_size)
