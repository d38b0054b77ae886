"""Seeds: the same seed for model initialisation on every process, a per-process seed for
sampling (docs/pitfalls.md#seeds-per-process), and RNG state capture for exact resume."""

from __future__ import annotations

import random

import numpy as np
import torch

_PRIME = 1_000_003


# The held-out and judged samples' seed is cfg.seed + this, the same before and after training: the
# before/after comparison sees the same sampling noise.
EVAL_SEED_OFFSET = 424242


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def sampling_seed(seed: int, rank: int, iteration: int) -> int:
    """Distinct, reproducible seed for process `rank` at `iteration`."""
    return (seed + rank * _PRIME + iteration * 7919) % 2**63


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
