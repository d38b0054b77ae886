"""One PPO iteration written out on `rlhfkit.algos` alone (docs/learn/01-one-iteration.md).

The trainer spreads an iteration over trainers/ppo.py (`train`, `compute_advantages`,
`micro_batch_loss`), trainers/rl_update.py (`update_policy`) and rollout/logprobs.py
(`logprob_pass`), because it also handles several processes, bf16, LoRA, chunked micro-batches,
a frozen trunk, skipped non-finite steps and checkpoints. This file leaves all of that out (one
process, one micro-batch per mini-batch, no warm-up schedule unless one is passed) and keeps the
maths, in the trainer's order; tests/learn/test_ppo_reference.py checks that both compute the same
weights from the same rollout.

`model(input_ids, attention_mask) -> (logits (B, L, V), values (B, L))` is any causal LM with a
value head: L = P + R, prompt then response. The rollout is rlhfkit's `Rollout`: generation fills
query_ids (B, P), query_mask (B, P), response_ids (B, R), response_mask (B, R) and the reward
function scores (B,); `collect` returns it with logprobs, values and ref_logprobs (B, R), `advantages`
with rewards, advantages and returns (B, R). From `collect` on, all of these are constants: the update
differentiates only the log-probs and values it recomputes.
"""

from __future__ import annotations

import dataclasses

import torch

from rlhfkit import algos
from rlhfkit.core.devices import HOST
from rlhfkit.rollout import Rollout


def response_positions(x: torch.Tensor, num_response: int) -> torch.Tensor:
    """The positions whose outputs belong to the R response tokens: L-R-1 .. L-2, i.e. [P-1 : P+R-1]
    (the output at position i predicts token i + 1; docs/pitfalls.md#off-by-one). x: (B, L, ...) -> (B, R, ...)."""
    L = x.shape[1]
    return x[:, L - num_response - 1 : L - 1]


def teacher_forced(model, ro: Rollout, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward over prompt + response: log pi(a_t | s_t) at temperature T and V(s_t) for every
    response token, 0 on padding. Returns (logp (B, R), values (B, R)), with gradients if enabled."""
    R = ro.response_ids.shape[1]
    logits, values = model(ro.input_ids, ro.attention_mask)  # (B, L, V), (B, L)
    logp = algos.logprobs_from_logits(response_positions(logits, R), ro.response_ids, temperature)  # (B, R)
    mask = ro.response_mask
    return logp * mask, response_positions(values, R).float() * mask


@torch.no_grad()
def collect(model, reference, ro: Rollout, temperature: float) -> Rollout:
    """Step 3: the old log-probs and values of the policy that sampled, and the reference's log-probs.
    No gradient: they are the fixed point the update measures its ratio and value clip against."""
    logprobs, values = teacher_forced(model, ro, temperature)
    ref_logprobs, _ = teacher_forced(reference, ro, temperature)
    return dataclasses.replace(ro, logprobs=logprobs, values=values, ref_logprobs=ref_logprobs)


def advantages(ro: Rollout, kl_coef: float, gamma: float, lam: float,
               whiten: bool = True) -> tuple[Rollout, dict[str, float]]:
    """Steps 4-5: per-token rewards -kl_coef * k1 with the score on the last valid token; GAE;
    returns = raw advantages + values; then the advantages whitened over the rollout's valid tokens.
    Returns (the rollout with rewards, advantages and returns, its metrics)."""
    mask = ro.response_mask
    rewards, _ = algos.shape_rewards(ro.scores, ro.logprobs, ro.ref_logprobs, mask, kl_coef)
    adv, returns = algos.gae(rewards, ro.values, mask, gamma, lam)
    ro = dataclasses.replace(ro, rewards=rewards, returns=returns,
                             advantages=algos.masked_whiten(adv, mask) if whiten else adv)
    return ro, {"rollout/kl": ((ro.logprobs - ro.ref_logprobs) * mask).sum(1).mean().item(),
                "rollout/return_mean": algos.masked_mean(returns, mask).item()}


def ppo_loss(model, mb: Rollout, temperature: float, clip_eps: float, value_clip_eps: float,
             vf_coef: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one mini-batch: clipped policy surrogate + vf_coef * clipped value loss, each a
    token mean over the mini-batch. Only `logp` and `values` carry gradients."""
    logp, values = teacher_forced(model, mb, temperature)  # recomputed, with gradients
    mask = mb.response_mask
    pl, pm = algos.ppo_policy_loss(logp, mb.logprobs, mb.advantages, mask, clip_eps)
    vl, vm = algos.ppo_value_loss(values, mb.values, mb.returns, mask, value_clip_eps)
    loss = pl + vf_coef * vl
    return loss, {"loss/policy": pl.item(), "loss/value": vl.item(), "loss/total": loss.item(),
                  "policy_clip_frac": pm["policy_clip_frac"], "approx_kl": pm["approx_kl"],
                  "value_clip_frac": vm["value_clip_frac"]}


def update(model, optimizer, ro: Rollout, *, temperature: float, epochs: int, mini_batch_size: int,
           clip_eps: float, value_clip_eps: float, vf_coef: float, max_grad_norm: float,
           generator: torch.Generator, scheduler=None) -> dict[str, float]:
    """Step 6: `epochs` passes over the rollout in a new random order each, one optimiser step per
    mini-batch; the gradient norm is clipped to max_grad_norm (and logged before). Returns the
    stats averaged over the optimiser steps."""
    B = ro.response_ids.shape[0]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    sums: dict[str, float] = {}
    steps = 0
    for _ in range(epochs):
        order = torch.randperm(B, generator=generator, device=generator.device)
        for start in range(0, B, mini_batch_size):
            mb = ro.select(order[start : start + mini_batch_size])
            loss, stats = ppo_loss(model, mb, temperature, clip_eps, value_clip_eps, vf_coef)
            optimizer.zero_grad()
            loss.backward()
            stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
    return {k: v / steps for k, v in sums.items()}


def ppo_iteration(model, reference, optimizer, ro: Rollout, *, temperature: float = 1.0, kl_coef: float = 0.03,
                  gamma: float = 1.0, lam: float = 1.0, epochs: int = 2, mini_batch_size: int = 8,
                  clip_eps: float = 0.2, value_clip_eps: float = 0.2, vf_coef: float = 0.1,
                  max_grad_norm: float = 1.0, generator: torch.Generator | None = None,
                  scheduler=None) -> tuple[Rollout, dict[str, float]]:
    """Steps 3-6 on a sampled and scored rollout, with `rlhfkit ppo`'s defaults. Returns (the rollout
    with its log-probs, values, rewards, advantages and returns, the iteration's metrics)."""
    ro = collect(model, reference, ro, temperature)
    ro, metrics = advantages(ro, kl_coef, gamma, lam)
    metrics.update(update(model, optimizer, ro, temperature=temperature, epochs=epochs,
                          mini_batch_size=mini_batch_size, clip_eps=clip_eps, value_clip_eps=value_clip_eps,
                          vf_coef=vf_coef, max_grad_norm=max_grad_norm,
                          generator=generator or torch.Generator(device=HOST).manual_seed(0), scheduler=scheduler))
    return ro, metrics
