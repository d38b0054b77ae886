"""Turn a reward spec string into a reward function.

Specs: ``sentiment``, ``arithmetic``, ``length`` / ``length:N``,
``python:module:function``, ``python:path/to/file.py:function``,
``code[:fraction|all]`` (the completion's program against the record's tests, rewards/code.py) and
``model:PATH`` (a reward model trained with ``rlhfkit rm``, or any transformers
``AutoModelForSequenceClassification`` folder or Hub id), ``http(s)://HOST:PORT/PATH`` (a reward
server, rewards/remote.py), ``judge:URL`` (an LLM judge, rewards/judge.py), ``verl:FILE.py[:FN]`` and
``openrlhf:FILE.py[:FN]`` (the peers' reward functions, rewards/peers.py). ``get_rewards`` takes
several, ``a,b``, summed with weights.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from rlhfkit.core.imports import first_line, get_attribute, load_source, split_target
from rlhfkit.errors import UserError
from rlhfkit.models.reward_model import load_reward_scorer
from rlhfkit.rewards.builtins import RewardFn, arithmetic, length, make_length_reward, sentiment

BUILTINS: dict[str, RewardFn] = {"sentiment": sentiment, "arithmetic": arithmetic, "length": length}
SPEC_FORMS = (
    "sentiment",
    "arithmetic",
    "length[:WORDS]",
    "python:MODULE:FUNCTION",
    "python:FILE.py:FUNCTION",
    "model:PATH",
    "http(s)://HOST:PORT/PATH",
    "judge:URL",
    "verl:FILE.py[:FN]",
    "openrlhf:FILE.py[:FN]",
    "code[:fraction|all]",
)


# A reward kind "KIND:TARGET" -> builder(target, spec, options) -> reward function. `options` are the
# run's reward settings (the trainer config's reward option groups as a read-only mapping; empty outside
# a trainer); a builder reads the keys it knows with its own defaults.
RewardBuilder = Callable[[str, str, Mapping[str, Any]], RewardFn]
NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})


def _length_kind(target: str, spec: str, options: Mapping[str, Any]) -> RewardFn:
    return make_length_reward(_positive_int(target, spec))


def _python_kind(target: str, spec: str, options: Mapping[str, Any]) -> RewardFn:
    """A function in verl's or OpenRLHF's convention (known by its parameter names) runs unchanged."""
    from rlhfkit.rewards.peers import as_peer_reward, convention_of

    fn = _python_reward(target, spec)
    convention = convention_of(fn)
    return fn if convention is None else as_peer_reward(fn, convention, options, spec)


def _peer_kind(convention: str, default_fn: str) -> RewardBuilder:
    """``verl:FILE.py[:FN]`` / ``openrlhf:FILE.py[:FN]``: the file's function in that peer's convention."""

    def build(target: str, spec: str, options: Mapping[str, Any]) -> RewardFn:
        from rlhfkit.rewards.peers import as_peer_reward

        if not target:
            raise UserError(f"reward {spec!r}: expected '{convention}:FILE.py' or '{convention}:FILE.py:FUNCTION'")
        if target.endswith(".py") or ":" not in target:
            target = f"{target}:{default_fn}"
        return as_peer_reward(_python_reward(target, spec), convention, options, spec)

    return build


def _remote_kind(target: str, spec: str, options: Mapping[str, Any]) -> RewardFn:
    from rlhfkit.rewards.remote import build_remote

    return build_remote(spec, options)


def _judge_kind(target: str, spec: str, options: Mapping[str, Any]) -> RewardFn:
    from rlhfkit.rewards.judge import build_judge

    return build_judge(target, spec, options)


def _model_kind(target: str, spec: str, options: Mapping[str, Any]) -> RewardFn:
    return _model_reward(target, spec)


def _code_kind(target: str, spec: str, options: Mapping[str, Any]) -> RewardFn:
    from rlhfkit.rewards.code import code_kind  # the sandbox is loaded only when a run asks for it

    return code_kind(target, spec, options)


KINDS: dict[str, RewardBuilder] = {
    "length": _length_kind, "python": _python_kind, "model": _model_kind, "code": _code_kind,
    "http": _remote_kind, "https": _remote_kind, "judge": _judge_kind,
    "verl": _peer_kind("verl", "compute_score"), "openrlhf": _peer_kind("openrlhf", "reward_func"),
}


def get_reward(spec: str | RewardFn, options: Mapping[str, Any] = NO_OPTIONS) -> RewardFn:
    """The reward function named by ``spec`` (a callable is returned as is): a built-in name or
    ``KIND:TARGET`` with KIND a key of `KINDS`, built with the run's reward `options`.

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
    if kind in KINDS:  # "code" alone is a kind with an empty target
        return _named(KINDS[kind](rest, spec, options), spec)
    close = difflib.get_close_matches(kind, [*BUILTINS, *KINDS], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UserError(f"unknown reward {spec!r}{hint}; expected one of: {', '.join(SPEC_FORMS)}")


class WeightedRewards:
    """Several rewards as one, TRL's ``reward_funcs`` with ``reward_weights``: the score is
    sum_i w_i r_i(prompts, completions, **columns); `parts` holds (name, reward, weight) and each
    part is logged on its own (rewards.scoring.score_parts)."""

    def __init__(self, parts: list[tuple[str, RewardFn, float]]):
        self.parts = parts
        self.reward_name = " + ".join(f"{w:g} x {name}" for name, _, w in parts)

    def __call__(self, prompts: Any, completions: Any, **info: Any) -> list[float]:
        from rlhfkit.rewards.scoring import score_parts

        return score_parts(self, prompts, completions, info)[0]


def get_rewards(spec: Any, weights: Sequence[float] | None = None,
                options: Mapping[str, Any] = NO_OPTIONS) -> RewardFn:
    """One reward function from ``spec``: a spec string, ``a,b`` (several, summed with `weights`,
    default 1 each), a callable, or a list of specs and callables (the Python API); spec strings
    are built with the run's reward `options` (see `KINDS`)."""
    specs = _as_specs(spec)
    if weights is not None and len(weights) != len(specs):
        raise UserError(f"reward_weights has {len(weights)} values for {len(specs)} rewards "
                        f"({', '.join(map(_spec_label, specs))}): give one weight per reward")
    if len(specs) == 1 and weights is None:
        return get_reward(specs[0], options)
    labels = _unique([_spec_label(s) for s in specs])
    return WeightedRewards([(label, get_reward(s, options), float(w))
                            for label, s, w in zip(labels, specs, weights or [1.0] * len(specs))])


def _as_specs(spec: Any) -> list:
    if isinstance(spec, str):
        return [s.strip() for s in spec.split(",") if s.strip()] or [spec]
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise UserError("reward: an empty list; give at least one reward")
        return [s for item in spec for s in (_as_specs(item) if isinstance(item, str) else [item])]
    return [spec]


def _spec_label(spec: Any) -> str:
    """A reward's name in logs: the spec string, or a function's name."""
    return spec if isinstance(spec, str) else getattr(spec, "__name__", None) or type(spec).__name__


def _unique(labels: list[str]) -> list[str]:
    """Labels made unique with #2, #3, ... (two rewards from the same function)."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return out


def _named(fn: RewardFn, name: str) -> RewardFn:
    """A thin wrapper carrying ``reward_name``, so user functions are never mutated."""

    @functools.wraps(fn)  # the signature seen by scoring.takes_keywords is fn's own
    def reward(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

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
        raise UserError(f"reward {spec!r}: expected 'model:PATH' with the folder or Hub id of a reward model")
    return load_reward_scorer(path)
