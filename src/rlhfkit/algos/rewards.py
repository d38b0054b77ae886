"""Per-token reward shaping for PPO: KL penalty on every token, sequence score on the last.

Notation: B batch, T response length.
"""

from __future__ import annotations

import torch

from .kl import kl_estimate
from .masks import last_valid_index

__all__ = ["shape_rewards", "shape_turn_rewards"]


def shape_rewards(
    scores: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    kl_estimator: str = "k1",
    stopped: torch.Tensor | None = None,
    no_stop_penalty: float | None = None,
    score_clip: float | None = None,
    kl_clamp: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-penalised per-token rewards, Ziegler et al. 2019 / Ouyang et al. 2022 (InstructGPT):

        r_t = -kl_coef * KL_t                      on valid tokens (0 on padding)
        r_L += score                               at L = last valid token (docs/pitfalls.md#score-placement)

    where KL_t = ``kl_estimate(logp, ref_logp, kl_estimator)`` (k1 by default: unbiased and a
    reward needs no gradient, see ``rlhfkit.algos.kl``). The score is first clipped to
    [-score_clip, score_clip] if ``score_clip`` is given, then replaced by
    ``no_stop_penalty`` on rows where ``stopped`` is False if ``no_stop_penalty`` is given
    (docs/pitfalls.md#eos-policy). L is the stop token when the response stopped, for left and right padding
    alike. A row with no valid token gets no reward at all (there is no token to credit).

    scores: (B,); logp, ref_logp, mask: (B, T); stopped: (B,) bool.
    Returns ``(rewards (B, T), metrics)`` with python floats: ``kl`` (mean over sequences of
    the summed per-token KL), ``score_mean`` (mean of the scores actually added, after
    clipping/penalty), ``score_raw_mean`` (before), ``non_score_reward`` (mean per-sequence
    sum of the KL part), ``stopped_frac`` (only if ``stopped`` is given).
    """
    if scores.dim() != 1 or logp.dim() != 2 or scores.shape[0] != logp.shape[0]:
        raise ValueError(
            f"scores must be (B,) and logp (B, T); got {tuple(scores.shape)}, {tuple(logp.shape)}"
        )
    if logp.shape != ref_logp.shape or logp.shape != mask.shape:
        raise ValueError(
            f"logp, ref_logp and mask must share one (B, T) shape; got "
            f"{tuple(logp.shape)}, {tuple(ref_logp.shape)}, {tuple(mask.shape)}"
        )
    if no_stop_penalty is not None and stopped is None:
        raise ValueError("no_stop_penalty needs `stopped` (B,) bool, e.g. from response_mask()")
    if score_clip is not None and not score_clip > 0:
        raise ValueError(f"score_clip must be > 0 or None, got {score_clip}")

    m = mask if mask.dtype == torch.bool else mask != 0
    dtype = torch.promote_types(logp.dtype, torch.float32)
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    kl = torch.where(m, kl_estimate(logp.to(dtype), ref_logp.to(dtype), kl_estimator, clamp=kl_clamp), zero)
    non_score = -kl_coef * kl  # (B, T)

    raw = scores.to(dtype)
    score = raw if score_clip is None else raw.clamp(-score_clip, score_clip)
    if no_stop_penalty is not None:
        score = torch.where(stopped.bool(), score, torch.full_like(score, no_stop_penalty))
    has_token = m.any(dim=1)
    score_at = torch.where(has_token, score, zero)  # (B,)
    rewards = non_score.scatter_add(1, last_valid_index(m).unsqueeze(1), score_at.unsqueeze(1))

    metrics = {
        "kl": kl.sum(dim=1).mean().item(),
        "score_mean": score.mean().item(),
        "score_raw_mean": raw.mean().item(),
        "non_score_reward": non_score.sum(dim=1).mean().item(),
    }
    if stopped is not None:
        metrics["stopped_frac"] = stopped.float().mean().item()
    return rewards, metrics


def shape_turn_rewards(
    turn_rewards: torch.Tensor,
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    kl_estimator: str = "k1",
    stopped: torch.Tensor | None = None,
    no_stop_penalty: float | None = None,
    score_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``shape_rewards`` for multi-turn rollouts, whose environment rewards already sit on tokens:

        r_t = -kl_coef * KL_t + turn_rewards_t     on the model's tokens (mask), 0 elsewhere

    Each turn reward is clipped to [-score_clip, score_clip] if given; a row that did not stop
    (``stopped`` False) gets ``no_stop_penalty`` on its last model token instead of its turn
    rewards if given. turn_rewards, logp, ref_logp, mask: (B, T); stopped: (B,) bool.
    Returns ``(rewards (B, T), metrics)`` as ``shape_rewards``.
    """
    if turn_rewards.shape != mask.shape:
        raise ValueError(f"turn_rewards {tuple(turn_rewards.shape)} and mask {tuple(mask.shape)} must share (B, T)")
    m = mask if mask.dtype == torch.bool else mask != 0
    dtype = torch.promote_types(logp.dtype, torch.float32)
    tr = torch.where(m, turn_rewards.to(dtype), torch.zeros((), dtype=dtype, device=logp.device))
    if score_clip is not None:
        tr = tr.clamp(-score_clip, score_clip)
    if no_stop_penalty is not None:
        if stopped is None:
            raise ValueError("no_stop_penalty needs `stopped` (B,) bool")
        tr = tr * stopped.bool().to(dtype)[:, None]
    zeros = torch.zeros(mask.shape[0], dtype=dtype, device=logp.device)
    shaped, metrics = shape_rewards(zeros, logp, ref_logp, mask, kl_coef, kl_estimator, stopped=stopped,
                                    no_stop_penalty=no_stop_penalty)  # the KL part, plus the penalty where due
    rewards = shaped + tr
    added = tr.sum(1) if no_stop_penalty is None else tr.sum(1) + torch.where(
        stopped.bool(), zeros, torch.full_like(zeros, no_stop_penalty) * m.any(1))
    metrics.update({"score_mean": added.mean().item(), "score_raw_mean": turn_rewards.sum(1).mean().item()})
    return rewards, metrics
