"""`agent=` in the trainers: the user's agent runs each episode against the policy through the
OpenAI-compatible server (rollout/agent_rollout.py).

GRPO family, steps 1-3 (trainers/grpo.py `collect`):

  1. rollout     prompts_per_iteration records, each G times; one agent episode per row, failed
                 episodes dropped (agent/*_rate); every episode failing stops the run (exit 2)
  2. score       the agent's reward per episode (per-turn rewards: their sum)
  3. advantages  over the episodes of each group that did not fail (GRPO's or RLOO's baseline on
                 that smaller group; a group left with one episode gets advantage 0), the episode's
                 value on every model token of each of its rows; with drop_zero_std_groups the
                 rows of groups without a reward spread are left out of steps 4-5

PPO (`use_agent`): each iteration's rollout_batch_size records run one episode each; the rows
(one or more per episode) go through PPO's multi-turn path (turn rewards on the replies' last
tokens, GAE over the model's tokens). A split episode's rows each carry its reward.

Held-out evaluation runs the agent once per held-out record: mean episode reward before/after.
"""

from __future__ import annotations

import time

import torch

from rlhfkit.algos.registry import ADVANTAGE_ESTIMATORS, choose
from rlhfkit.core.devices import HOST
from rlhfkit.core.precision import autocast
from rlhfkit.core.seeding import sampling_seed
from rlhfkit.rewards.scoring import mean_std
from rlhfkit.rollout import Rollout
from rlhfkit.rollout.agent import load_agent
from rlhfkit.rollout.agent_rollout import AgentSettings, AllEpisodesFailed, agent_rollout
from rlhfkit.rollout.prompt_fit import prompt_token_limit
from rlhfkit.trainers.grpo_rollout import keep_rows


def agent_settings(cfg) -> AgentSettings:
    """The agent options of a GRPO config, FN imported (one-line UserError when it cannot be)."""
    return AgentSettings(fn=load_agent(cfg.agent), concurrency=cfg.agent_concurrency, timeout_s=cfg.agent_timeout,
                         max_calls=cfg.agent_max_calls, model_name=cfg.agent_model)


def episode_reward(reward: float | list[float]) -> float:
    return float(sum(reward)) if isinstance(reward, list) else float(reward)


def episode_advantages(scores: dict[int, float], group_size: int, advantage: str, scale: bool) -> dict[int, float]:
    """Advantage per episode number over the surviving episodes of its group (episode // G):
    the registry's estimator on that group (size >= 2), 0 for a group of one."""
    estimator = choose(ADVANTAGE_ESTIMATORS, advantage, "advantage")
    groups: dict[int, list[int]] = {}
    for e in sorted(scores):
        groups.setdefault(e // group_size, []).append(e)
    out: dict[int, float] = {}
    for members in groups.values():
        s = torch.tensor([scores[e] for e in members], dtype=torch.float32, device=HOST)
        adv = estimator(s, len(members), None, scale) if len(members) >= 2 else torch.zeros_like(s)
        out.update(zip(members, adv.tolist()))
    return out


def group_spread(scores: dict[int, float], group_size: int) -> dict[int, bool]:
    """Group number -> whether its surviving episodes' rewards differ."""
    groups: dict[int, set[float]] = {}
    for e, s in scores.items():
        groups.setdefault(e // group_size, set()).add(s)
    return {g: len(v) > 1 for g, v in groups.items()}


def sample_agent(rl, cfg, records: list[dict], seed: int):
    """agent_rollout on the policy with the run's sampling settings (autocast in the sampler thread)."""
    limit, _ = prompt_token_limit(rl.core.policy, cfg.max_new_tokens, cfg.max_prompt_length)
    with rl.generation_context():
        return agent_rollout(rl.core.policy, rl.tok, records, rl.params, rl.agent, limit or 2048, seed, fmt=cfg,
                             context=lambda: autocast(cfg.dtype, rl.run.device))


def agent_collect(rl, cfg, it: int) -> tuple[Rollout, Rollout, dict[str, float]]:
    """Steps 1-3 (module docstring): (the rows to train on, every row sampled, metrics)."""
    G = cfg.group_size
    records = [rec for rec in rl.stream.next(cfg.prompts_per_iteration) for _ in range(G)]
    t0 = time.perf_counter()
    with rl.run.tracker.phase("rollout", None):
        try:
            rollout, outcomes, metrics = sample_agent(rl, cfg, records, sampling_seed(cfg.seed, rl.run.rank, it))
        except AllEpisodesFailed as e:
            raise AllEpisodesFailed(f"iteration {it}: {e}") from None
    rollout.timings = {"timing/generate_s": time.perf_counter() - t0, "timing/reward_s": 0.0}
    scores = {o.index: episode_reward(o.reward) for o in outcomes if o.reason == "ok"}
    adv = episode_advantages(scores, G, cfg.advantage, cfg.scale_rewards)
    episode = rollout.info["episode"]
    row_adv = torch.tensor([adv[e] for e in episode], device=rollout.response_mask.device)
    rollout.rewards = rollout.turn_rewards.clone()  # (B, R) rewards on the replies' last tokens
    rollout.advantages = row_adv[:, None] * rollout.response_mask
    spread = group_spread(scores, G)
    values = list(scores.values())
    metrics.update({"rollout/solved_fraction": sum(v >= cfg.solved_threshold for v in values) / len(values),
                    "rollout/advantage_abs_mean": sum(abs(a) for a in adv.values()) / len(adv),
                    "rollout/zero_std_group_fraction": sum(not v for v in spread.values()) / len(spread)})
    if cfg.drop_zero_std_groups and rl.run.world == 1:
        rows = [b for b, e in enumerate(episode) if spread[e // G]]
        batch = keep_rows(rollout, torch.tensor(rows, dtype=torch.long, device=rollout.response_mask.device))
        return batch, rollout, metrics
    return rollout, rollout, metrics


def agent_sample(rl, cfg, records: list[dict], it: int) -> Rollout:
    """PPO's step 1 with an agent: the episodes of `records` as a Rollout; the agent/* metrics ride
    in its timings (rollout_metrics logs them)."""
    t0 = time.perf_counter()
    with rl.run.tracker.phase("rollout", None):
        try:
            rollout, _, metrics = sample_agent(rl, cfg, records, sampling_seed(cfg.seed, rl.run.rank, it))
        except AllEpisodesFailed as e:
            raise AllEpisodesFailed(f"iteration {it}: {e}") from None
    rollout.timings = {"timing/generate_s": time.perf_counter() - t0, "timing/reward_s": 0.0, **metrics}
    return rollout


def use_agent(rl, cfg, settings: AgentSettings) -> None:
    """Make the run's evaluation (and `rl.agent`) the agent's."""
    rl.agent = settings
    rl.evaluator = lambda records, seed: evaluate_agent(rl, cfg, records, seed)
    rl.eval_source = f"agent={cfg.agent}"


def evaluate_agent(rl, cfg, records: list[dict], seed: int) -> dict:
    """Mean/std of the agent's episode rewards on held-out `records` (failed episodes left out,
    counted in agent_error_rate)."""
    _, outcomes, metrics = sample_agent(rl, cfg, records, seed)
    values = [episode_reward(o.reward) for o in outcomes if o.reason == "ok"]
    mean, std = mean_std(values)
    return {"mean": mean, "std": std, "n": len(values), "agent_error_rate": metrics["agent/error_rate"],
            "samples": [{"prompt": o.record.get("prompt"), "score": episode_reward(o.reward) if o.reason == "ok" else None,
                         "outcome": o.reason} for o in outcomes[:8]]}
