"""The functions a config chooses by name, each registry defined once: name -> function.

The names are rlhfkit.core.choices' tuples (a config's `choices`), so --help, validation and dispatch
agree (tests/algos/test_registry.py pins the keys). `choose` is the one lookup: an unknown name is a
one-line ValueError that lists the registry's keys.

Sequence advantage estimators (the GRPO family's step 3; trainers/grpo_variants.py registers every
advantage of the config with the phase it runs in) share one signature:

    estimator(scores (B,), group_size G, greedy (B/G,) | None, scale_by_std) -> advantages (B,)

with the B rows in consecutive groups of G completions of one prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from rlhfkit.algos.advantages import group_advantages, leave_one_out_advantages
from rlhfkit.algos.kl import KL_ESTIMATORS
from rlhfkit.algos.policy_gradient import IMPORTANCE_RATIOS, remax_advantages

F = TypeVar("F")

__all__ = ["ADVANTAGE_ESTIMATORS", "IMPORTANCE_RATIOS", "KL_ESTIMATORS", "choose"]


def choose(registry: Mapping[str, F], name: str, what: str) -> F:
    """registry[name], or ValueError("unknown WHAT 'name'; choose one of: a, b, c")."""
    try:
        return registry[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown {what} {name!r}; choose one of: {', '.join(registry)}") from None


def _group(scores: torch.Tensor, group_size: int, greedy: torch.Tensor | None, scale_by_std: bool) -> torch.Tensor:
    """GRPO: (s - group mean), divided by the group's std with `scale_by_std` (Dr. GRPO without)."""
    return group_advantages(scores, group_size, scale_by_std=scale_by_std)


def _leave_one_out(scores: torch.Tensor, group_size: int, greedy: torch.Tensor | None,
                   scale_by_std: bool) -> torch.Tensor:
    """RLOO: s - mean of the other G - 1 scores of the group."""
    return leave_one_out_advantages(scores, group_size)


def _greedy_baseline(scores: torch.Tensor, group_size: int, greedy: torch.Tensor | None,
                     scale_by_std: bool) -> torch.Tensor:
    """ReMax: s - the score of the prompt's greedy completion."""
    if greedy is None:
        raise ValueError("advantage remax needs the greedy completions' scores (greedy=None)")
    return remax_advantages(scores, greedy, group_size)


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., torch.Tensor]] = {
    "group": _group,
    "rloo": _leave_one_out,
    "remax": _greedy_baseline,
}
