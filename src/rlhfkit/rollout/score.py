"""Scoring a sampled rollout with the run's reward."""

from __future__ import annotations

import dataclasses

import torch

from rlhfkit.data.prompts import reward_inputs
from rlhfkit.rewards import score_parts
from rlhfkit.rewards.scoring import reward_metrics
from rlhfkit.rollout.core import Rollout


def score_rollout(rollout: Rollout, records: list[dict], reward_fn) -> Rollout:
    """The rollout with its scores (B,) from the reward (TRL's shapes: messages for conversational
    records) and, for several weighted rewards, each one's scores in `reward_parts`, with any per-sample
    metrics a reward gives (rewards.scoring.score_with_metrics); the reward's own metrics of this
    scoring (scoring.reward_metrics: seconds waited on reward servers) join `timings`."""
    reward_metrics(reward_fn)  # drop what earlier calls (a held-out evaluation) left
    scores, parts = score_parts(reward_fn, *reward_inputs(records, rollout.completions), rollout.info)
    return dataclasses.replace(
        rollout, scores=torch.tensor([float(s) for s in scores], dtype=torch.float32, device=rollout.response_ids.device),
        reward_parts=parts, timings={**rollout.timings, **reward_metrics(reward_fn)})
