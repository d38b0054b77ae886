"""GRPO's distillation term (`teacher=`, `distill_coef=`): the on-policy reverse KL to a frozen teacher
on the sampled tokens (rlhfkit distill's loss=reverse-kl, algos.reverse_kl_loss), added to the policy
loss times distill_coef (a LOSS_TERMS entry in grpo_variants.py) and logged apart as loss/distill and
distill/reverse_kl. `teacher_inputs` loads the teacher once and, in step 5, adds its log-probs of the
rows' tokens (rollout.teacher_logprobs) in the update's micro-batches; `distill` is the term."""

from __future__ import annotations

import dataclasses

import torch

from rlhfkit.algos import reverse_kl_loss
from rlhfkit.rollout import Rollout
from rlhfkit.rollout.logprobs import frozen_logprobs


def distill(x) -> tuple[torch.Tensor, dict]:
    """The unweighted term of one micro-batch (x: grpo_variants.LossInputs): reverse_kl_loss on its
    sampled tokens, aggregated like the policy loss (x.agg), and distill/reverse_kl, the token mean of
    log pi_old - log p_teacher (k1, nats per token)."""
    loss, m = reverse_kl_loss(x.logp, x.mb.logprobs, x.mb.teacher_logprobs, x.mask, **x.agg)
    return loss, {"distill/reverse_kl": m["reverse_kl"]}


def teacher_inputs(rl, cfg):
    """Load the frozen teacher (trainers/distill.py load_teacher) on the run's device; returns the step-5
    function that adds its log-probs of a Rollout's tokens in the micro-batches of `order`."""
    from rlhfkit.trainers.distill import load_teacher

    teacher = load_teacher(cfg, rl.core, rl.tok).to(rl.device)

    def add(rollout: Rollout, order: torch.Tensor) -> Rollout:
        lp = frozen_logprobs(teacher, rollout, cfg.temperature, rl.micro_batch_size, order, cfg.cpu_chunk_positions)
        return dataclasses.replace(rollout, teacher_logprobs=lp)

    return add
