"""`rlhfkit grpo` and `rlhfkit rloo`: group-relative policy optimisation without a value head.

One iteration, as numbered steps in `train`:
  1. rollout     rollout_batch_size / G prompts, each repeated G times in consecutive rows, sampled
  2. score       reward function -> one score per completion
  3. advantages  per completion, from its group: GRPO (s - mean) / std, or RLOO s - mean(others);
                 the same value on every token of the completion. Groups whose completions all got
                 the same reward have advantage 0 everywhere and are left out of steps 4-5
                 (`drop_zero_std_groups`; DAPO's dynamic sampling without re-sampling)
  4. log-probs   one teacher-forced pass: old log-probs (and reference log-probs when beta > 0)
  5. update      update_epochs x mini-batches x micro-batches of the clipped ratio loss
                 (+ beta * k3 KL to the reference), aggregated by `loss_agg` with global normalisers
  6. log         PPO's metric names + rollout/group_reward_std and rollout/solved_fraction

Rollout, update loop, metrics, run folder and checkpoint are PPO's (trainers/rl.py,
trainers/rl_update.py, runtime/run.py).
Maths and the aggregation rule: docs/algorithms.md.
"""

from __future__ import annotations

import time

import torch

from rlhfkit.algos import (
    aggregate_loss,
    group_advantages,
    kl_k3,
    leave_one_out_advantages,
    masked_mean,
    ppo_policy_loss,
    shape_rewards,
)
from rlhfkit.rollout import Rollout, forward_logprobs
from rlhfkit.runtime.config import config_main
from rlhfkit.runtime.precision import autocast
from rlhfkit.trainers.build import build_actor
from rlhfkit.trainers.grpo_config import GRPOConfig, RLOOConfig
from rlhfkit.trainers.rl import RLRun
from rlhfkit.trainers.rl_update import RatioCheckError, policy_update_metrics, rollout_metrics, shuffled_rows

__all__ = ["RatioCheckError", "compute_advantages", "micro_batch_loss", "train"]


def build_policy_model(cfg: GRPOConfig):
    """(ActorCritic without value head, Reference or None, tokenizer): no reference when beta = 0."""
    return build_actor(cfg, with_reference=cfg.beta > 0)


# ----------------------------------------------------------------------------- advantages


def compute_advantages(rollout: Rollout, cfg: GRPOConfig) -> dict[str, float]:
    """Step 3, from the scores alone. Sequence rewards (score clip / no-stop penalty; no KL: it is
    in the loss), then the group baseline; rollout.advantages is (B, R), the completion's
    advantage on each of its tokens."""
    mask = rollout.response_mask
    zeros = torch.zeros_like(mask)
    rollout.rewards, _ = shape_rewards(rollout.scores, zeros, zeros, mask, 0.0, stopped=rollout.stopped,
                                       no_stop_penalty=cfg.no_stop_penalty, score_clip=cfg.score_clip)
    seq_reward = (rollout.rewards * mask).sum(1)  # (B,)
    G = cfg.group_size
    if cfg.advantage == "rloo":
        adv = leave_one_out_advantages(seq_reward, G)
    else:
        adv = group_advantages(seq_reward, G, scale_by_std=cfg.scale_rewards)
    rollout.advantages = adv[:, None] * mask
    std = seq_reward.view(-1, G).std(dim=1)  # unbiased, as in group_advantages
    return {
        "rollout/group_reward_std": std.mean().item(),
        "rollout/zero_std_group_fraction": (std == 0).float().mean().item(),
        "rollout/solved_fraction": (rollout.scores >= cfg.solved_threshold).float().mean().item(),
        "rollout/advantage_abs_mean": adv.abs().mean().item(),
    }


def informative_rows(rollout: Rollout, cfg: GRPOConfig, num_processes: int = 1) -> torch.Tensor:
    """Rows of groups whose rewards are not all equal (all rows unless drop_zero_std_groups; with
    several processes always all rows, so every process runs the same optimiser steps)."""
    B, G = rollout.scores.shape[0], cfg.group_size
    if not cfg.drop_zero_std_groups or num_processes > 1:
        return torch.arange(B)
    seq_reward = (rollout.rewards * rollout.response_mask).sum(1).view(-1, G)
    varied = (seq_reward != seq_reward[:, :1]).any(1)  # (B/G,)
    return varied.repeat_interleave(G).nonzero().squeeze(1)


def keep_rows(rollout: Rollout, rows: torch.Tensor) -> Rollout:
    """Rows `rows` of a rollout, texts and reward info included."""
    out = rollout.select(rows)
    idx = rows.tolist()
    out.prompts = [rollout.prompts[i] for i in idx]
    out.completions = [rollout.completions[i] for i in idx]
    out.info = {k: [v[i] for i in idx] for k, v in rollout.info.items()}
    return out


# ----------------------------------------------------------------------------- update


def micro_batch_loss(model, mb: Rollout, cfg: GRPOConfig, n_tokens: float, n_seqs: float, device,
                     num_processes: int = 1):
    """Loss of one micro-batch: clipped ratio (+ beta * k3 KL), normalised by the global counts of
    the mini-batch (all processes), so the micro-batch losses and gradients add up to the mini-batch's."""
    mask = mb.response_mask.to(device)
    with autocast(cfg.dtype, device):
        logp, _, _ = forward_logprobs(model, mb, cfg.temperature, with_values=False)
    constant = cfg.loss_agg_constant or float(cfg.optimiser_batch * num_processes * cfg.max_new_tokens)
    agg = {"agg_mode": cfg.loss_agg, "num_tokens": n_tokens, "num_seqs": n_seqs, "constant": constant}
    old_lp = mb.logprobs.to(device)
    pl, pm = ppo_policy_loss(logp, old_lp, mb.advantages.to(device), mask, cfg.clip_eps,
                             clip_eps_high=cfg.clip_eps_high, **agg)
    loss, stats = pl, {}
    if cfg.beta > 0:
        kl = aggregate_loss(kl_k3(logp, mb.ref_logprobs.to(device)), mask, cfg.loss_agg, n_tokens, n_seqs, constant)
        loss = loss + cfg.beta * kl
        stats["loss/kl"] = kl.item()
    ratio_dev = ((logp - old_lp).exp() - 1).abs().masked_fill(mask == 0, 0).max().item()
    stats.update({"loss/policy": pl.item(), "loss/total": loss.item(), "ratio_dev": ratio_dev, **pm})
    return loss, stats


# ----------------------------------------------------------------------------- loop


def train(cfg: GRPOConfig) -> dict:
    """Run GRPO (or RLOO, cfg.advantage == "rloo"); returns the summary (also RUN/summary.json)."""
    rl = RLRun(cfg, "rloo" if cfg.advantage == "rloo" else "grpo", build_policy_model)
    G = cfg.group_size

    def loss_fn(mb: Rollout, n_tokens: float, n_seqs: float):
        return micro_batch_loss(rl.model, mb, cfg, n_tokens, n_seqs, rl.run.device, rl.run.world)

    rl.run.resume()  # when resuming: weights, optimiser, data position, RNG, ... from the checkpoint
    with rl.evaluating():  # held-out reward before and after
        for it in rl.run.steps():  # checkpoints when due; SIGINT/SIGTERM: checkpoint and stop
            t0 = time.time()
            records = [r for r in rl.stream.next(cfg.prompts_per_iteration) for _ in range(G)]  # groups of G rows
            rollout = rl.sample(records, it)  # steps 1-2
            metrics = compute_advantages(rollout, cfg)  # step 3
            metrics.update(rollout_metrics(rollout))
            rows = informative_rows(rollout, cfg, rl.run.world)
            metrics["rollout/update_fraction"] = len(rows) / len(records)
            t1 = t2 = time.time()
            if len(rows):
                used = keep_rows(rollout, rows)
                shuffle_group = G if rl.core.share_prompts else 1  # a group's rows meet in micro-batches
                perm = shuffled_rows(len(rows), rl.generator, shuffle_group, cfg.optimiser_batch)
                rl.logprob_pass(used, perm)  # step 4
                metrics["timing/logprobs_s"] = used.timings["timing/logprobs_s"]  # `used` is a copy of `rollout`
                t1 = time.time()
                m = rl.update(used, loss_fn, cfg.update_epochs, cfg.optimiser_batch, perm, shuffle_group)  # step 5
                t2 = time.time()
                metrics.update(policy_update_metrics(m))
                metrics["rollout/entropy"] = masked_mean(used.entropy, used.response_mask).item()
                if used.ref_logprobs is not None:
                    metrics["loss/kl"] = m["loss/kl"]
                    metrics["rollout/kl"] = ((used.logprobs - used.ref_logprobs) * used.response_mask).sum(1).mean().item()
            metrics["params/beta"] = cfg.beta
            adv = rollout.advantages.sum(1) / rollout.response_mask.sum(1).clamp(min=1)
            rl.log(it, rollout, metrics, (t0, t1, t2), {"advantage": adv.tolist()})  # step 6
    if cfg.reward == "arithmetic" and "eval_after" in rl.run.summary:  # exact match: mean reward = accuracy
        b, a = rl.run.summary["eval_before"], rl.run.summary["eval_after"]
        rl.run.print(f"[eval] held-out accuracy (T={cfg.temperature}): {b['mean']:.1%} before -> "
                     f"{a['mean']:.1%} after (n={a['n']})")
    return rl.finish()


def main(argv: list[str]) -> int:
    return config_main(GRPOConfig, train, argv, "rlhfkit grpo")


def rloo_main(argv: list[str]) -> int:
    return config_main(RLOOConfig, train, argv, "rlhfkit rloo")
