"""The five-point preference scale and its signed scores.

Two frames of reference are used and must never be mixed up:

- **shown** (what the labeller clicked): ``choice`` 1..5, where 1 = "left is significantly
  better", 3 = "about the same", 5 = "right is significantly better".
- **canonical** (what is stored and exported): ``score`` -2..+2 relative to the pairs file,
  where +2 = "response_a is significantly better" and -2 = "response_b is significantly better".

``left_side`` ("a" or "b") records which response was shown on the left; it is the only
thing needed to go from one frame to the other.
"""

from __future__ import annotations

# choice -> label shown in the UI (kept here so the API, stats and docs agree)
CHOICE_LABELS: dict[int, str] = {
    1: "Left is significantly better",
    2: "Left is slightly better",
    3: "About the same",
    4: "Right is slightly better",
    5: "Right is significantly better",
}

# canonical score -> name used in stats tables
SCORE_NAMES: dict[int, str] = {
    2: "A significantly better",
    1: "A slightly better",
    0: "about the same",
    -1: "B slightly better",
    -2: "B significantly better",
}

SIDES = ("a", "b")


def score_from_choice(choice: int, left_side: str) -> int:
    """Map a shown choice (1..5) to the canonical score (-2..+2, positive = response_a better).

    >>> score_from_choice(1, "a"), score_from_choice(1, "b"), score_from_choice(4, "b")
    (2, -2, 1)
    """
    if choice not in CHOICE_LABELS:
        raise ValueError(f"choice must be 1..5, got {choice!r}")
    if left_side not in SIDES:
        raise ValueError(f"left_side must be 'a' or 'b', got {left_side!r}")
    left_score = 3 - choice  # +2 .. -2, positive = left better
    return left_score if left_side == "a" else -left_score


def strength_from_mean(mean_score: float) -> float:
    """Bucket a mean |score| into the exported strength: 1.0 significantly, 0.5 slightly.

    The boundary is the midpoint 1.5 of the two scale points (1 = slightly, 2 = significantly),
    so one "significantly" and one "slightly" vote (mean 1.5) count as significantly.
    """
    return 1.0 if abs(mean_score) >= 1.5 else 0.5


def margin_from_mean(mean_score: float, scale: float = 1.0) -> float:
    """Continuous margin in [0, scale]: |mean score| / 2 * scale (unanimous "significantly" = scale)."""
    return abs(mean_score) / 2.0 * scale
