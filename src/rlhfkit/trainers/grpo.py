"""`rlhfkit grpo` and its family (rloo, gspo, dapo, reinforce_pp: presets in grpo_config.py): policy
optimisation from G sampled completions per prompt, without a value head.

One iteration, as numbered steps in `train` (each returns a new value; the variants are functions
looked up once by name in trainers/grpo_variants.py and trainers/grpo_sources.py, called at their phase):
  1. sample      a rollout source (ROLLOUT_SOURCES) draws rollout_batch_size / G prompts, each repeated G
                 times in consecutive rows; with `dynamic_sampling` (DAPO) further rounds until enough
                 groups have a reward spread
  2. score       reward function -> one score per completion, shaped (score clip, no-stop penalty,
                 DAPO's overlong punishment)
  3. advantages  estimators of phase SCORES (ADVANTAGES): GRPO (s - mean) / std of its group, RLOO
                 s - mean(others), ReMax s - s(greedy); the same value on every token of the completion.
                 Groups whose completions all got the same reward have advantage 0 everywhere and are left
                 out of steps 4-6 (`drop_zero_std_groups`); `overlong_filter` takes completions cut at the
                 length limit out of the loss
  4. log-probs   one teacher-forced pass: old log-probs (and reference log-probs with a KL term); none
                 when the update is exactly on-policy (`needs_logprob_pass`): the update's own, detached
  5. advantages  estimators of phase LOGPROBS: REINFORCE++ (token returns with a KL penalty,
                 batch-normalised); then each active loss term's inputs
  6. update      update_epochs x mini-batches x micro-batches of the policy loss of `importance_level`
                 (POLICY_LOSSES: clipped ratio per token or per sequence (GSPO), each token's loss times
                 its truncated importance weight with `tis_cap`) + each active LOSS_TERMS term (beta x
                 k3 or k2 KL to the reference), aggregated by `loss_agg` with global normalisers
  7. log         PPO's metric names + rollout/group_reward_std and rollout/solved_fraction

With `env` set, step 1 runs multi-turn episodes (rollout/multiturn.py), step 2's score is each
episode's summed environment reward, and the loss covers the model's tokens only. With `agent` set,
step 1 is the user's agent's episodes through the OpenAI-compatible server (the "agent" rollout
source, trainers/agents.py): an episode gives one or more rows (or none when it failed), each row's
`info["episode"]` names it, and step 3 takes the baseline over each group's episodes
(grpo_rollout.completion_groups).

The run harness, log-prob pass, update loop and log are PPO's (trainers/rl.py, trainers/rl_update.py,
runtime/run.py); dynamic sampling, overlong shaping and ReMax's greedy draw are in grpo_rollout.py.
Maths and the aggregation rule: docs/algorithms.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time

import torch

from rlhfkit.algos import masked_mean
from rlhfkit.algos.registry import choose
from rlhfkit.core.precision import autocast
from rlhfkit.rollout import Rollout, forward_logprobs
from rlhfkit.runtime.distributed import max_over_processes
from rlhfkit.trainers.build import build_actor
from rlhfkit.trainers.grpo_config import GRPOConfig
from rlhfkit.trainers.grpo_rollout import (
    completion_groups,
    dynamic_batch,
    filter_overlong,
    greedy_scores,
    group_std,
    keep_rows,
    shaped_rewards,
    varied_rows,
)
from rlhfkit.trainers.grpo_sources import prepare_source
from rlhfkit.trainers.grpo_variants import (
    ADVANTAGES,
    LOGPROBS,
    POLICY_LOSSES,
    SCORES,
    Advantage,
    AdvantageInputs,
    LossInputs,
    LossTerm,
    active_terms,
    advantages_at,
)
from rlhfkit.trainers.rl import RLRun
from rlhfkit.trainers.rl_update import RatioCheckError, policy_update_metrics, rollout_metrics, shuffled_rows
from rlhfkit.trainers.rollout_source import RolloutSource

__all__ = ["RatioCheckError", "compute_advantages", "keep_rows", "micro_batch_loss", "train"]


def build_policy_model(cfg: GRPOConfig):
    """(ActorCritic without value head, Reference or None, tokenizer): no reference without a KL term."""
    return build_actor(cfg, with_reference=cfg.uses_reference)


# ----------------------------------------------------------------------------- advantages


def group_metrics(rollout: Rollout, cfg: GRPOConfig) -> dict[str, float]:
    """The share of solved completions and, with G >= 2, the spread of rewards within groups."""
    metrics = {"rollout/solved_fraction": (rollout.scores >= cfg.solved_threshold).float().mean().item()}
    if cfg.group_size >= 2:
        seq_reward = (rollout.rewards * rollout.response_mask).sum(1)
        first, group = completion_groups(rollout, cfg.group_size)  # rows, or agent episodes
        std = group_std(seq_reward[first], group, cfg.group_size)  # unbiased, as in group_advantages
        metrics.update({"rollout/group_reward_std": std.mean().item(),
                        "rollout/zero_std_group_fraction": (std == 0).float().mean().item()})
    return metrics


def compute_advantages(rollout: Rollout, cfg: GRPOConfig, greedy=None, advantage: Advantage | None = None,
                       ) -> tuple[Rollout, dict[str, float]]:
    """Steps 2-3, from the scores alone: (the rollout with its shaped sequence rewards (B, R: score
    clip / no-stop penalty / overlong punishment on the last token; no KL: it is in the loss) and,
    for an estimator of the SCORES phase, its advantages (B, R), else zeros; metrics).
    `greedy`: ReMax's greedy rewards (B/G,), or a function that samples them when asked."""
    advantage = advantage or choose(ADVANTAGES, cfg.advantage, "advantage")
    rollout = dataclasses.replace(rollout, rewards=shaped_rewards(rollout, cfg))
    inputs = AdvantageInputs(rollout, cfg, greedy if callable(greedy) else lambda: greedy)
    advantages, metrics = advantages_at(SCORES, advantage, inputs)
    return dataclasses.replace(rollout, advantages=advantages), {**group_metrics(rollout, cfg), **metrics}


def informative_rows(rollout: Rollout, cfg: GRPOConfig, advantage: Advantage, num_processes: int = 1) -> torch.Tensor:
    """Rows of groups whose rewards are not all equal (all rows unless drop_zero_std_groups with an
    estimator that gives such groups advantage 0 and no distillation term; with several processes always all rows, so every
    process runs the same optimiser steps)."""
    B = rollout.scores.shape[0]
    distilling = cfg.distill_coef > 0  # a teacher's term has a signal in every group
    if not cfg.drop_zero_std_groups or distilling or num_processes > 1 or not advantage.zero_on_flat_groups:
        return torch.arange(B, device=rollout.scores.device)
    return varied_rows(rollout, (rollout.rewards * rollout.response_mask).sum(1), cfg.group_size)


# ----------------------------------------------------------------------------- update


def micro_batch_loss(model, mb: Rollout, cfg: GRPOConfig, n_tokens: float, n_seqs: float, device,
                     num_processes: int = 1, terms: dict[str, LossTerm] | None = None):
    """Loss of one micro-batch: the policy loss of `importance_level` (POLICY_LOSSES: clipped ratio per
    token or per sequence, times the truncated importance weights with `tis_cap`) + each active
    term's coef x loss (LOSS_TERMS: beta x KL, ...), normalised by the global counts of the
    mini-batch (all processes), so the micro-batch losses and gradients add up to the mini-batch's.
    Rows without old log-probs (step 4 skipped: an exactly on-policy update) take this forward's,
    detached (the ratio is exactly 1), and log its entropy."""
    mb = mb.to(device)
    on_policy = mb.logprobs is None
    with autocast(cfg.dtype, device):
        logp, _, ent = forward_logprobs(model, mb, cfg.temperature, with_values=False, with_entropy=on_policy,
                                        entropy_grad=False)
    if on_policy:
        mb = dataclasses.replace(mb, logprobs=logp.detach())
    constant = cfg.loss_agg_constant or float(cfg.optimiser_batch * num_processes * cfg.max_new_tokens)
    agg = {"agg_mode": cfg.loss_agg, "num_tokens": n_tokens, "num_seqs": n_seqs, "constant": constant}
    x = LossInputs(logp, mb, mb.response_mask, agg, cfg)
    policy_loss, stats = choose(POLICY_LOSSES, cfg.importance_level, "importance level")(x)
    loss = policy_loss
    for name, term in (active_terms(cfg) if terms is None else terms).items():
        value, term_stats = term.fn(x)
        loss = loss + term.coef(cfg) * value
        stats.update({**term_stats, f"loss/{name}": value.detach()})
    ratio_dev = ((logp - mb.logprobs).exp() - 1).abs().masked_fill(mb.response_mask == 0, 0).max()
    # 0-d tensors (or constants), read on the host once per optimiser step (trainers/rl_update.py)
    stats.update({"loss/policy": policy_loss.detach(), "loss/total": loss.detach(), "ratio_dev": ratio_dev.detach()})
    if on_policy:
        stats["entropy"] = masked_mean(ent, mb.response_mask).detach()
    return loss, stats


def update_metrics(m: dict[str, float], used: Rollout, cfg: GRPOConfig, terms: dict[str, LossTerm]) -> dict[str, float]:
    """Step 7's update metrics from the update's averaged stats `m` and the rows it trained on."""
    metrics = policy_update_metrics(m)
    if "seq_ratio_mean" in m:
        metrics["params/seq_ratio_mean"] = m["seq_ratio_mean"]
    metrics.update({f"rollout/{k}": m[k] for k in ("is_weight_mean", "is_clip_frac", "mismatch_kl") if k in m})
    metrics["rollout/entropy"] = (masked_mean(used.entropy, used.response_mask).item() if used.entropy is not None
                                  else m["entropy"])  # from the update's forward when step 4 was skipped
    metrics.update({f"loss/{name}": m[f"loss/{name}"] for name in terms})
    metrics.update({k: v for k, v in m.items() if k.startswith("distill/")})  # the distillation term's own
    if used.ref_logprobs is not None:
        metrics["rollout/kl"] = ((used.logprobs - used.ref_logprobs) * used.response_mask).sum(1).mean().item()
    return metrics


# ----------------------------------------------------------------------------- loop


def collect(rl: RLRun, cfg: GRPOConfig, it: int, source: RolloutSource, advantage: Advantage,
            ) -> tuple[Rollout, Rollout, dict[str, float]]:
    """Steps 1-3: (the batch to train on, everything sampled, metrics). One draw of
    prompts_per_iteration groups from the rollout source, or dynamic sampling's rounds
    (grpo_rollout.dynamic_batch)."""

    def draw(r: int) -> tuple[Rollout, dict[str, float]]:
        rollout, records = source.draw(it, r)  # 1. sample (and score)
        greedy = lambda: greedy_scores(rl, cfg, records[:: cfg.group_size])  # noqa: E731 (ReMax asks for it)
        return compute_advantages(rollout, cfg, greedy, advantage)  # 2-3. shaped rewards, advantages

    if cfg.dynamic_sampling:
        return dynamic_batch(rl, cfg, draw)
    rollout, metrics = draw(0)
    return rollout, rollout, metrics


def needs_logprob_pass(rl: RLRun, cfg: GRPOConfig, advantage: Advantage, used: Rollout) -> bool:
    """Whether step 4 has work for the rows `used`. It has none when the update is exactly on-policy
    and nothing else reads the pass: the rows were sampled by the policy as it is now (no
    `sampler_logprobs`: not vLLM's, not a one-step-off-policy batch), they get one optimiser step
    (update_epochs 1, every process's rows in one mini-batch), no reference (beta 0, no KL in the
    reward), no importance weights (tis_cap unset) and an advantage of phase SCORES. The old log-probs
    are then the update's own, detached (micro_batch_loss), as TRL does with num_iterations=1. The
    same answer on every process (a sharded pass is collective): what varies with a process's rows,
    their count and who sampled them, is decided over all processes."""
    if cfg.update_epochs != 1 or cfg.uses_reference or cfg.tis_cap is not None or advantage.phase != SCORES:
        return True
    rows = used.response_ids.shape[0] if used.sampler_logprobs is None else math.inf
    return max_over_processes(rl.accelerator, rows) > cfg.optimiser_batch


def update_on(rl: RLRun, cfg: GRPOConfig, batch: Rollout, rows: torch.Tensor, advantage: Advantage,
              terms: dict[str, LossTerm], term_inputs: list) -> tuple[Rollout, dict[str, float], float]:
    """Steps 4-6 on rows `rows` of the batch: (the rows as trained on, with their advantages; metrics;
    the time the log-prob pass and step 5 ended). `term_inputs`: the active loss terms' step-5 functions."""
    G = cfg.group_size
    used, metrics = keep_rows(batch, rows), {}
    if cfg.overlong_filter:
        used, metrics["rollout/overlong_filtered"] = filter_overlong(used)
    shuffle_group = G if rl.core.share_prompts else 1  # a group's rows meet in micro-batches
    perm = shuffled_rows(len(rows), rl.generator, shuffle_group, cfg.optimiser_batch)
    if needs_logprob_pass(rl, cfg, advantage, used):
        used = rl.logprob_pass(used, perm)  # 4. old (and reference) log-probs
    metrics["timing/logprobs_s"] = used.timings.get("timing/logprobs_s", 0.0)
    inputs = AdvantageInputs(used, cfg, lambda: None, rl.accelerator)
    advantages, adv_metrics = advantages_at(LOGPROBS, advantage, inputs)  # 5. advantages that need the log-probs
    used = dataclasses.replace(used, advantages=advantages)
    metrics.update(adv_metrics)
    for add_inputs in term_inputs:  # e.g. a teacher's log-probs of the sampled tokens
        used = add_inputs(used, perm)
    t1 = time.time()
    loss_fn = functools.partial(micro_batch_loss, rl.model, cfg=cfg, device=rl.device, num_processes=rl.world,
                                terms=terms)
    m = rl.update(used, loss_fn, cfg.update_epochs, cfg.optimiser_batch, perm, shuffle_group)  # 6. update
    return used, {**metrics, **update_metrics(m, used, cfg, terms)}, t1


def command_name(cfg: GRPOConfig) -> str:
    """The command a run is named after: the preset's (gspo, dapo, reinforce_pp), else rloo or grpo."""
    return getattr(type(cfg), "command", None) or ("rloo" if cfg.advantage == "rloo" else "grpo")


def accuracy_line(rl: RLRun, cfg: GRPOConfig) -> str | None:
    """The held-out accuracy before -> after when the reward (or env) is an exact match (it says so:
    `exact_match`), so its mean is an accuracy; None otherwise or without an evaluation."""
    judge = rl.make_env if rl.make_env is not None else rl.reward_fn
    own_evaluator = rl.evaluator is not None  # e.g. an agent's rewards, not the reward function's
    if own_evaluator or not getattr(judge, "exact_match", False) or "eval_after" not in rl.summary:
        return None
    b, a = rl.summary["eval_before"], rl.summary["eval_after"]
    held = "held-out" if rl.eval_from == "held-out" else "training-prompt"
    return (f"[eval] {held} accuracy (T={cfg.temperature}): {b['mean']:.1%} before -> "
            f"{a['mean']:.1%} after (n={a['n']})")


def train(cfg: GRPOConfig) -> dict:
    """Run GRPO or a variant (see the module docstring); returns the summary (also RUN/summary.json)."""
    make_source = prepare_source(cfg)  # before the run folder exists: a source that cannot start stops here
    with RLRun(cfg, command_name(cfg), build_policy_model) as rl:
        advantage = choose(ADVANTAGES, cfg.advantage, "advantage")  # the variants, looked up once by name
        terms = active_terms(cfg)
        term_inputs = [term.inputs(rl, cfg) for term in terms.values()]
        source = make_source(rl)
        rl.resume(**source.checkpointed())  # when resuming: weights, optimiser, data position, RNG, ...
        with rl.evaluating(), source:  # held-out reward before and after
            for it in rl.steps():  # checkpoints when due; SIGINT/SIGTERM: checkpoint and stop
                t0 = time.time()
                batch, sampled, metrics = collect(rl, cfg, it, source, advantage)  # 1-3. sample, score, advantages
                metrics.update(rollout_metrics(sampled))
                rows = informative_rows(batch, cfg, advantage, rl.world)
                metrics["rollout/update_fraction"] = len(rows) / len(sampled.scores)
                t1 = time.time()
                logged = sampled if advantage.phase == SCORES else None  # whose advantages the samples show
                if len(rows):
                    used, update_m, t1 = update_on(rl, cfg, batch, rows, advantage, terms, term_inputs)  # 4-6. log-probs, update
                    metrics.update(update_m)
                    if logged is None and sampled is batch:  # every row, in order (no estimator of phase 5 drops)
                        logged = used
                t2 = time.time()
                metrics.update(source.after_update())  # an off-policy sampler takes the updated weights
                metrics["params/beta"] = cfg.beta
                extra = {} if logged is None else {
                    "advantage": (logged.advantages.sum(1) / sampled.response_mask.sum(1).clamp(min=1)).tolist()}
                rl.log_iteration(it, sampled, metrics, (t0, t1, t2), extra)  # 7. log
        line = accuracy_line(rl, cfg)
        if line:
            rl.print(line)
        return rl.finish()
