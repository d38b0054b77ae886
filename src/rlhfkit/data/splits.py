"""Train / held-out splits of any record set rlhfkit loads (SFT examples, preference pairs)."""

from __future__ import annotations

import math
import random

from rlhfkit.data.sets import builtin_name
from rlhfkit.errors import DataError

NO_SPLIT = "the data has no held-out split; eval_dataset= or eval_split= to give one"


def train_eval_split(loader, spec: str, eval_spec: str | None, eval_fraction: float, seed: int,
                     eval_split: str = "test") -> tuple[list, list]:
    """(train, evaluation) records: `split_for_eval` without saying what the evaluation records are."""
    train, held, _ = split_for_eval(loader, spec, eval_spec, eval_fraction, seed, eval_split)
    return train, held


def split_for_eval(loader, spec: str, eval_spec: str | None, eval_fraction: float, seed: int,
                   eval_split: str = "test") -> tuple[list, list, str]:
    """(train, evaluation records, what they are) for any loader(spec, split=...) of rlhfkit.data.

    Built-in sets use their train/`eval_split` splits; a file whose records carry `split` uses those
    (records without one count as train); `eval_spec` (eval_data / eval_dataset) overrides. What they
    are: "held-out". Without an evaluation split, `eval_fraction` > 0 holds a seeded share of the
    training records back ("held-back", said in the evaluation line); 0 (TRL's way) holds nothing
    back and evaluates on the training records ("training").
    """
    source = "held-out"
    if builtin_name(spec) is not None:
        train = list(loader(spec, split="train"))
        held = [] if eval_spec else list(loader(spec, split=eval_split))
    else:
        rows = list(loader(spec, split=None))
        train, held = rows, []
        if any("split" in r for r in rows):
            train = [_drop_split(r) for r in rows if r.get("split", "train") == "train"]
            held = [_drop_split(r) for r in rows if r.get("split") == eval_split]
        if not held and not eval_spec and eval_fraction > 0 and len(train) > 1:  # a seeded share held back
            order = list(range(len(train)))
            random.Random(seed).shuffle(order)
            chosen = set(order[:math.ceil(eval_fraction * len(train))])
            train, held = ([r for i, r in enumerate(train) if i not in chosen],
                           [r for i, r in enumerate(train) if i in chosen])
            source = "held-back"
        elif not held and not eval_spec:  # no evaluation split: evaluate on the training records, and say so
            held, source = list(train), "training"
    if eval_spec:
        held = [_drop_split(r) for r in loader(eval_spec, split=None)]
    if not train:
        raise DataError(f"{spec}: no training records")
    return train, held, source


def eval_phrase(n: int, unit: str, source: str, eval_fraction: float = 0.0) -> str:
    """What an evaluation ran on, for its line: ``8 training prompts (the data has no held-out split;
    eval_dataset= or eval_split= to give one)``, ``48 held-out prompts``, ``1 example held back from
    training (eval_fraction 0.1; ...)``."""
    if source == "training":
        return f"{n} training {unit} ({NO_SPLIT})"
    if source == "held-back":
        return (f"{n} {unit} held back from training (eval_fraction {eval_fraction:g}; the data has no "
                f"held-out split)")
    return f"{n} held-out {unit}"


def _drop_split(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "split"}


def subset(records: list, n: int | None, seed: int) -> list:
    """A seeded random subset of n records (kept in order); all of them when n is None or larger."""
    if n is None or n >= len(records):
        return records
    keep = sorted(random.Random(seed).sample(range(len(records)), n))
    return [records[i] for i in keep]
