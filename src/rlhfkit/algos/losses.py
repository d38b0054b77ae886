"""Loss functions: one aggregation rule, PPO policy/value/entropy, DPO/IPO/cDPO, Bradley-Terry.

Notation: B batch, T response length. Each loss returns ``(loss, metrics)``; metrics are
python floats computed without gradient over the valid tokens of *this* call (one
micro-batch on one rank): average them over micro-batches/ranks for logging. The PPO losses
take ``tensor_metrics=True`` to return them as 0-d tensors instead: no host read per metric,
for a caller that reads a whole optimiser step's at once (trainers/rl_update.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .masks import masked_mean, masked_sum

__all__ = [
    "AGG_MODES",
    "aggregate_loss",
    "ppo_policy_loss",
    "ppo_value_loss",
    "entropy_loss",
    "DPO_LOSS_TYPES",
    "dpo_loss",
    "bradley_terry_loss",
]

AGG_MODES = ("token-mean", "seq-mean", "constant")


def _bool(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def read_metrics(metrics: dict[str, torch.Tensor | float], tensor_metrics: bool) -> dict:
    """`metrics` as they are (0-d tensors, `tensor_metrics`) or as python floats (one host read each)."""
    if tensor_metrics:
        return metrics
    return {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}


def aggregate_loss(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    mode: str = "token-mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    constant: float | None = None,
    agg_mode: str | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar: the ONE aggregation rule (docs/pitfalls.md#loss-aggregation).

    - ``"token-mean"``: sum(loss * mask) / N, N = ``num_tokens`` if given, else mask.sum().
      Pass N = the valid-token count of the WHOLE optimiser batch (all gradient-accumulation
      micro-batches on all processes, all-reduced); then the micro-batch losses sum to
      exactly the full-batch loss and gradient, whatever the split. DDP *averages* gradients
      over W ranks, so a DDP trainer backpropagates ``W * loss`` (or sums gradients itself).
      Every token weighs the same.
    - ``"seq-mean"``: sum over rows of (row token mean) / S, S = ``num_seqs`` if given, else
      B (all rows, as in the original GRPO; a row with no valid token counts as 0). Each
      sequence weighs the same, so tokens of short answers weigh more (length bias).
    - ``"constant"``: sum(loss * mask) / ``constant`` (Dr. GRPO, Liu et al. 2025, uses
      global B * max response length): no dependence on lengths in the batch at all.

    With the global normaliser every mode is split-invariant. Without it (N or S from the
    micro-batch), averaging micro-batch losses is *not* the full-batch mean when token
    counts differ. An empty mask gives 0, never NaN.

    per_token: (B, T); mask: (B, T) bool or 0/1 float. Returns a scalar. ``agg_mode`` is an
    alias of ``mode`` so that one ``dict(agg_mode=..., num_tokens=..., num_seqs=...)`` can be
    splatted into every loss function and into this one.
    """
    if agg_mode is not None:
        if mode != "token-mean" and mode != agg_mode:
            raise ValueError(f"conflicting mode={mode!r} and agg_mode={agg_mode!r}; pass one")
        mode = agg_mode
    if per_token.shape != mask.shape:
        raise ValueError(f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} must match")
    if mode == "token-mean":
        n = _bool(mask).sum() if num_tokens is None else num_tokens
        return masked_sum(per_token, mask) / _clamp1(n, per_token)
    if mode == "seq-mean":
        row_mean = masked_mean(per_token, mask, dim=-1)  # (B,)
        s = per_token.shape[0] if num_seqs is None else num_seqs
        return row_mean.sum() / _clamp1(s, per_token)
    if mode == "constant":
        if constant is None or not constant > 0:
            raise ValueError(f"mode 'constant' needs constant > 0, got {constant}")
        return masked_sum(per_token, mask) / constant
    raise ValueError(f"unknown aggregation mode {mode!r}; valid modes: {list(AGG_MODES)}")


def _clamp1(n, like: torch.Tensor) -> torch.Tensor:
    """Normaliser as a tensor, at least 1 so an empty batch gives 0/1 = 0 rather than NaN."""
    return torch.as_tensor(n, dtype=like.dtype, device=like.device).clamp(min=1)


def ppo_policy_loss(
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
    tensor_metrics: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate, Schulman et al. 2017, eq. 7, as a loss to minimise:

        ratio_t = exp(logp_t - old_logp_t)
        l_t     = max(-A_t * ratio_t, -A_t * clip(ratio_t, 1 - eps, 1 + eps_high))

    aggregated with :func:`aggregate_loss`. ``clip_eps_high`` (default: = clip_eps) gives an
    asymmetric "clip-higher" range (DAPO, Yu et al. 2025). The gradient is exactly 0 where
    the clipped term is active (A > 0 and ratio > 1 + eps_high; A < 0 and ratio < 1 - eps).

    logp (with grad), old_logp, advantages, mask: (B, T). Metrics (token means over the
    mask): ``policy_clip_frac`` fraction of tokens where the clipped term is strictly greater
    (``>``) than the unclipped one, i.e. the clip is active and changes the loss;
    ``approx_kl`` mean of 0.5 * (logp - old_logp)^2 (the k2 estimator of KL(pi_old || pi),
    Schulman 2020); ``ratio_mean``; ``ratio_max`` (max over valid tokens, 0 if none).
    """
    eps_hi = clip_eps if clip_eps_high is None else clip_eps_high
    m = _bool(mask)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    # Neutralise padding before exp: garbage log-probs there could overflow and, through
    # 0 * inf in the backward pass, put NaN into the gradient of the valid tokens.
    log_ratio = torch.where(m, logp - old_logp, zero)
    adv = torch.where(m, advantages.to(logp.dtype), zero)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_eps, 1.0 + eps_hi)
    per_token = torch.maximum(unclipped, clipped)
    loss = aggregate_loss(per_token, m, agg_mode, num_tokens, num_seqs, constant)
    with torch.no_grad():
        n = m.sum().clamp(min=1)  # count once: bool reductions are not free at B x T = 5e5
        ratio_valid = torch.where(m, ratio, zero)  # exp(0) = 1 on padding would bias mean/max
        metrics = {
            # On padding A = 0, so both terms are 0 and never "strictly greater".
            "policy_clip_frac": ((clipped > unclipped) & m).sum().div(n),
            "approx_kl": (0.5 * log_ratio**2).sum().div(n),  # log_ratio is 0 on padding
            "ratio_mean": ratio_valid.sum().div(n),
            "ratio_max": ratio_valid.max() if ratio_valid.numel() else 0.0,
        }
    return loss, read_metrics(metrics, tensor_metrics)


def ppo_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float | None = 0.2,
    agg_mode: str = "token-mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    constant: float | None = None,
    tensor_metrics: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss (PPO2 baselines; Ziegler et al. 2019 lm-human-preferences):

        v_clip = old_values + clip(values - old_values, -eps, eps)
        l_t    = 0.5 * max((values - R)^2, (v_clip - R)^2)

    ``clip_eps=None`` disables clipping (l_t = 0.5 * (values - R)^2). values (with grad),
    old_values, returns, mask: (B, T). Metrics (token means over the mask):
    ``value_clip_frac`` fraction where the clipped error is strictly greater (``>``);
    ``value_mean``; ``value_error`` mean (values - R)^2 (unclipped).
    """
    m = _bool(mask)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    v = torch.where(m, values, zero)
    ret = torch.where(m, returns.to(values.dtype), zero)
    err = (v - ret) ** 2
    if clip_eps is None:
        per_token, clipped_err = 0.5 * err, err
    else:
        old = torch.where(m, old_values.to(values.dtype), zero)
        v_clip = old + torch.clamp(v - old, -clip_eps, clip_eps)
        clipped_err = (v_clip - ret) ** 2
        per_token = 0.5 * torch.maximum(err, clipped_err)
    loss = aggregate_loss(per_token, m, agg_mode, num_tokens, num_seqs, constant)
    with torch.no_grad():
        metrics = {
            "value_clip_frac": masked_mean((clipped_err > err).float(), m),
            "value_mean": masked_mean(v, m),
            "value_error": masked_mean(err, m),
        }
    return loss, read_metrics(metrics, tensor_metrics)


def entropy_loss(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    agg_mode: str = "token-mean",
    num_tokens: float | torch.Tensor | None = None,
    num_seqs: float | torch.Tensor | None = None,
    constant: float | None = None,
) -> torch.Tensor:
    """Aggregated per-token entropy (same rule as the other losses); the trainer minimises
    ``... - ent_coef * entropy_loss(...)`` (entropy bonus, Schulman et al. 2017, eq. 9).

    entropy: (B, T) from ``entropy_from_logits`` at the sampling temperature. Returns a scalar.
    """
    return aggregate_loss(entropy, mask, agg_mode, num_tokens, num_seqs, constant)


DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge", "robust")


def dpo_loss(
    policy_chosen_logps: torch.Tensor,
    policy_rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-pair preference losses from sequence log-probs (all inputs (B,)).

    h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l)).

    - ``"sigmoid"``, label_smoothing = 0: DPO, Rafailov et al. 2023, eq. 7: -log sigma(beta h).
    - ``"sigmoid"``, label_smoothing = e in (0, 0.5): conservative DPO (cDPO, Mitchell 2023),
      -(1 - e) log sigma(beta h) - e log sigma(-beta h), for labels flipped with prob. e.
    - ``"ipo"``: IPO, Azar et al. 2023, eq. 17: (h - 1 / (2 beta))^2. Azar et al. use
      *length-averaged* log-probs here; pass those if you want the paper's form.
    - ``"hinge"``: SLiC's hinge loss, relu(1 - beta h) (TRL's ``hinge``).
    - ``"robust"``: rDPO, Chowdhury et al. 2024, eq. 8: ((1 - e)(-log sigma(beta h)) - e(-log sigma(-beta h)))
      / (1 - 2e), an unbiased estimate of the clean loss under flips with prob. e (TRL's ``robust``; cDPO
      above is the original conservative DPO, which adds the two terms instead).

    Returns ``(losses (B,), metrics)``; reduce with ``.mean()``. Metrics: ``rewards/chosen``
    and ``rewards/rejected`` means of the implicit rewards beta * (log pi - log pi_ref);
    ``rewards/accuracy`` fraction with chosen reward strictly greater; ``rewards/margin``
    mean chosen minus rejected reward; ``logps/chosen``, ``logps/rejected`` policy means.
    """
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen_logratio = policy_chosen_logps - ref_chosen_logps
    rejected_logratio = policy_rejected_logps - ref_rejected_logps
    h = chosen_logratio - rejected_logratio  # (B,)
    if loss_type == "sigmoid":
        losses = -(1.0 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif loss_type == "ipo":
        if label_smoothing != 0.0:
            raise ValueError("label_smoothing applies to loss_type='sigmoid' (cDPO) only, not 'ipo'")
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    elif loss_type == "hinge":  # SLiC (Zhao et al. 2023) as TRL writes it: relu(1 - beta h)
        losses = torch.relu(1.0 - beta * h)
    elif loss_type == "robust":  # rDPO (Chowdhury et al. 2024): unbiased under label flips with prob. e
        e = label_smoothing
        losses = (-(1.0 - e) * F.logsigmoid(beta * h) + e * F.logsigmoid(-beta * h)) / (1.0 - 2.0 * e)
    else:
        raise ValueError(f"unknown DPO loss_type {loss_type!r}; valid types: {list(DPO_LOSS_TYPES)}")
    with torch.no_grad():
        r_c, r_r = beta * chosen_logratio, beta * rejected_logratio
        metrics = {
            "rewards/chosen": r_c.mean().item(),
            "rewards/rejected": r_r.mean().item(),
            "rewards/accuracy": (r_c > r_r).float().mean().item(),
            "rewards/margin": (r_c - r_r).mean().item(),
            "logps/chosen": policy_chosen_logps.mean().item(),
            "logps/rejected": policy_rejected_logps.mean().item(),
        }
    return losses, metrics


def bradley_terry_loss(
    chosen_scores: torch.Tensor,
    rejected_scores: torch.Tensor,
    margin: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Reward-model pairwise loss, Bradley & Terry 1952 / Ouyang et al. 2022, eq. 1:

        loss = mean_i -log sigma(r_c,i - r_r,i - m_i)

    with an optional margin m (Touvron et al. 2023, Llama 2, eq. 2), scalar or (B,).
    chosen_scores, rejected_scores: (B,). Returns ``(loss scalar, metrics)``: ``accuracy``
    fraction with r_c > r_r (strict), ``margin`` mean r_c - r_r, ``chosen_mean``,
    ``rejected_mean``.
    """
    diff = chosen_scores - rejected_scores
    logits = diff if margin is None else diff - margin
    loss = -F.logsigmoid(logits).mean()
    with torch.no_grad():
        metrics = {
            "accuracy": (diff > 0).float().mean().item(),
            "margin": diff.mean().item(),
            "chosen_mean": chosen_scores.mean().item(),
            "rejected_mean": rejected_scores.mean().item(),
        }
    return loss, metrics
