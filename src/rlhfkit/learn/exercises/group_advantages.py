"""Exercise: GRPO's group advantages (docs/learn: GRPO drops the critic).

Write `group_advantages` below, then run:  rlhfkit selfcheck --exercise group-advantages THIS_FILE

    A_i = (s_i - mean(group)) / (std(group) + 1e-6)

scores holds B = n * G answers as consecutive groups [g0 x G, g1 x G, ...] (G answers to the
same prompt side by side). std is the unbiased sample std (divides by G - 1), as in the
DeepSeekMath and TRL code. A group whose scores are all equal gets advantages 0. G >= 2.
"""

import torch


def group_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """scores: (B,) float, B divisible by group_size. Returns (B,)."""
    raise NotImplementedError("write the group-normalised advantages")
