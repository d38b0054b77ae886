"""Turn a reward spec string into a reward function.

Specs: ``sentiment``, ``arithmetic``, ``length`` / ``length:N``,
``python:module:function``, ``python:path/to/file.py:function`` and
``model:PATH`` (a reward model trained with ``rlhfkit rm``).
"""

from __future__ import annotations

import difflib
import functools
from typing import Any

from rlhfkit.errors import UserError
from rlhfkit.rewards.builtins import RewardFn, arithmetic, length, make_length_reward, sentiment
from rlhfkit.runtime.imports import first_line, get_attribute, load_source, split_target

BUILTINS: dict[str, RewardFn] = {"sentiment": sentiment, "arithmetic": arithmetic, "length": length}
SPEC_FORMS = (
    "sentiment",
    "arithmetic",
    "length[:WORDS]",
    "python:MODULE:FUNCTION",
    "python:FILE.py:FUNCTION",
    "model:PATH",
)


def get_reward(spec: str | RewardFn) -> RewardFn:
    """The reward function named by ``spec`` (a callable is returned as is).

    The result has a ``reward_name`` attribute (the spec) that error messages use.
    Raises UserError for unknown specs, failed imports and missing or
    non-callable attributes.
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise UserError(
            f"reward spec must be a non-empty string, got {spec!r}; expected one of: {', '.join(SPEC_FORMS)}"
        )
    spec = spec.strip()
    kind, _, rest = spec.partition(":")
    if kind in BUILTINS and not rest:
        return _named(BUILTINS[kind], spec)
    if kind == "length":
        return _named(make_length_reward(_positive_int(rest, spec)), spec)
    if kind == "python":
        return _named(_python_reward(rest, spec), spec)
    if kind == "model":
        return _named(_model_reward(rest, spec), spec)
    close = difflib.get_close_matches(kind, [*BUILTINS, "python", "model"], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UserError(f"unknown reward {spec!r}{hint}; expected one of: {', '.join(SPEC_FORMS)}")


def _named(fn: RewardFn, name: str) -> RewardFn:
    """A thin wrapper carrying ``reward_name``, so user functions are never mutated."""

    @functools.wraps(fn)
    def reward(prompts: Any, completions: Any, **info: Any) -> Any:
        return fn(prompts, completions, **info)

    reward.reward_name = name  # type: ignore[attr-defined]
    return reward


def _positive_int(text: str, spec: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(
            f"reward {spec!r}: the length target must be a positive whole number of words, e.g. 'length:50'"
        )
    return value


def _python_reward(target: str, spec: str) -> RewardFn:
    """Import ``module:attr`` or ``file.py:attr``; a class is instantiated once (so it can hold state)."""
    label = f"reward {spec!r}"
    parts = split_target(target)
    if parts is None:
        raise UserError(f"{label}: expected 'python:MODULE:FUNCTION' or 'python:FILE.py:FUNCTION'")
    source, attr = parts
    fn = get_attribute(load_source(source, label), source, attr, label)
    if isinstance(fn, type):
        try:
            fn = fn()
        except Exception as e:
            raise UserError(f"{label}: creating {attr}() failed: {type(e).__name__}: {first_line(e)}") from None
    if not callable(fn):
        raise UserError(f"{label}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def _model_reward(path: str, spec: str) -> RewardFn:
    if not path:
        raise UserError(f"reward {spec!r}: expected 'model:PATH' with the folder of a trained reward model")
    try:
        from rlhfkit.models.reward_model import load_reward_scorer
    except ModuleNotFoundError as e:
        if e.name and (e.name == "rlhfkit.models" or e.name.startswith("rlhfkit.models.")):
            raise UserError(
                f"reward {spec!r}: reward models arrive with `rlhfkit rm`, which this install does not have yet"
            ) from None
        raise
    except ImportError as e:  # the module exists but lacks the loader
        raise UserError(
            f"reward {spec!r}: reward-model support is incomplete in this install: {first_line(e)}"
        ) from None
    return load_reward_scorer(path)
