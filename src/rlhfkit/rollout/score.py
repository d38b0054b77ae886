"""Scoring a sampled rollout with the run's reward."""

from __future__ import annotations

import torch

from rlhfkit.rollout.core import Rollout


def score_rollout(rollout: Rollout, records: list[dict], reward_fn) -> None:
    """rollout.scores (B,) from the reward (TRL's shapes: messages for conversational records) and,
    for several weighted rewards, each one's scores in rollout.reward_parts, with any per-sample
    metrics a reward gives (rewards.scoring.score_with_metrics)."""
    from rlhfkit.data.prompts import reward_inputs
    from rlhfkit.rewards import score_parts

    scores, parts = score_parts(reward_fn, *reward_inputs(records, rollout.completions), rollout.info)
    rollout.scores = torch.tensor([float(s) for s in scores], dtype=torch.float32, device=rollout.response_ids.device)
    rollout.reward_parts = parts
