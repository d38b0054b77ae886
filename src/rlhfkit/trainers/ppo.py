"""`rlhfkit ppo`: PPO with GAE and a value head for causal LMs.

One iteration, as numbered steps in `train`:
  1. rollout   sample responses to a batch of prompts (left-padded, KV-cached generate)
  2. score     reward function/model -> one score per sequence
  3. log-probs one teacher-forced pass: old log-probs, values, reference log-probs
  4. shape     per-token reward = -beta * KL_t, score added on the last valid token (with an env:
               each turn's reward on that turn's last model token, rollout/multiturn.py)
  5. GAE       advantages and returns = advantages + values, then whiten advantages
  6. update    ppo_epochs x shuffled mini-batches x micro-batches (gradient accumulation)
  7. log       metrics.jsonl, samples.jsonl, diagnostics

Set-up, checkpoints, the held-out evaluation and the final save are the run harness's
(runtime/run.py, trainers/rl.py); the update loop (epochs x mini-batches x micro-batches, one
optimiser step per mini-batch) is trainers/rl_update.py `update_policy`, which calls
`micro_batch_loss` for each micro-batch.
"""

from __future__ import annotations

import functools
import time

import torch

from rlhfkit.algos import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    aggregate_loss,
    entropy_loss,
    ppo_policy_loss,
    ppo_value_loss,
)
from rlhfkit.algos.registry import choose
from rlhfkit.core.precision import autocast
from rlhfkit.rollout import Rollout, forward_logprobs
from rlhfkit.trainers.advantages import compute_advantages
from rlhfkit.trainers.agents import agent_sample, agent_settings, use_agent
from rlhfkit.trainers.build import build_actor_critic
from rlhfkit.trainers.ppo_config import PPOConfig
from rlhfkit.trainers.rl import RLRun
from rlhfkit.trainers.rl_update import RatioCheckError, policy_update_metrics, rollout_metrics

__all__ = ["RatioCheckError", "compute_advantages", "micro_batch_loss", "train"]


# ----------------------------------------------------------------------------- update


def micro_batch_loss(actor, mb: Rollout, cfg: PPOConfig, kl_coef: float, n_tokens: float, device,
                     n_seqs: float | None = None):
    """Loss of one micro-batch, normalised by the mini-batch token (or sequence) count of all
    processes (docs/pitfalls.md#loss-aggregation), and its stats as 0-d tensors (no host read)."""
    mask = mb.response_mask.to(device)
    with autocast(cfg.dtype, device):
        logp, values, ent = forward_logprobs(actor, mb, cfg.temperature, with_values=True, with_entropy=True,
                                             entropy_grad=cfg.ent_coef != 0)  # else a metric only
    agg = {"agg_mode": cfg.loss_agg, "num_tokens": n_tokens, "num_seqs": n_seqs or cfg.mini_batch_size}
    old_lp = mb.logprobs.to(device)
    pl, pm = ppo_policy_loss(logp, old_lp, mb.advantages.to(device), mask, cfg.clip_eps, tensor_metrics=True, **agg)
    vl, vm = ppo_value_loss(values, mb.values.to(device), mb.returns.to(device), mask, cfg.value_clip_eps,
                            tensor_metrics=True, **agg)
    ent_term = entropy_loss(ent, mask, **agg)
    loss = pl + cfg.vf_coef * vl - cfg.ent_coef * ent_term
    if cfg.kl_penalty == "loss" and mb.ref_logprobs is not None:
        kl = choose(KL_ESTIMATORS, cfg.kl_loss_estimator, "KL estimator")(logp, mb.ref_logprobs.to(device))
        loss = loss + kl_coef * aggregate_loss(kl, mask, **agg)
    ratio_dev = ((logp - old_lp).exp() - 1).abs().masked_fill(mask == 0, 0).max()
    # 0-d tensors, read on the host once per optimiser step (trainers/rl_update.py)
    stats = {"loss/policy": pl.detach(), "loss/value": vl.detach(), "loss/entropy": ent_term.detach(),
             "loss/total": loss.detach(), "ratio_dev": ratio_dev.detach(), **pm, **vm}
    return loss, stats


def update_metrics(m: dict[str, float]) -> dict[str, float]:
    """Step 6's metrics from the update's stats averaged over optimiser steps (trainers/rl_update.py)."""
    return {**policy_update_metrics(m), "loss/value": m["loss/value"], "loss/entropy": m["loss/entropy"],
            "params/value_clip_frac": m["value_clip_frac"]}


# ----------------------------------------------------------------------------- loop


def train(cfg: PPOConfig) -> dict:
    """Run PPO; returns the summary (also written to RUN/summary.json)."""
    agent = agent_settings(cfg) if cfg.agent else None  # imported before anything is written
    with RLRun(cfg, "ppo", build_actor_critic) as rl:
        if agent is not None:  # episodes of the user's OpenAI-client agent (trainers/agents.py)
            use_agent(rl, cfg, agent)
        kl_ctl = (AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon) if cfg.adaptive_kl
                  else FixedKLController(cfg.kl_coef))
        rl.resume(kl_ctl=kl_ctl)  # when resuming: weights, optimiser, data position, RNG, ... from the checkpoint
        with rl.evaluating():  # held-out reward before and after
            for it in rl.steps():  # checkpoints when due; SIGINT/SIGTERM: checkpoint and stop
                t0 = time.time()
                # 1-2. sample responses to the next prompts (or the agent's episodes) and score them
                records = rl.stream.next(cfg.rollout_batch_size)
                rollout = agent_sample(rl, cfg, records, it) if agent is not None else rl.sample(records, it)
                # 3. log-probs, values, reference log-probs, in the micro-batches of the first update epoch
                rows = rollout.response_ids.shape[0]  # an agent's episodes may give more rows than records
                perm = torch.randperm(rows, generator=rl.generator, device=rl.generator.device)
                rollout = rl.logprob_pass(rollout, perm)
                # 4-5. shaped rewards, GAE, whitened advantages
                rollout, metrics = compute_advantages(rollout, cfg, kl_ctl.value, rl.accelerator)
                t1 = time.time()
                # 6. ppo_epochs x shuffled mini-batches x micro-batches
                loss_fn = functools.partial(micro_batch_loss, rl.model, cfg=cfg, kl_coef=kl_ctl.value, device=rl.device)
                metrics.update(update_metrics(rl.update(rollout, loss_fn, cfg.ppo_epochs, cfg.mini_batch_size, perm)))
                t2 = time.time()
                # 7. log (averaged over processes), then adapt the KL coefficient to the logged KL
                metrics.update({**rollout_metrics(rollout), "params/kl_coef": kl_ctl.value})
                logged = rl.log_iteration(it, rollout, metrics, (t0, t1, t2))
                kl_ctl.update(logged["rollout/kl"], cfg.rollout_batch_size * rl.world)
        return rl.finish()
