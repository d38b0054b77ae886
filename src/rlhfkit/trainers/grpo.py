"""`rlhfkit grpo` and its family (rloo, gspo, dapo, reinforce_pp: presets in grpo_config.py): policy
optimisation from G sampled completions per prompt, without a value head.

One iteration, as numbered steps in `train`:
  1. rollout     rollout_batch_size / G prompts, each repeated G times in consecutive rows, sampled;
                 with `dynamic_sampling` (DAPO) further rounds until enough groups have a reward spread
  2. score       reward function -> one score per completion (+ DAPO's overlong punishment)
  3. advantages  per completion: GRPO (s - mean) / std of its group, RLOO s - mean(others), ReMax
                 s - s(greedy); the same value on every token of the completion. Groups whose
                 completions all got the same reward have advantage 0 everywhere and are left out of
                 steps 4-5 (`drop_zero_std_groups`, group and rloo); `overlong_filter` takes completions
                 cut at the length limit out of the loss
  4. log-probs   one teacher-forced pass: old log-probs (and reference log-probs with a KL term);
                 REINFORCE++ computes its advantages now (token returns with a KL penalty, batch-normalised)
  5. update      update_epochs x mini-batches x micro-batches of the clipped ratio loss, the ratio per
                 token or per sequence (GSPO), each token's loss times its truncated importance weight
                 (`tis_cap`), + beta * k3 (or k2) KL to the reference, aggregated by `loss_agg` with global normalisers
  6. log         PPO's metric names + rollout/group_reward_std and rollout/solved_fraction

With `env` set, step 1 runs multi-turn episodes (rollout/multiturn.py), step 2's score is each
episode's summed environment reward, and the loss covers the model's tokens only.

Rollout, update loop, metrics, run folder and checkpoint are PPO's (trainers/rl.py,
trainers/rl_update.py, runtime/run.py); steps 1-4 beyond one plain draw are in grpo_rollout.py.
Maths and the aggregation rule: docs/algorithms.md.
"""

from __future__ import annotations

import contextlib
import time

import torch

from rlhfkit.algos import (
    KL_ESTIMATORS,
    aggregate_loss,
    clipped_policy_loss,
    masked_mean,
    ppo_policy_loss,
    truncated_is_weights,
)
from rlhfkit.algos.registry import ADVANTAGE_ESTIMATORS, choose
from rlhfkit.core.config import config_main
from rlhfkit.core.precision import autocast
from rlhfkit.rollout import Rollout, forward_logprobs
from rlhfkit.runtime.offpolicy import OneStepOffPolicy
from rlhfkit.runtime.run import closes_its_runs
from rlhfkit.trainers.agents import agent_collect, agent_settings, use_agent
from rlhfkit.trainers.build import build_actor
from rlhfkit.trainers.grpo_config import (
    REINFORCE_PP,
    DAPOConfig,
    GRPOConfig,
    GSPOConfig,
    ReinforcePPConfig,
    RLOOConfig,
)
from rlhfkit.trainers.grpo_rollout import (
    dynamic_batch,
    filter_overlong,
    greedy_scores,
    keep_rows,
    reinforce_pp_advantages,
    shaped_rewards,
)
from rlhfkit.trainers.rl import RLRun
from rlhfkit.trainers.rl_update import RatioCheckError, policy_update_metrics, rollout_metrics, shuffled_rows

__all__ = ["RatioCheckError", "compute_advantages", "keep_rows", "micro_batch_loss", "train"]


def build_policy_model(cfg: GRPOConfig):
    """(ActorCritic without value head, Reference or None, tokenizer): no reference without a KL term."""
    return build_actor(cfg, with_reference=cfg.uses_reference)


# ----------------------------------------------------------------------------- advantages


def compute_advantages(rollout: Rollout, cfg: GRPOConfig, greedy: torch.Tensor | None = None) -> dict[str, float]:
    """Step 3, from the scores alone. Sequence rewards (score clip / no-stop penalty / overlong
    punishment; no KL: it is in the loss), then the baseline; rollout.advantages is (B, R), the
    completion's advantage on each of its tokens. `greedy` (B/G,): ReMax's greedy rewards.
    REINFORCE++ gets zeros here: its advantages need the log-prob pass (grpo_rollout.py)."""
    mask = rollout.response_mask
    rollout.rewards = shaped_rewards(rollout, cfg)
    seq_reward = (rollout.rewards * mask).sum(1)  # (B,)
    G = cfg.group_size
    estimator = choose(ADVANTAGE_ESTIMATORS, cfg.advantage, "advantage")  # algos/registry.py
    adv = estimator(seq_reward, G, greedy, cfg.scale_rewards)  # (B,)
    rollout.advantages = adv[:, None] * mask
    metrics = {"rollout/solved_fraction": (rollout.scores >= cfg.solved_threshold).float().mean().item(),
               "rollout/advantage_abs_mean": adv.abs().mean().item()}
    if G >= 2:
        std = seq_reward.view(-1, G).std(dim=1)  # unbiased, as in group_advantages
        metrics.update({"rollout/group_reward_std": std.mean().item(),
                        "rollout/zero_std_group_fraction": (std == 0).float().mean().item()})
    if greedy is not None:
        metrics["rollout/greedy_reward_mean"] = greedy.mean().item()
    return metrics


def informative_rows(rollout: Rollout, cfg: GRPOConfig, num_processes: int = 1) -> torch.Tensor:
    """Rows of groups whose rewards are not all equal (all rows unless drop_zero_std_groups with the
    group or rloo baseline; with several processes always all rows, so every process runs the same
    optimiser steps)."""
    B, G = rollout.scores.shape[0], cfg.group_size
    if cfg.agent:  # rows are not episodes; agent_collect left zero-spread groups out already
        return torch.arange(B, device=rollout.scores.device)
    if not cfg.drop_zero_std_groups or num_processes > 1 or cfg.advantage not in ("group", "rloo"):
        return torch.arange(B, device=rollout.scores.device)
    seq_reward = (rollout.rewards * rollout.response_mask).sum(1).view(-1, G)
    varied = (seq_reward != seq_reward[:, :1]).any(1)  # (B/G,)
    return varied.repeat_interleave(G).nonzero().squeeze(1)


# ----------------------------------------------------------------------------- update


def micro_batch_loss(model, mb: Rollout, cfg: GRPOConfig, n_tokens: float, n_seqs: float, device,
                     num_processes: int = 1):
    """Loss of one micro-batch: clipped ratio (per token, or per sequence for GSPO; times the
    truncated importance weights with `tis_cap`) + beta * KL (k3, or k2 with kl_loss_estimator), normalised by the
    global counts of
    the mini-batch (all processes), so the micro-batch losses and gradients add up to the mini-batch's."""
    mask = mb.response_mask.to(device)
    with autocast(cfg.dtype, device):
        logp, _, _ = forward_logprobs(model, mb, cfg.temperature, with_values=False)
    constant = cfg.loss_agg_constant or float(cfg.optimiser_batch * num_processes * cfg.max_new_tokens)
    agg = {"agg_mode": cfg.loss_agg, "num_tokens": n_tokens, "num_seqs": n_seqs, "constant": constant}
    old_lp = mb.logprobs.to(device)
    weights, stats = None, {}
    if cfg.tis_cap is not None:  # HF sampling is the trainer itself: no sampler log-probs, weight exactly 1
        stats = {"is_weight_mean": 1.0, "is_clip_frac": 0.0, "mismatch_kl": 0.0}
        if mb.sampler_logprobs is not None:
            weights, stats = truncated_is_weights(old_lp, mb.sampler_logprobs.to(device), mask, cfg.tis_cap,
                                                  tensor_metrics=True)
    if cfg.importance_level == "token" and weights is None:
        pl, pm = ppo_policy_loss(logp, old_lp, mb.advantages.to(device), mask, cfg.clip_eps,
                                 clip_eps_high=cfg.clip_eps_high, tensor_metrics=True, **agg)
    else:
        pl, pm = clipped_policy_loss(logp, old_lp, mb.advantages.to(device), mask, cfg.clip_eps,
                                     clip_eps_high=cfg.clip_eps_high, level=cfg.importance_level, weights=weights,
                                     tensor_metrics=True, **agg)
    loss = pl
    if cfg.beta > 0:
        per_token = choose(KL_ESTIMATORS, cfg.kl_loss_estimator, "KL estimator")(logp, mb.ref_logprobs.to(device))
        kl = aggregate_loss(per_token, mask, cfg.loss_agg, n_tokens, n_seqs, constant)
        loss = loss + cfg.beta * kl
        stats["loss/kl"] = kl.detach()
    ratio_dev = ((logp - old_lp).exp() - 1).abs().masked_fill(mask == 0, 0).max()
    # 0-d tensors (or constants), read on the host once per optimiser step (trainers/rl_update.py)
    stats.update({"loss/policy": pl.detach(), "loss/total": loss.detach(), "ratio_dev": ratio_dev.detach(), **pm})
    return loss, stats


# ----------------------------------------------------------------------------- loop


def collect(rl: RLRun, cfg: GRPOConfig, it: int, prefetch: OneStepOffPolicy | None = None,
            ) -> tuple[Rollout, Rollout, dict[str, float]]:
    """Steps 1-3: (the batch to train on, everything sampled, metrics). One draw of
    prompts_per_iteration groups, or dynamic sampling's rounds (grpo_rollout.dynamic_batch).
    `prefetch` (one_step_off_policy): the batch its sampler drew one update ago, or on-policy."""
    G = cfg.group_size
    if cfg.agent:  # the user's agent through the OpenAI-compatible server (trainers/agents.py)
        return agent_collect(rl, cfg, it)

    def draw(r: int) -> tuple[Rollout, dict[str, float]]:
        if prefetch is not None:  # one round only (the config refuses dynamic sampling)
            rollout, records = prefetch.batch(it)
        else:
            records = [rec for rec in rl.stream.next(cfg.prompts_per_iteration) for _ in range(G)]  # groups of G
            rollout = rl.sample(records, it, r)
        if cfg.advantage == "remax":
            return rollout, compute_advantages(rollout, cfg, greedy_scores(rl, cfg, records[::G]))
        return rollout, compute_advantages(rollout, cfg)

    if cfg.dynamic_sampling:
        return dynamic_batch(rl, cfg, draw)
    rollout, metrics = draw(0)
    return rollout, rollout, metrics


def update_on(rl: RLRun, cfg: GRPOConfig, batch: Rollout, rows: torch.Tensor, loss_fn,
              metrics: dict[str, float]) -> tuple[float, float]:
    """Steps 4-5 on rows `rows` of the batch; metrics go into `metrics`. Returns the times at which
    the log-prob pass and the update ended."""
    G = cfg.group_size
    used = keep_rows(batch, rows)
    if cfg.overlong_filter:
        metrics["rollout/overlong_filtered"] = filter_overlong(used)
    shuffle_group = G if rl.core.share_prompts else 1  # a group's rows meet in micro-batches
    perm = shuffled_rows(len(rows), rl.generator, shuffle_group, cfg.optimiser_batch)
    rl.logprob_pass(used, perm)  # step 4
    metrics["timing/logprobs_s"] = used.timings["timing/logprobs_s"]  # `used` is a copy of `batch`
    if cfg.advantage in REINFORCE_PP:  # all rows, in order (informative_rows): the log shows them
        metrics.update(reinforce_pp_advantages(used, cfg, rl.run.accelerator))
        batch.advantages = used.advantages
    t1 = time.time()
    m = rl.update(used, loss_fn, cfg.update_epochs, cfg.optimiser_batch, perm, shuffle_group)  # step 5
    t2 = time.time()
    metrics.update(policy_update_metrics(m))
    if "seq_ratio_mean" in m:
        metrics["params/seq_ratio_mean"] = m["seq_ratio_mean"]
    if cfg.tis_cap is not None:
        metrics.update({f"rollout/{k}": m[k] for k in ("is_weight_mean", "is_clip_frac", "mismatch_kl")})
    metrics["rollout/entropy"] = masked_mean(used.entropy, used.response_mask).item()
    if cfg.beta > 0:
        metrics["loss/kl"] = m["loss/kl"]
    if used.ref_logprobs is not None:
        metrics["rollout/kl"] = ((used.logprobs - used.ref_logprobs) * used.response_mask).sum(1).mean().item()
    return t1, t2


def command_name(cfg: GRPOConfig) -> str:
    """The command a run is named after: the preset's (gspo, dapo, reinforce_pp), else rloo or grpo."""
    return getattr(type(cfg), "command", None) or ("rloo" if cfg.advantage == "rloo" else "grpo")


@closes_its_runs
def train(cfg: GRPOConfig) -> dict:
    """Run GRPO or a variant (see the module docstring); returns the summary (also RUN/summary.json)."""
    agent = agent_settings(cfg) if cfg.agent else None  # imported before anything is written
    rl = RLRun(cfg, command_name(cfg), build_policy_model)
    if agent is not None:
        use_agent(rl, cfg, agent)

    def loss_fn(mb: Rollout, n_tokens: float, n_seqs: float):
        return micro_batch_loss(rl.model, mb, cfg, n_tokens, n_seqs, rl.run.device, rl.run.world)

    prefetch = OneStepOffPolicy(rl, cfg) if cfg.one_step_off_policy else None
    # when resuming: weights, optimiser, data position, RNG, ... from the checkpoint
    rl.run.resume(**({"one_step_off_policy": prefetch} if prefetch else {}))
    with rl.evaluating(), prefetch or contextlib.nullcontext():  # held-out reward before and after
        for it in rl.run.steps():  # checkpoints when due; SIGINT/SIGTERM: checkpoint and stop
            t0 = time.time()
            batch, sampled, metrics = collect(rl, cfg, it, prefetch)  # steps 1-3 (+ start sampling batch it+1)
            metrics.update(rollout_metrics(sampled))
            rows = informative_rows(batch, cfg, rl.run.world)
            metrics["rollout/update_fraction"] = len(rows) / len(sampled.scores)
            t1 = t2 = time.time()
            if len(rows):
                t1, t2 = update_on(rl, cfg, batch, rows, loss_fn, metrics)  # steps 4-5
            if prefetch is not None:  # wait for batch it+1, then the sampler takes the updated weights
                lag, wait_s, pass_s = prefetch.after_update()
                metrics.update({"rollout/policy_lag": float(lag), "timing/sampler_wait_s": wait_s,
                                "timing/sampler_logprobs_s": pass_s})
            metrics["params/beta"] = cfg.beta
            extra = {}
            if sampled is batch or cfg.advantage not in REINFORCE_PP:  # else the sampled rows have none
                adv = sampled.advantages.sum(1) / sampled.response_mask.sum(1).clamp(min=1)
                extra["advantage"] = adv.tolist()
            rl.log(it, sampled, metrics, (t0, t1, t2), extra)  # step 6
    exact = cfg.env in ("arithmetic-tool", "self-correct") if cfg.env else cfg.reward == "arithmetic" and not cfg.agent
    if exact and "eval_after" in rl.run.summary:  # exact match: mean reward = accuracy
        b, a = rl.run.summary["eval_before"], rl.run.summary["eval_after"]
        rl.run.print(f"[eval] held-out accuracy (T={cfg.temperature}): {b['mean']:.1%} before -> "
                     f"{a['mean']:.1%} after (n={a['n']})")
    return rl.finish()


def main(argv: list[str]) -> int:
    return config_main(GRPOConfig, train, argv, "rlhfkit grpo")


def rloo_main(argv: list[str]) -> int:
    return config_main(RLOOConfig, train, argv, "rlhfkit rloo")


def gspo_main(argv: list[str]) -> int:
    return config_main(GSPOConfig, train, argv, "rlhfkit gspo")


def dapo_main(argv: list[str]) -> int:
    return config_main(DAPOConfig, train, argv, "rlhfkit dapo")


def reinforce_pp_main(argv: list[str]) -> int:
    return config_main(ReinforcePPConfig, train, argv, "rlhfkit reinforce_pp")
