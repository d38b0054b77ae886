"""Reward functions: ``(prompts, completions, **info) -> list[float]``.

``get_reward(spec)`` resolves a spec string; ``score_batch`` is how trainers call one.
"""

from rlhfkit.rewards.builtins import (
    RewardFn,
    arithmetic,
    extract_final_number,
    length,
    make_length_reward,
    parse_number,
    sentiment,
)
from rlhfkit.rewards.registry import get_reward
from rlhfkit.rewards.scoring import RewardError, reward_name, score_batch

__all__ = [
    "RewardError",
    "RewardFn",
    "arithmetic",
    "extract_final_number",
    "get_reward",
    "length",
    "make_length_reward",
    "parse_number",
    "reward_name",
    "score_batch",
    "sentiment",
]
