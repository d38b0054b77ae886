"""The GRPO family's variants: pure functions registered by name, each with the phase of the
iteration (trainers/grpo.py's numbered steps) it acts in. The loop looks a variant up once, by the
config's name (`choose`), and calls it at its phase; it never branches on a variant's name.

    registry          key (config option)        phase      receives -> returns
    ROLLOUT_SOURCES   rollout_source(cfg)        1 sample   (rl, cfg) -> a RolloutSource (grpo_sources.py)
    ADVANTAGES        cfg.advantage              3 scores   AdvantageInputs -> ((B, R) advantages, metrics)
                                                 5 logprobs   (the same, after the log-prob pass)
    POLICY_LOSSES     cfg.importance_level       6 update   LossInputs -> (0-d loss, stats)
    LOSS_TERMS        coefficient > 0            5 inputs   (rows to train on, order) -> the rows with the term's fields
                                                 6 update   LossInputs -> (0-d loss, stats), times coef(cfg)

Stats of a loss are 0-d tensors read on the host once per optimiser step; a term's loss is logged
as `loss/NAME` (averaged over optimiser steps). Maths: algos/ (docs/algorithms.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlhfkit.algos import (
    KL_ESTIMATORS,
    aggregate_loss,
    clipped_policy_loss,
    group_advantages,
    masked_whiten,
    ppo_policy_loss,
    reward_to_go,
    shape_rewards,
    truncated_is_weights,
)
from rlhfkit.algos.registry import ADVANTAGE_ESTIMATORS, choose
from rlhfkit.rollout import Rollout
from rlhfkit.runtime.distributed import global_mean_var
from rlhfkit.trainers.grpo_distill import distill, teacher_inputs
from rlhfkit.trainers.grpo_rollout import completion_groups, group_estimate, row_completions

SCORES, LOGPROBS = "scores", "logprobs"  # the phases an advantage estimator runs in


# ----------------------------------------------------------------------------- advantages


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator may read. `rollout` has scores and shaped per-token rewards (B, R)
    in consecutive groups of G rows; after the log-prob pass also logprobs and ref_logprobs (B, R).
    `greedy()` samples (on its first call) the sequence rewards of each prompt's greedy completion, (B/G,)."""

    rollout: Rollout
    cfg: object
    greedy: Callable[[], torch.Tensor]
    accelerator: object = None


@dataclass(frozen=True)
class Advantage:
    """An estimator and the phase it runs in: SCORES (step 3, from the rewards alone, on every row
    sampled) or LOGPROBS (step 5, after the log-prob pass, on the rows the update uses).
    `zero_on_flat_groups`: a group whose rewards are all equal gets advantage 0 on every token, so
    `drop_zero_std_groups` may leave it out of the log-prob pass and the update."""

    phase: str
    fn: Callable[[AdvantageInputs], tuple[torch.Tensor, dict[str, float]]]
    zero_on_flat_groups: bool = False


def on_every_token(adv: torch.Tensor, mask: torch.Tensor, metrics=None) -> tuple[torch.Tensor, dict[str, float]]:
    """(B,) completion advantages -> ((B, R) the same value on each of its tokens, metrics)."""
    return adv[:, None] * mask, {"rollout/advantage_abs_mean": adv.abs().mean().item(), **(metrics or {})}


def batch_scaled(centred: torch.Tensor, scores: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(C,) group-centred advantages divided by the unbiased std of all `scores` (C,) of the rollout, plus
    eps (scale_rewards=batch; TRL's: its eps is 1e-4). One score: the std is taken as 0."""
    std = scores.std() if scores.numel() > 1 else torch.zeros((), device=scores.device)
    return centred / (std + eps)


def sequence_estimator(name: str) -> Callable[[AdvantageInputs], tuple[torch.Tensor, dict[str, float]]]:
    """The algos registry's sequence estimator `name` (group, rloo) on the summed shaped rewards, within
    each group of completions (rows, or agent episodes: grpo_rollout.completion_groups)."""
    estimator = ADVANTAGE_ESTIMATORS[name]

    def fn(x: AdvantageInputs) -> tuple[torch.Tensor, dict[str, float]]:
        ro = x.rollout
        seq = (ro.rewards * ro.response_mask).sum(1)  # (B,)
        first, group = completion_groups(ro, x.cfg.group_size)  # rows, or agent episodes (info["episode"])
        adv = group_estimate(estimator, seq[first], group, x.cfg.group_size, x.cfg.scale_rewards == "group")
        if x.cfg.scale_rewards == "batch" and name == "group":
            adv = batch_scaled(adv, seq[first])
        return on_every_token(adv[row_completions(ro)], ro.response_mask)

    fn.__name__ = f"{name}_advantages"
    return fn


def remax(x: AdvantageInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """ReMax: each completion's reward minus its prompt's greedy completion's reward."""
    ro, greedy = x.rollout, x.greedy()
    seq = (ro.rewards * ro.response_mask).sum(1)
    adv = ADVANTAGE_ESTIMATORS["remax"](seq, x.cfg.group_size, greedy, x.cfg.scale_rewards == "group")
    return on_every_token(adv, ro.response_mask, {"rollout/greedy_reward_mean": greedy.mean().item()})


def reinforce_pp(baseline: bool) -> Callable[[AdvantageInputs], tuple[torch.Tensor, dict[str, float]]]:
    """REINFORCE++ (Hu 2025): per-token rewards r_t = -reward_kl_coef * k1_t, plus the completion's
    reward on its last token (minus its group's mean with `baseline`); the return
    G_t = sum_{s >= t} r_s; advantages = (G - mean) / std over every valid token of the batch on all
    processes (population std). Needs the log-prob pass (logprobs, ref_logprobs)."""

    def fn(x: AdvantageInputs) -> tuple[torch.Tensor, dict[str, float]]:
        ro, cfg = x.rollout, x.cfg
        mask = ro.response_mask
        seq = ro.rewards.sum(1)  # 0 on padding, so a mask zeroed later by the overlong filter does not change it
        if baseline:
            seq = group_advantages(seq, cfg.group_size, scale_by_std=False)
        ref = ro.ref_logprobs if ro.ref_logprobs is not None else ro.logprobs
        rewards, m = shape_rewards(seq, ro.logprobs, ref, mask, cfg.reward_kl_coef)
        returns = reward_to_go(rewards, mask)
        mean, var = global_mean_var(x.accelerator, returns, mask)
        adv = masked_whiten(returns, mask, mean=mean, var=var)
        valid = mask != 0
        return adv, {"rollout/kl_penalty": m["non_score_reward"],
                     "rollout/advantage_abs_mean": adv.abs()[valid].mean().item() if valid.any() else 0.0}

    fn.__name__ = "reinforce_pp_baseline_advantages" if baseline else "reinforce_pp_advantages"
    return fn


# advantage (rlhfkit.core.choices.ADVANTAGES) -> its estimator and phase
ADVANTAGES: dict[str, Advantage] = {
    "group": Advantage(SCORES, sequence_estimator("group"), zero_on_flat_groups=True),
    "rloo": Advantage(SCORES, sequence_estimator("rloo"), zero_on_flat_groups=True),
    "reinforce++": Advantage(LOGPROBS, reinforce_pp(baseline=False)),
    "reinforce++-baseline": Advantage(LOGPROBS, reinforce_pp(baseline=True)),
    "remax": Advantage(SCORES, remax),
}


def advantages_at(phase: str, advantage: Advantage, x: AdvantageInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """Step 3 or 5: the estimator's advantages if it runs in `phase`, else the rollout's as they are
    (zeros before an estimator of a later phase has run) and no metrics."""
    if advantage.phase != phase:
        current = x.rollout.advantages
        return (torch.zeros_like(x.rollout.response_mask) if current is None else current), {}
    return advantage.fn(x)


# ----------------------------------------------------------------------------- the loss


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch as a loss term sees it (every tensor on the model's device).
    logp: (B, R) the policy's log-probs with grad; mb: the micro-batch (old logprobs, ref_logprobs,
    advantages, sampler_logprobs, ...); mask: (B, R); agg: aggregate_loss's keywords (agg_mode and
    the mini-batch's global num_tokens, num_seqs, constant)."""

    logp: torch.Tensor
    mb: Rollout
    mask: torch.Tensor
    agg: dict
    cfg: object


def sampler_weights(x: LossInputs) -> tuple[torch.Tensor | None, dict]:
    """Truncated importance weights min(pi_old / pi_sampler, tis_cap) with `tis_cap` and a sampler's
    log-probs (else None); their stats whenever tis_cap is set (HF sampling is the trainer: weight 1)."""
    if x.cfg.tis_cap is None:
        return None, {}
    if x.mb.sampler_logprobs is None:
        return None, {"is_weight_mean": 1.0, "is_clip_frac": 0.0, "mismatch_kl": 0.0}
    return truncated_is_weights(x.mb.logprobs, x.mb.sampler_logprobs, x.mask, x.cfg.tis_cap, tensor_metrics=True)


def clipped_ratio(x: LossInputs) -> tuple[torch.Tensor, dict]:
    """The clipped ratio loss with the importance ratio at `importance_level` (per token, per
    sequence: GSPO), times the truncated importance weights with `tis_cap` (algos.clipped_policy_loss)."""
    cfg = x.cfg
    weights, stats = sampler_weights(x)
    loss, pm = clipped_policy_loss(x.logp, x.mb.logprobs, x.mb.advantages, x.mask, cfg.clip_eps,
                                   clip_eps_high=cfg.clip_eps_high, level=cfg.importance_level, weights=weights,
                                   tensor_metrics=True, **x.agg)
    return loss, {**stats, **pm}


def token_ratio(x: LossInputs) -> tuple[torch.Tensor, dict]:
    """PPO's per-token clipped ratio loss (algos.ppo_policy_loss); with importance weights, `clipped_ratio`."""
    if x.cfg.tis_cap is not None and x.mb.sampler_logprobs is not None:
        return clipped_ratio(x)
    loss, pm = ppo_policy_loss(x.logp, x.mb.logprobs, x.mb.advantages, x.mask, x.cfg.clip_eps,
                               clip_eps_high=x.cfg.clip_eps_high, tensor_metrics=True, **x.agg)
    return loss, {**sampler_weights(x)[1], **pm}


# importance level (rlhfkit.core.choices.IMPORTANCE_LEVELS) -> the policy loss
POLICY_LOSSES: dict[str, Callable[[LossInputs], tuple[torch.Tensor, dict]]] = {
    "token": token_ratio, "sequence": clipped_ratio, "sequence-token": clipped_ratio}


def kl_to_reference(x: LossInputs) -> tuple[torch.Tensor, dict]:
    """KL(pi || pi_ref) per token by `kl_loss_estimator` (k3 or k2), aggregated like the policy loss."""
    per_token = choose(KL_ESTIMATORS, x.cfg.kl_loss_estimator, "KL estimator")(x.logp, x.mb.ref_logprobs)
    return aggregate_loss(per_token, x.mask, **x.agg), {}


def no_inputs(rl, cfg) -> Callable[[Rollout, torch.Tensor], Rollout]:
    """A term that reads only what the rollout has: its rows pass unchanged."""
    return lambda rollout, order: rollout


@dataclass(frozen=True)
class LossTerm:
    """A term added to the policy loss: coef(cfg) * fn(inputs); active when coef(cfg) > 0.
    `inputs(rl, cfg)` runs once when the run starts (it may load a model) and returns the function
    that, in step 5, gives the rows to train on (Rollout, with `order`, the update's first shuffle)
    the fields `fn` reads beyond the log-prob pass's, as a new Rollout."""

    coef: Callable[[object], float]
    fn: Callable[[LossInputs], tuple[torch.Tensor, dict]]
    inputs: Callable[[object, object], Callable[[Rollout, torch.Tensor], Rollout]] = no_inputs


# name -> term; its loss is logged as loss/NAME
LOSS_TERMS: dict[str, LossTerm] = {
    "kl": LossTerm(lambda cfg: cfg.beta, kl_to_reference),
    # the on-policy reverse KL to a teacher (grpo_distill.py), with its teacher's log-probs
    "distill": LossTerm(lambda cfg: cfg.distill_coef, distill, teacher_inputs),
}


def active_terms(cfg) -> dict[str, LossTerm]:
    """The loss terms whose coefficient is > 0 in this run (in LOSS_TERMS order)."""
    return {name: term for name, term in LOSS_TERMS.items() if term.coef(cfg) > 0}
