"""`agent=` in the trainers: the user's agent runs each episode against the policy through the
OpenAI-compatible server (rollout/agent_rollout.py).

GRPO family: `AgentSource`, the "agent" rollout source (trainers/grpo_sources.py), step 1 of
trainers/grpo.py:

  1. rollout     prompts_per_iteration records, each G times; one agent episode per record, failed
                 episodes dropped (agent/*_rate); every episode failing stops the run (exit 2). Each
                 row's `info["episode"]` is its episode's number (episodes e in groups e // G)
  2. score       every row of an episode scores the agent's reward (per-turn rewards: their sum)
  3. advantages  the loop's own: GRPO's or RLOO's baseline over the episodes of each group that did
                 not fail (a group left with one episode gets advantage 0), the episode's value on
                 every model token of each of its rows; with drop_zero_std_groups the rows of groups
                 without a reward spread are left out (grpo_rollout.completion_groups)

PPO (`agent_sample`): each iteration's rollout_batch_size records run one episode each; the rows
(one or more per episode) go through PPO's multi-turn path (turn rewards on the replies' last
tokens, GAE over the model's tokens). A split episode's rows each carry its reward.

Held-out evaluation runs the agent once per held-out record: mean episode reward before/after.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from rlhfkit.core.precision import autocast
from rlhfkit.core.seeding import sampling_seed
from rlhfkit.rewards.scoring import mean_std
from rlhfkit.rollout import Rollout
from rlhfkit.rollout.agent import load_agent
from rlhfkit.rollout.agent_rollout import AgentSettings, AllEpisodesFailed, agent_rollout
from rlhfkit.rollout.prompt_fit import prompt_token_limit
from rlhfkit.trainers.rollout_source import RolloutSource


def agent_settings(cfg) -> AgentSettings:
    """The agent options of a GRPO config, FN imported (one-line UserError when it cannot be)."""
    return AgentSettings(fn=load_agent(cfg.agent), concurrency=cfg.agent_concurrency, timeout_s=cfg.agent_timeout,
                         max_calls=cfg.agent_max_calls, model_name=cfg.agent_model)


def episode_reward(reward: float | list[float]) -> float:
    return float(sum(reward)) if isinstance(reward, list) else float(reward)


def sample_agent(rl, cfg, records: list[dict], seed: int):
    """agent_rollout on the policy with the run's sampling settings (autocast in the sampler thread)."""
    limit, _ = prompt_token_limit(rl.core.policy, cfg.max_new_tokens, cfg.max_prompt_length)
    with rl.full_weights():
        return agent_rollout(rl.core.policy, rl.tok, records, rl.params, rl.agent, limit or 2048, seed, fmt=cfg,
                             context=lambda: autocast(cfg.dtype, rl.device))


def agent_episodes(rl, cfg, records: list[dict], it: int) -> tuple[Rollout, list]:
    """Iteration `it`'s episodes of `records`: (their Rollout, every episode's Outcome); the agent/*
    metrics ride in the Rollout's timings (rollout_metrics logs them)."""
    t0 = time.perf_counter()
    with rl.tracker.phase("rollout", None):
        try:
            rollout, outcomes, metrics = sample_agent(rl, cfg, records, sampling_seed(cfg.seed, rl.rank, it))
        except AllEpisodesFailed as e:
            raise AllEpisodesFailed(f"iteration {it}: {e}") from None
    timings = {"timing/generate_s": time.perf_counter() - t0, "timing/reward_s": 0.0, **metrics}
    return dataclasses.replace(rollout, timings=timings), outcomes


def agent_sample(rl, cfg, records: list[dict], it: int) -> Rollout:
    """PPO's step 1 with an agent: the episodes of `records` as a Rollout."""
    return agent_episodes(rl, cfg, records, it)[0]


class AgentSource(RolloutSource):
    """The GRPO family's "agent" rollout source (trainers/grpo_sources.py; module docstring)."""

    @staticmethod
    def prepare(cfg) -> dict:
        """The agent's FN imported before the run folder exists (one-line UserError when it cannot be)."""
        return {"settings": agent_settings(cfg)}

    def __init__(self, rl, cfg, settings: AgentSettings | None = None):
        self.rl, self.cfg = rl, cfg
        use_agent(rl, cfg, settings or agent_settings(cfg))

    def draw(self, it: int, round: int = 0) -> tuple[Rollout, list[dict]]:
        """The next prompts_per_iteration prompts, each G times, one episode each: (the episodes'
        rows, each scored its episode's reward, with info["episode"]; each row's record)."""
        G = self.cfg.group_size
        records = [rec for rec in self.rl.stream.next(self.cfg.prompts_per_iteration) for _ in range(G)]
        rollout, outcomes = agent_episodes(self.rl, self.cfg, records, it)
        reward = {o.index: episode_reward(o.reward) for o in outcomes if o.reason == "ok"}
        episode = rollout.info["episode"]
        scores = torch.tensor([reward[e] for e in episode], dtype=torch.float32, device=rollout.scores.device)
        return dataclasses.replace(rollout, scores=scores), [records[e] for e in episode]


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
