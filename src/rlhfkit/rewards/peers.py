"""Reward code written for verl and OpenRLHF, run unchanged.

- verl's ``compute_score(data_source, solution_str, ground_truth, extra_info=None)`` scores one sample
  and returns a number (or a dict with ``score``). It is called with keywords, as verl's reward manager
  calls it: `data_source` from the record's ``data_source`` column, `solution_str` the completion's
  text, `ground_truth` from ``reward_model.ground_truth`` (verl's parquet layout), else a
  ``ground_truth`` or ``answer`` column, `extra_info` the record's ``extra_info`` (None without one).
- OpenRLHF's ``reward_func(queries, prompts, labels)`` scores a batch: `queries` are prompt + response
  texts, `prompts` the prompt texts, `labels` the label column (`reward_label_key`, else ``label``,
  ``labels``, ``answer``, ``ground_truth`` or ``reward_model.ground_truth``). It returns a tensor or
  list, or a dict whose ``rewards`` holds them.

`as_peer_reward` recognises either by its parameter names; ``reward=verl:FILE.py[:FN]`` and
``reward=openrlhf:FILE.py[:FN]`` name the convention (FN defaults to ``compute_score`` /
``reward_func``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlhfkit.data.chat import text_of
from rlhfkit.errors import UserError

VERL_PARAMS = ("data_source", "solution_str", "ground_truth")
OPENRLHF_PARAMS = ("queries", "prompts", "labels")
LABEL_COLUMNS = ("label", "labels", "answer", "ground_truth")
GROUND_TRUTH_COLUMNS = ("reward_model", "ground_truth", "answer")


def _param_names(fn: Any) -> tuple[str, ...]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def convention_of(fn: Any) -> str | None:
    """"verl", "openrlhf" or None, from `fn`'s first parameter names."""
    names = _param_names(fn)
    if names[:3] == VERL_PARAMS:
        return "verl"
    if names[:3] == OPENRLHF_PARAMS:
        return "openrlhf"
    return None


def as_peer_reward(fn: Callable, convention: str, options: Mapping[str, Any], spec: str) -> Callable:
    """`fn` wrapped as an rlhfkit reward ``(prompts, completions, **columns) -> list[float]``."""
    if convention == "verl":
        return VerlReward(fn, spec)
    return OpenRLHFReward(fn, options.get("reward_label_key") or None, spec)


def _keywords_taken(fn: Callable, names: Sequence[str]) -> set[str]:
    """Which of `names` `fn` takes as keywords (all of them with **kwargs)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return set(names)
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return set(names)
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} & set(names)


def _signature_text(fn: Callable) -> str:
    try:
        return str(inspect.signature(fn))
    except (TypeError, ValueError):
        return "unknown"


# ----------------------------------------------------------------------------- columns


def labels_of(columns: Mapping[str, Any], n: int, key: str | None = None) -> list:
    """The per-sample labels: column `key`, else the first of LABEL_COLUMNS present, else verl's
    ``reward_model.ground_truth``, else None for each sample."""
    if key:
        if key not in columns:
            raise UserError(f"reward_label_key ({key}) is not a column of the prompts; they have: "
                            f"{', '.join(sorted(columns)) or 'no columns besides the prompt'}")
        return list(columns[key])
    for name in LABEL_COLUMNS:
        if name in columns:
            return list(columns[name])
    if "reward_model" in columns:
        return [r.get("ground_truth") if isinstance(r, Mapping) else None for r in columns["reward_model"]]
    return [None] * n


def ground_truths(columns: Mapping[str, Any], n: int, name: str) -> list:
    """verl's ground truth per sample (`reward_model.ground_truth`, else `ground_truth`, else `answer`)."""
    if "reward_model" in columns:
        out = []
        for i, r in enumerate(columns["reward_model"]):
            if not isinstance(r, Mapping) or "ground_truth" not in r:
                raise UserError(f"reward {name!r}: sample {i}'s reward_model is {str(r)[:60]!r}; expected "
                                "verl's {'ground_truth': ..., 'style': ...}")
            out.append(r["ground_truth"])
        return out
    for column in GROUND_TRUTH_COLUMNS[1:]:
        if column in columns:
            return list(columns[column])
    raise UserError(f"reward {name!r}: verl's compute_score needs a ground truth: a reward_model.ground_truth, "
                    "ground_truth or answer column in the prompts")


# ----------------------------------------------------------------------------- verl


class VerlReward:
    """verl's per-sample ``compute_score`` as a batch reward."""

    def __init__(self, fn: Callable, name: str):
        self.fn, self.reward_name = fn, name
        self.takes = _keywords_taken(fn, (*VERL_PARAMS, "extra_info"))
        if not {"solution_str", "ground_truth"} <= self.takes:
            raise UserError(f"reward {name!r}: verl's compute_score takes solution_str and ground_truth as keywords; "
                            f"this function's signature is {_signature_text(fn)}")

    def __call__(self, prompts: Sequence, completions: Sequence, **columns: Any) -> list[float]:
        n = len(completions)
        truths = ground_truths(columns, n, self.reward_name)
        sources = list(columns.get("data_source") or [None] * n)
        extras = list(columns.get("extra_info") or [None] * n)
        out = []
        for i in range(n):
            kwargs = {"data_source": sources[i], "solution_str": text_of(completions[i]), "ground_truth": truths[i],
                      "extra_info": extras[i]}
            value = self.fn(**{k: v for k, v in kwargs.items() if k in self.takes})
            out.append(value.get("score") if isinstance(value, Mapping) else value)
        return out

    def check_columns(self, columns: Sequence[str]) -> None:
        """Before any model loads: the prompts carry a ground truth."""
        if not any(c in columns for c in GROUND_TRUTH_COLUMNS):
            ground_truths({c: [] for c in columns}, 0, self.reward_name)


# ----------------------------------------------------------------------------- OpenRLHF


class OpenRLHFReward:
    """OpenRLHF's batched ``reward_func(queries, prompts, labels)``."""

    def __init__(self, fn: Callable, label_key: str | None, name: str):
        self.fn, self.label_key, self.reward_name = fn, label_key, name

    def __call__(self, prompts: Sequence, completions: Sequence, **columns: Any) -> Any:
        p_text = [text_of(p) for p in prompts]
        queries = [p + text_of(c) for p, c in zip(p_text, completions)]
        result = self.fn(queries, p_text, labels_of(columns, len(prompts), self.label_key))
        if isinstance(result, Mapping):
            if "rewards" not in result:
                raise UserError(f"reward {self.reward_name!r} returned a dict without 'rewards' "
                                f"(keys: {', '.join(map(str, result))}); expected OpenRLHF's {{'rewards': ...}}")
            return result["rewards"]
        return result

    def check_columns(self, columns: Sequence[str]) -> None:
        """Before any model loads: `reward_label_key` names a column."""
        if self.label_key:
            labels_of({c: [] for c in columns}, 0, self.label_key)
