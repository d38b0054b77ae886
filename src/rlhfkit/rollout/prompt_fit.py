"""Prompts longer than the model can take: a token limit, and what to do with prompts above it.

The limit is ``max_prompt_length`` when set, else the model's context window minus
``max_new_tokens`` (the room the response needs). ``prompt_overflow=truncate_left`` keeps the
last ``limit`` tokens of a longer prompt (its end, where the question usually is) and says once
how many prompts were cut; ``prompt_overflow=error`` stops before anything is written, naming
the first prompt that is too long. :func:`rlhfkit.rollout.generate` applies the cut.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

from rlhfkit.errors import ConfigError, DataError

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
Where = Callable[[int], str]


def context_window(model: Any) -> int | None:
    """Tokens the model attends over (``config.max_position_embeddings`` and aliases), or None."""
    config = getattr(model, "config", None)
    for key in CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def prompt_token_limit(model: Any, max_new_tokens: int, max_prompt_length: int | None = None) -> tuple[int | None, str]:
    """(limit, how it was chosen) for prompts of a model that generates ``max_new_tokens``.

    None when neither ``max_prompt_length`` nor the context window is known. ConfigError when the
    prompt and the response cannot both fit in the context window.
    """
    window = context_window(model)
    if max_prompt_length is not None:
        if window is not None and max_prompt_length + max_new_tokens > window:
            raise ConfigError(
                f"max_prompt_length ({max_prompt_length}) + max_new_tokens ({max_new_tokens}) must be <= the "
                f"model's context window of {window} tokens"
            )
        return max_prompt_length, f"max_prompt_length={max_prompt_length}"
    if window is None:
        return None, ""
    if max_new_tokens >= window:
        raise ConfigError(
            f"max_new_tokens ({max_new_tokens}) must be < the model's context window of {window} tokens "
            "(the prompt needs room too)"
        )
    return window - max_new_tokens, f"the model's context window {window} - max_new_tokens {max_new_tokens}"


# Tokens beyond the limit kept when a long text is cut in characters: the word the cut splits
# tokenises differently, so the cut lands this many tokens before the ones that are kept.
CUT_MARGIN = 16


def clip_left(tokenizer: Any, text: str, limit: int) -> str:
    """The end of `text` that still holds more than ``limit + CUT_MARGIN`` tokens (`text` itself when it
    is not longer): a 5 MB prompt costs the tokenizer about what its kept ``limit`` tokens cost, never
    the whole text (a BPE word of a million characters would never finish). The last ``limit`` tokens
    are those of the whole text: the cut lands CUT_MARGIN tokens before them. The tail tried doubles
    from 4 characters a token, so a text is tokenised a few times at most, each time a tail."""
    size = 4 * (limit + CUT_MARGIN + 1)
    while size < len(text):
        tail = text[-size:]
        if len(tokenizer(tail, add_special_tokens=False)["input_ids"]) > limit + CUT_MARGIN:
            return tail
        size *= 2
    return text


def encode_prompts(tokenizer: Any, texts: Sequence[str], limit: int | None) -> dict:
    """Left-padded ``input_ids``/``attention_mask`` (pt) of `texts`, each cut to its last `limit`
    tokens (None: whole); a long text is cut in characters first (clip_left). The tokenizer must pad
    on the left: the last columns then hold every prompt's end."""
    if limit is not None:
        texts = [clip_left(tokenizer, t, limit) for t in texts]
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
    return {k: v[:, -limit:] for k, v in enc.items()} if limit is not None else dict(enc)


def long_prompts(tokenizer: Any, texts: Sequence[str], limit: int) -> list[tuple[int, int]]:
    """(index, token count) of every formatted prompt text longer than ``limit`` tokens; the count of
    a text cut in characters first (clip_left) is that of its kept end, a lower bound."""
    if not texts:
        return []
    clipped = [clip_left(tokenizer, t, limit) for t in texts]
    ids = tokenizer(clipped, add_special_tokens=False)["input_ids"]  # as generate() encodes them
    return [(i, len(row)) for i, row in enumerate(ids) if len(row) > limit]


def enforce_prompt_limit(
    tokenizer: Any,
    groups: Sequence[tuple[Sequence[str], Where | None]],
    limit: int | None,
    overflow: str,
    how: str = "",
) -> int:
    """Check formatted prompts against ``limit``; returns how many will be cut from the left.

    ``groups`` are ``(texts, where)`` pairs (training and held-out prompts, say); ``where(i)``
    names text ``i`` in messages (``file:line``). ``overflow="error"`` raises DataError for the
    first prompt over the limit; ``"truncate_left"`` prints one warning with the count.
    """
    if limit is None:
        return 0
    cut, total = 0, 0
    for texts, where in groups:
        over = long_prompts(tokenizer, texts, limit)
        total += len(texts)
        if over and overflow == "error":
            i, n = over[0]
            place = where(i) if where is not None else "prompts"
            size = f"{n}" if len(texts[i]) <= 4 * (limit + CUT_MARGIN + 1) else f"more than {n}"
            raise DataError(
                f"{place}: prompt {i + 1} is {size} tokens after formatting, more than the limit of {limit} "
                f"({how or 'max_prompt_length'}); shorten it, or set prompt_overflow=truncate_left to keep "
                "its last tokens"
            )
        cut += len(over)
    if cut:
        warn(
            f"{cut} of {total} prompts are longer than {limit} tokens ({how or 'max_prompt_length'}) and lose "
            "their beginning (prompt_overflow=truncate_left; prompt_overflow=error stops instead)"
        )
    return cut


def warn(message: str) -> None:
    """A one-line warning on stderr, like the one-line errors."""
    print(f"rlhfkit: warning: {message}", file=sys.stderr, flush=True)

