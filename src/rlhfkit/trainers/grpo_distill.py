"""GRPO's distillation term (`teacher=`, `distill_coef=`): the on-policy reverse KL to a frozen teacher
on the sampled tokens (rlhfkit distill's loss=reverse-kl, algos.reverse_kl_loss), added to the policy
loss times distill_coef and logged apart (loss/distill, distill/reverse_kl).

Three pieces, each called from one place in trainers/grpo.py: `load` (with the models, before the run
folder exists), `add_teacher_logprobs` (after the log-prob pass, in the same micro-batches) and
`distill_term` (in each micro-batch's loss, aggregated like the policy loss).
"""

from __future__ import annotations

import torch

from rlhfkit.algos import masked_mean, reverse_kl_loss
from rlhfkit.rollout import Rollout
from rlhfkit.rollout.logprobs import frozen_logprobs


def load(cfg, actor, tok):
    """The frozen teacher (trainers/distill.py load_teacher), or None with distill_coef 0."""
    if cfg.distill_coef <= 0:
        return None
    from rlhfkit.trainers.distill import load_teacher

    return load_teacher(cfg, actor, tok)


def add_teacher_logprobs(teacher, rollout: Rollout, cfg, micro_batch_size: int, order: torch.Tensor) -> dict:
    """Fill rollout.teacher_logprobs (B, R) in the micro-batches of `order`; returns distill/reverse_kl,
    the token mean of log pi_old - log p_teacher over the sampled tokens (k1, nats per token)."""
    rollout.teacher_logprobs = frozen_logprobs(teacher, rollout, cfg.temperature, micro_batch_size, order,
                                               cfg.cpu_chunk_positions)
    diff = rollout.logprobs - rollout.teacher_logprobs
    return {"distill/reverse_kl": masked_mean(diff, rollout.response_mask).item()}


def distill_term(logp: torch.Tensor, mb: Rollout, mask: torch.Tensor, agg: dict) -> torch.Tensor:
    """The unweighted term of one micro-batch: reverse_kl_loss on its sampled tokens, aggregated by
    `agg` (the policy loss's agg_mode and global counts, so micro-batches add up alike)."""
    loss, _ = reverse_kl_loss(logp, mb.logprobs.to(logp.device), mb.teacher_logprobs.to(logp.device), mask, **agg)
    return loss
