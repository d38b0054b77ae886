"""Built-in reward functions.

A reward function is a plain callable
``(prompts: list[str], completions: list[str], **info) -> list[float]`` where
``info`` holds per-sample lists of extra prompt fields (e.g. ``answer=[...]``).
Every built-in accepts and ignores info it does not use, and takes a completion as text or,
for conversational data, as TRL's message list (`text_of`).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from rlhfkit.data.chat import text_of
from rlhfkit.errors import UserError

RewardFn = Callable[..., Sequence[float]]

DEFAULT_LENGTH_TARGET = 30

# A number: optional sign (only when not glued to a preceding word/digit, so
# "5-3" reads as 5 and 3), thousands groups ("1,234") or plain digits, optional decimals.
_NUMBER = re.compile(r"(?:(?<![\w.)])[-\u2212])?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


# --------------------------------------------------------------------------- sentiment


@functools.lru_cache(maxsize=1)
def _analyzer() -> Any:
    # Built once: loading VADER's lexicon costs ~50 ms per construction.
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    return SentimentIntensityAnalyzer()


def sentiment(prompts: Sequence[str], completions: Sequence[str], **info: Any) -> list[float]:
    """VADER compound sentiment of each completion, in [-1, 1] (0 for empty text)."""
    analyzer = _analyzer()
    return [float(analyzer.polarity_scores(text_of(c))["compound"]) for c in completions]


# --------------------------------------------------------------------------- arithmetic


def parse_number(text: str) -> float | None:
    """A number written as text ("1,234", "-3", "12.0", "12."); None if there is none."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    return float(found[0].replace(",", "").replace("\u2212", "-"))


def extract_final_number(text: str) -> float | None:
    """The model's final answer: the number after the last ``####`` if any, else the last number."""
    if "####" in text:
        after = parse_number(text.rsplit("####", 1)[1])
        if after is not None:
            return after
    found = _NUMBER.findall(text)
    return float(found[-1].replace(",", "").replace("\u2212", "-")) if found else None


def reference_value(answer: Any = None, answer_value: Any = None) -> float | None:
    """The reference answer from ``answer_value`` (a number) or ``answer`` (``"... #### 12"`` or a number)."""
    for value in (answer_value, answer):
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            parsed = extract_final_number(value)
            if parsed is not None:
                return parsed
    return None


def arithmetic(
    prompts: Sequence[str],
    completions: Sequence[str],
    answer: Sequence[Any] | None = None,
    answer_value: Sequence[Any] | None = None,
    **info: Any,
) -> list[float]:
    """1.0 where the completion's final number equals the reference answer, else 0.0.

    Needs ``answer`` (GSM8K string ``"... #### 12"`` or a number) or
    ``answer_value`` per sample; ``builtin:arithmetic`` prompts carry both.
    """
    if answer is None and answer_value is None:
        raise UserError(
            "reward 'arithmetic' needs an 'answer' or 'answer_value' field on every prompt "
            "(builtin:arithmetic has them)"
        )
    rewards = []
    for i, completion in enumerate(completions):
        ref = reference_value(
            answer[i] if answer is not None else None,
            answer_value[i] if answer_value is not None else None,
        )
        if ref is None:
            raise UserError(f"reward 'arithmetic': sample {i} has no numeric answer")
        got = extract_final_number(text_of(completion))
        rewards.append(1.0 if got is not None and math.isclose(got, ref, rel_tol=0, abs_tol=1e-6) else 0.0)
    return rewards


arithmetic.exact_match = True  # type: ignore[attr-defined]  # 1 or 0 per answer: the mean reward is an accuracy


# --------------------------------------------------------------------------- length


def make_length_reward(target_words: int = DEFAULT_LENGTH_TARGET) -> RewardFn:
    """Reward ``-min(1, |words - target| / target)``: 0 at the target length, -1 at twice it or at zero.

    Words are whitespace-separated tokens. Clipping at -1 keeps the scale
    comparable to the other built-ins however long a completion runs.
    """
    if isinstance(target_words, bool) or not isinstance(target_words, int) or target_words < 1:
        raise UserError(f"length reward target must be a positive number of words, got {target_words!r}")

    def length(prompts: Sequence[str], completions: Sequence[str], **info: Any) -> list[float]:
        return [-min(1.0, abs(len(text_of(c).split()) - target_words) / target_words) for c in completions]

    length.__doc__ = f"Length reward with a target of {target_words} words (0 best, -1 worst)."
    length.target_words = target_words  # type: ignore[attr-defined]
    return length


length = make_length_reward()
