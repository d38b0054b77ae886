"""Definitions of every logged metric (used by the report's chart tooltips and docs/diagnostics.md)."""

from __future__ import annotations

METRICS: dict[str, str] = {
    # PPO rollout
    "rollout/reward_mean": "Mean over sequences of the total shaped reward the advantages see: the "
    "score (after clipping and any no-stop penalty) plus the summed per-token KL penalty -beta * KL_t.",
    "rollout/reward_std": "Standard deviation (population) of that reward across the rollout's sequences.",
    "rollout/score_mean": "Mean raw score of the reward function / reward model per sequence.",
    "rollout/kl": "Mean over sequences of the summed per-token k1 KL estimate "
    "log pi(a) - log pi_ref(a) to the reference (nats per sequence); can be negative only by noise.",
    "rollout/response_length": "Mean number of response tokens per sequence, up to and including "
    "the first stop token.",
    "rollout/stop_fraction": "Fraction of responses that ended with a stop token before max_new_tokens.",
    "rollout/entropy": "Mean per-token entropy (nats) of the policy over response tokens, from "
    "temperature-scaled logits.",
    # PPO losses
    "loss/policy": "Clipped-surrogate policy loss (minimised); its sign follows the advantages.",
    "loss/value": "(Clipped) squared-error value loss of the critic against the GAE returns.",
    "loss/entropy": "Mean token entropy (nats) of the policy during the update, aggregated like the "
    "losses; the bonus term before its coefficient.",
    "loss/total": "Total loss optimised: policy + vf_coef * value - ent_coef * entropy (+ beta * k3 KL "
    "when kl_penalty=loss).",
    # PPO update statistics
    "params/policy_clip_frac": "Fraction of response tokens where the clipped surrogate term is "
    "strictly greater (>) than the unclipped one, i.e. the clip is active and changes the loss; "
    "token-weighted mean over the update's micro-batches.",
    "params/value_clip_frac": "Fraction of tokens where the clipped value loss is strictly greater "
    "than the unclipped one.",
    "params/approx_kl": "Per-token KL estimate between the rollout policy and the policy being "
    "updated: mean of 0.5 * (log pi - log pi_old)^2 (k2 estimator, nats), token-weighted over micro-batches.",
    "params/grad_norm": "Global L2 norm of the gradients before clipping (mean over optimiser steps).",
    "params/max_grad_norm": "The gradient-clipping threshold.",
    "params/kl_coef": "Coefficient of the per-token KL penalty (adaptive or fixed).",
    "params/lr": "Learning rate at the end of the iteration.",
    "params/ratio_first_microbatch_maxdev": "Max |pi/pi_old - 1| on the first micro-batch of the "
    "rollout, before any update: must be ~0 (float error).",
    "params/skipped_steps": "Optimiser steps of the iteration skipped because the loss or the gradient "
    "norm was NaN/inf (nothing applied); the run stops after max_nonfinite_steps in a row.",
    # timing
    "timing/rollout_s": "Seconds spent generating and scoring the rollout.",
    "timing/update_s": "Seconds spent in the optimisation phase.",
    "throughput/tokens_per_s": "Valid generated response tokens per second of wall time over the "
    "whole iteration (rollout + update).",
    # GRPO
    "rollout/group_reward_std": "Mean over prompts of the reward std within each prompt's group "
    "of completions (0 = no learning signal).",
    "rollout/solved_fraction": "Fraction of sampled completions that the task reward marks as "
    "correct (verifiable tasks such as arithmetic).",
    # DPO
    "rewards/chosen": "Implicit DPO reward of chosen answers: beta * (log pi - log pi_ref), mean.",
    "rewards/rejected": "Implicit DPO reward of rejected answers, mean.",
    "rewards/accuracy": "Fraction of pairs whose chosen implicit reward exceeds the rejected one.",
    "rewards/margin": "Mean of rewards/chosen - rewards/rejected.",
    "logps/chosen": "Mean summed log-prob of the chosen answers under the policy (nats).",
    "logps/rejected": "Mean summed log-prob of the rejected answers under the policy (nats).",
    "loss/dpo": "DPO (or IPO / cDPO) loss.",
    # RM
    "rm/accuracy": "Fraction of pairs where the reward model scores chosen above rejected.",
    "rm/margin": "Mean score difference chosen - rejected.",
    "rm/chosen_mean": "Mean reward-model score of chosen answers.",
    "rm/rejected_mean": "Mean reward-model score of rejected answers.",
    "loss/rm": "Pairwise (Bradley-Terry) loss -log sigmoid(score_chosen - score_rejected).",
    # SFT
    "loss/sft": "Token-mean cross-entropy on the training targets.",
    "eval/loss": "Token-mean cross-entropy on the held-out set.",
    "eval/perplexity": "exp(eval/loss).",
}

GROUP_ORDER = ("rollout", "loss", "params", "rewards", "logps", "rm", "eval", "timing", "throughput")


def describe(metric: str) -> str:
    """The metric's definition, or "" when it is not in the glossary."""
    return METRICS.get(metric, "")


def sort_metrics(names: set[str] | list[str]) -> list[str]:
    """Glossary order first (grouped by prefix), then the rest alphabetically within groups."""
    order = {name: i for i, name in enumerate(METRICS)}

    def key(name: str) -> tuple[int, int, str]:
        group = name.split("/", 1)[0] if "/" in name else ""
        g = GROUP_ORDER.index(group) if group in GROUP_ORDER else len(GROUP_ORDER)
        return (g, order.get(name, len(order)), name)

    return sorted(names, key=key)
