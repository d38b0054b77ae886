"""Train / held-out splits of any record set rlhfkit loads (SFT examples, preference pairs)."""

from __future__ import annotations

import math
import random

from rlhfkit.errors import DataError


def train_eval_split(loader, spec: str, eval_spec: str | None, eval_fraction: float, seed: int) -> tuple[list, list]:
    """(train, held-out) records for any loader(spec, split=...) of rlhfkit.data.

    Built-in sets use their train/test splits; a file whose records carry `split` uses those
    (records without one count as train); without test records a seeded `eval_fraction` of the
    training records is held out. `eval_spec` overrides.
    """
    from rlhfkit.data.sets import builtin_name

    if builtin_name(spec) is not None:
        train = list(loader(spec, split="train"))
        held = [] if eval_spec else list(loader(spec, split="test"))
    else:
        rows = list(loader(spec, split=None))
        train, held = rows, []
        if any("split" in r for r in rows):
            train = [_drop_split(r) for r in rows if r.get("split", "train") == "train"]
            held = [_drop_split(r) for r in rows if r.get("split") == "test"]
        if not held and not eval_spec:  # no test split: hold out a seeded fraction
            order = list(range(len(train)))
            random.Random(seed).shuffle(order)
            n_eval = math.ceil(eval_fraction * len(train)) if len(train) > 1 and eval_fraction > 0 else 0
            chosen = set(order[:n_eval])
            train, held = ([r for i, r in enumerate(train) if i not in chosen],
                           [r for i, r in enumerate(train) if i in chosen])
    if eval_spec:
        held = [_drop_split(r) for r in loader(eval_spec, split=None)]
    if not train:
        raise DataError(f"{spec}: no training records")
    return train, held


def _drop_split(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "split"}


def subset(records: list, n: int | None, seed: int) -> list:
    """A seeded random subset of n records (kept in order); all of them when n is None or larger."""
    if n is None or n >= len(records):
        return records
    keep = sorted(random.Random(seed).sample(range(len(records)), n))
    return [records[i] for i in keep]
