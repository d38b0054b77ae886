"""Steps 4-5 of PPO and TRPO (trainers/ppo.py, trainers/trpo.py): per-token rewards shaped from the
score and the KL to the reference, GAE advantages and returns, whitened advantages. Shared here so
that neither trainer imports the other."""

from __future__ import annotations

import dataclasses

from rlhfkit.algos import explained_variance, gae, masked_mean, masked_whiten, shape_rewards
from rlhfkit.algos.rewards import shape_turn_rewards
from rlhfkit.rollout import Rollout
from rlhfkit.runtime.distributed import global_mean_var


def compute_advantages(rollout: Rollout, cfg, kl_coef: float, accelerator=None) -> tuple[Rollout, dict[str, float]]:
    """Steps 4-5: (the rollout with shaped rewards, GAE advantages and returns (B, R), metrics); returns
    are taken before whitening (docs/pitfalls.md#whitening). With an accelerator of several processes the
    advantages are whitened with the statistics of the global rollout."""
    mask = rollout.response_mask
    ref = rollout.ref_logprobs if rollout.ref_logprobs is not None else rollout.logprobs
    beta = kl_coef if cfg.kl_penalty == "reward" else 0.0  # TRPO: always in the reward
    # Multi-turn: the env's rewards sit on the last model token of each turn; env tokens are holes in
    # `mask` that GAE carries through (their values never reach an advantage).
    shape, reward = (shape_rewards, rollout.scores) if rollout.turn_rewards is None else (
        shape_turn_rewards, rollout.turn_rewards)
    rewards, shaping = shape(
        reward, rollout.logprobs, ref, mask, beta, kl_estimator=cfg.kl_estimator,
        stopped=rollout.stopped, no_stop_penalty=cfg.no_stop_penalty, score_clip=cfg.score_clip,
    )
    adv, returns = gae(rewards, rollout.values, mask, cfg.gamma, cfg.lam)
    advantages = adv
    if cfg.whiten_advantages:
        mean, var = global_mean_var(accelerator, adv, mask) if accelerator is not None else (None, None)
        advantages = masked_whiten(adv, mask, mean=mean, var=var)
    kl_seq = ((rollout.logprobs - ref) * mask).sum(1)  # k1 per sequence, the logged rollout KL
    rollout = dataclasses.replace(rollout, rewards=rewards, advantages=advantages, returns=returns)
    ev = explained_variance(rollout.values, returns, mask).item()  # NaN when the returns do not vary: not logged
    return rollout, ({"rollout/explained_variance": ev} if ev == ev else {}) | {
        "rollout/kl": kl_seq.mean().item(),
        "rollout/non_score_reward": shaping.get("non_score_reward", 0.0),
        "rollout/advantage_mean_raw": masked_mean(adv, mask).item(),
        "rollout/return_mean": masked_mean(returns, mask).item(),
        "rollout/value_mean": masked_mean(rollout.values, mask).item(),
    }
