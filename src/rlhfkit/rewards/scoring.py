"""``score_batch``: call a reward function and check what comes back.

Every trainer scores through here, so a bad reward (wrong length, NaN, an
exception) becomes one clear line naming the reward and the sample, not a
NaN loss twenty steps later.

Two calling conventions are taken, decided from the function's signature (`takes_keywords`):
TRL's ``fn(prompts=..., completions=..., **columns)`` for a function that names ``completions``
or takes only ``**kwargs`` (``def reward(completions, **kwargs)``), and rlhfkit's positional
``fn(prompts, completions, **columns)`` for any other (``def reward(p, c, **info)``).
`check_reward_call` binds the call against the data's columns before any model loads.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any

from rlhfkit.errors import UserError
from rlhfkit.rewards.builtins import RewardFn


class RewardError(UserError):
    """A reward function failed or returned something that is not one finite number per sample."""


def reward_name(reward_fn: Any) -> str:
    """The name error messages use: ``reward_name`` (set by get_reward), else ``__name__``."""
    return str(
        getattr(reward_fn, "reward_name", None)
        or getattr(reward_fn, "__name__", None)
        or type(reward_fn).__name__
    )


def score_batch(
    reward_fn: RewardFn,
    prompts: Sequence[str],
    completions: Sequence[str],
    info: Mapping[str, Sequence[Any]] | None = None,
    *,
    name: str | None = None,
) -> list[float]:
    """``reward_fn(prompts, completions, **info)`` as a list of finite floats, one per prompt.

    Accepts a list, tuple, NumPy array or tensor (shape ``(n,)`` or ``(n, 1)``).
    Raises RewardError naming the reward, the sample index, and the prompt and
    completion, if the call raises or a value is missing, non-numeric, NaN or inf.
    """
    name = name or reward_name(reward_fn)
    info = dict(info or {})
    n = len(prompts)
    if len(completions) != n:
        raise RewardError(f"reward {name!r}: got {n} prompts but {len(completions)} completions")
    for key, value in info.items():
        if isinstance(value, (list, tuple)) and len(value) != n:
            raise RewardError(f"reward {name!r}: info field {key!r} has {len(value)} values for {n} samples")
    try:
        result = call_reward(reward_fn, list(prompts), list(completions), info)
    except UserError:
        raise  # already a clear one-line message (e.g. a missing 'answer' field)
    except Exception as e:
        raise _locate_failure(reward_fn, name, prompts, completions, info, e) from None
    values = _as_list(result)
    if values is None:
        raise RewardError(f"reward {name!r} returned {type(result).__name__}; expected a list of {n} numbers")
    if len(values) != n:
        raise RewardError(f"reward {name!r} returned {len(values)} values for {n} samples")
    out = []
    for i, v in enumerate(values):
        x = _as_float(v)
        if x is None or not math.isfinite(x):
            what = _short(v) if x is None else str(x)
            raise RewardError(f"reward {name!r} gave {what} for {_sample(i, prompts, completions)}")
        out.append(x)
    return out


def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins and C callables have none
        return None


def takes_keywords(fn: Any) -> bool:
    """TRL's convention (``fn(prompts=..., completions=..., **columns)``): `fn` names a parameter
    ``completions`` that takes a keyword, or has no named parameter besides ``**kwargs``."""
    sig = _signature(fn)
    if sig is None:
        return False
    params = list(sig.parameters.values())
    named = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if any(p.name == "completions" and p.kind != p.POSITIONAL_ONLY for p in named):
        return True
    return not named and any(p.kind == p.VAR_KEYWORD for p in params)


def call_reward(fn: RewardFn, prompts: list, completions: list, info: Mapping[str, Any]) -> Any:
    """``fn`` called in its convention (`takes_keywords`) with the per-sample columns in `info`."""
    if takes_keywords(fn):
        return fn(prompts=prompts, completions=completions, **info)
    return fn(prompts, completions, **info)


def check_reward_call(fn: RewardFn, columns: Sequence[str], name: str | None = None) -> None:
    """Raise RewardError unless `fn` can be called with prompts, completions and the data's
    `columns` as keywords: the check TRL-style rewards need before a model loads, not after the
    first rollout. Several weighted rewards check each one."""
    for part_name, part, _ in getattr(fn, "parts", ()):
        check_reward_call(part, columns, part_name)
    needs = getattr(inspect.unwrap(fn), "check_columns", None)  # a reward that reads given columns
    if needs is not None:
        needs(list(columns))
    sig = _signature(fn)
    if sig is None or getattr(fn, "parts", None):
        return
    name = name or reward_name(fn)
    kwargs = dict.fromkeys(columns, [])
    try:
        if takes_keywords(fn):
            sig.bind(prompts=[], completions=[], **kwargs)
        else:
            sig.bind([], [], **kwargs)
    except TypeError as e:
        missing = missing_columns(sig, columns, takes_keywords(fn))
        if missing:
            open_ = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
            also = "" if open_ or not columns else " (and add **kwargs: every column comes as a keyword)"
            raise RewardError(f"reward {name!r} needs the column{'s' if len(missing) > 1 else ''} "
                              f"{', '.join(map(repr, missing))}, which the data lacks (its columns: "
                              f"{', '.join(columns) or 'none besides prompt'}): add it to the data, map one with "
                              f"?columns={missing[0]}:COLUMN on the data spec, or give the parameter a default"
                              f"{also}") from None
        given = ", ".join(["prompts", "completions", *columns])
        raise RewardError(f"reward {name!r}: its signature {sig} does not take the call with {given} ({e}); "
                          "a reward receives every prompt field as a keyword: add **kwargs") from None


def missing_columns(sig: inspect.Signature, columns: Sequence[str], keywords: bool) -> list[str]:
    """The required parameters of a reward (no default) that neither prompts/completions (by keyword,
    or the first two positions) nor a data column fills."""
    params = [p for p in sig.parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if not keywords:
        params = params[2:]  # called as fn(prompts, completions, **columns)
    filled = {"prompts", "completions", *columns} if keywords else set(columns)
    return [p.name for p in params if p.default is p.empty and p.name not in filled]


def reward_metrics(reward_fn: Any) -> dict[str, float]:
    """The metrics a reward keeps about its own calls since the last time they were read (its
    ``pop_metrics()``, e.g. the seconds waited on a reward server), summed over weighted parts."""
    out: dict[str, float] = {}
    for fn in [reward_fn, *(part for _, part, _ in getattr(reward_fn, "parts", ()))]:
        pop = getattr(inspect.unwrap(fn), "pop_metrics", None)
        for key, value in (pop() if pop is not None else {}).items():
            out[key] = out.get(key, 0.0) + float(value)
    return out


def score_parts(reward_fn: RewardFn, prompts: Sequence, completions: Sequence,
                info: Mapping[str, Sequence[Any]] | None = None) -> tuple[list[float], dict[str, list[float]]]:
    """(scores, {name: scores of each reward}) where `reward_fn` sums several weighted rewards
    (registry.WeightedRewards: sum_i w_i r_i, each checked as score_batch checks one); else
    (score_batch's scores, {}). Either dict also holds the per-sample metrics of rewards that give
    some (`score_with_metrics`)."""
    parts = getattr(reward_fn, "parts", None)
    if not parts:
        return score_with_metrics(reward_fn, prompts, completions, info)
    each, extra = {}, {}
    for name, fn, _ in parts:
        each[name], more = score_with_metrics(fn, prompts, completions, info, name=name)
        extra.update(more)
    total = [sum(w * each[name][i] for name, _, w in parts) for i in range(len(prompts))]
    return total, {**each, **extra}


def score_with_metrics(reward_fn: RewardFn, prompts: Sequence, completions: Sequence,
                       info: Mapping[str, Sequence[Any]] | None = None,
                       name: str | None = None) -> tuple[list[float], dict[str, list[float]]]:
    """(score_batch's scores, per-sample metrics) for a reward that has a ``score_with_metrics(prompts,
    completions, **columns) -> (scores, {metric: one number per sample})`` method (e.g. reward=code's
    pass/timeout indicators, logged as reward/METRIC means); (scores, {}) for any other."""
    detailed = getattr(inspect.unwrap(reward_fn), "score_with_metrics", None)
    if detailed is None:
        return score_batch(reward_fn, prompts, completions, info, name=name), {}
    extra: dict[str, list[float]] = {}

    def scores_only(prompts: list, completions: list, **columns: Any) -> Any:
        scores, metrics = detailed(prompts, completions, **columns)
        extra.update(metrics)
        return scores

    return score_batch(scores_only, prompts, completions, info, name=name or reward_name(reward_fn)), extra


def _as_list(result: Any) -> list | None:
    if hasattr(result, "tolist") and not isinstance(result, (list, tuple)):
        if hasattr(result, "detach"):  # torch tensor
            result = result.detach().cpu()
        shape = tuple(getattr(result, "shape", ()))
        if len(shape) == 2 and shape[1] == 1:  # a reward model's (n, 1) head output
            result = result.reshape(-1)
        result = result.tolist()
    if isinstance(result, (list, tuple)):
        return list(result)
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, (str, bytes)) or value is None:
        return None
    try:
        return float(value)  # ints, bools, numpy scalars, 0-d tensors
    except (TypeError, ValueError, OverflowError):
        return None


def _locate_failure(
    reward_fn: RewardFn,
    name: str,
    prompts: Sequence[str],
    completions: Sequence[str],
    info: dict[str, Any],
    error: Exception,
) -> RewardError:
    """Re-run sample by sample (failure path only) to name the sample that raises. A reward that
    raises on every sample alone too is broken for any input: no sample is blamed for it."""
    n = len(prompts)
    failed: tuple[int, Exception] | None = None
    passed = False
    for i in range(n):
        one = {k: (v[i : i + 1] if _per_sample(v, n) else v) for k, v in info.items()}
        try:
            call_reward(reward_fn, [prompts[i]], [completions[i]], one)
            passed = True
        except Exception as e:
            failed = failed or (i, e)
        if failed and (passed or n == 1):
            i, e = failed
            return RewardError(f"reward {name!r} failed on {_sample(i, prompts, completions)}: {_describe(e)}")
    if failed:
        return RewardError(f"reward {name!r} failed on each of the {n} samples, alone and as a batch (not on "
                           f"particular samples): {_describe(error)}")
    return RewardError(f"reward {name!r} failed on a batch of {n} samples: {_describe(error)}")


def _per_sample(value: Any, n: int) -> bool:
    """A per-sample list (or array) of length n, as opposed to a batch-wide setting."""
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__getitem__"):
        return False
    try:
        return len(value) == n
    except TypeError:  # 0-d arrays have __len__ but no length
        return False


def _sample(i: int, prompts: Sequence[str], completions: Sequence[str]) -> str:
    return f"sample {i} (prompt={_short(prompts[i])}, completion={_short(completions[i])})"


def _describe(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def _short(value: Any, limit: int = 60) -> str:
    """One-line repr cut to ``limit`` characters (repr escapes newlines)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def mean_std(scores: list[float]) -> tuple[float, float]:
    """(mean, population standard deviation) of a list of scores; (0, 0) when empty."""
    if not scores:
        return 0.0, 0.0
    m = sum(scores) / len(scores)
    return m, math.sqrt(sum((x - m) ** 2 for x in scores) / len(scores))
