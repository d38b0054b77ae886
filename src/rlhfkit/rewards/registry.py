"""Turn a reward spec string into a reward function.

Specs: ``sentiment``, ``arithmetic``, ``length`` / ``length:N``,
``python:module:function``, ``python:path/to/file.py:function`` and
``model:PATH`` (a reward model trained with ``rlhfkit rm``).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from rlhfkit.errors import UserError
from rlhfkit.rewards.builtins import RewardFn, arithmetic, length, make_length_reward, sentiment

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
    source, sep, attr = target.rpartition(":")
    if not sep or not source or not attr:
        raise UserError(f"reward {spec!r}: expected 'python:MODULE:FUNCTION' or 'python:FILE.py:FUNCTION'")
    module = (
        _import_file(source, spec)
        if source.endswith(".py") or "/" in source or "\\" in source
        else _import_module(source, spec)
    )
    if not hasattr(module, attr):
        names = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        close = difflib.get_close_matches(attr, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(f"reward {spec!r}: {source!r} has no attribute {attr!r}{hint}")
    fn = getattr(module, attr)
    if isinstance(fn, type):
        try:
            fn = fn()
        except Exception as e:
            raise UserError(
                f"reward {spec!r}: creating {attr}() failed: {type(e).__name__}: {_first_line(e)}"
            ) from None
    if not callable(fn):
        raise UserError(f"reward {spec!r}: {attr!r} is a {type(fn).__name__}, not a function")
    return fn


def _import_module(name: str, spec: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as e:  # ModuleNotFoundError, or anything the module raises on import
        raise UserError(
            f"reward {spec!r}: cannot import module {name!r}: {type(e).__name__}: {_first_line(e)}"
        ) from None


def _import_file(path: str, spec: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise UserError(f"reward {spec!r}: no such file {path!r}")
    # A unique module name per file, so two reward files called rewards.py do not collide.
    digest = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    mod_name = f"rlhfkit_user_reward_{file.stem}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    module_spec = importlib.util.spec_from_file_location(mod_name, file)
    if module_spec is None or module_spec.loader is None:
        raise UserError(f"reward {spec!r}: cannot import {path!r} as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[mod_name] = module  # dataclasses and pickling look the module up by name
    try:
        module_spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[mod_name]
        if isinstance(e, KeyboardInterrupt):
            raise
        raise UserError(
            f"reward {spec!r}: importing {path!r} failed: {type(e).__name__}: {_first_line(e)}"
        ) from None
    return module


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
            f"reward {spec!r}: reward-model support is incomplete in this install: {_first_line(e)}"
        ) from None
    return load_reward_scorer(path)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""
