"""Reward functions: ``(prompts, completions, **info) -> list[float]``, or TRL's
``(prompts=..., completions=..., **columns)``; for conversational data prompts and completions
are message lists, as TRL passes them (`text_of` reads the text of either).

``get_reward(spec)`` resolves a spec string, ``get_rewards`` several with weights;
``score_batch`` is how trainers call one.
"""

from rlhfkit.rewards.builtins import (
    RewardFn,
    arithmetic,
    extract_final_number,
    length,
    make_length_reward,
    parse_number,
    sentiment,
    text_of,
)
from rlhfkit.rewards.registry import WeightedRewards, get_reward, get_rewards
from rlhfkit.rewards.scoring import RewardError, check_reward_call, reward_name, score_batch, score_parts

__all__ = [
    "RewardError",
    "RewardFn",
    "WeightedRewards",
    "arithmetic",
    "check_reward_call",
    "extract_final_number",
    "get_reward",
    "get_rewards",
    "length",
    "make_length_reward",
    "parse_number",
    "reward_name",
    "score_batch",
    "score_parts",
    "sentiment",
    "text_of",
]
