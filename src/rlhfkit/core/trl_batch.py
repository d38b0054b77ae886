"""TRL's batch, generation and iteration options, as the same work per optimiser step in rlhfkit's.

TRL 1.16 counts a GRPO step in completions: an optimiser step is ``per_device_train_batch_size``
(P) completions per forward/backward times ``gradient_accumulation_steps`` (A); one generation of
``generation_batch_size`` = P x processes x ``steps_per_generation`` (S, default A) completions, in
groups of ``num_generations``, feeds S / A optimiser steps, ``num_iterations`` (mu, default 1) times
over. rlhfkit counts the same things per process as ``rollout_batch_size`` (P x S), ``mini_batch_size``
(P x A), ``micro_batch_size`` (P) and ``update_epochs`` (mu); an iteration is one generation, so
TRL's ``max_steps`` optimiser steps are max_steps / (mu x S / A) iterations. The offline trainers
(SFT, DPO, RM, KTO): ``micro_batch_size`` = P and ``batch_size`` = P x A x processes.

When one of these names is given, TRL's other defaults of the same work apply where rlhfkit's
options are not given: no warm-up (``warmup_steps`` 0), a linear decay (``lr_scheduler_type``
linear), one pass per generation (``num_iterations`` 1) and, offline, 3 epochs
(``num_train_epochs``). `trl_batch_values` works this out from the values as given (before the
aliases map names) and returns one line saying what a step does, in TRL's terms and rlhfkit's.
config.yaml then records rlhfkit's own names.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

from rlhfkit.errors import ConfigError

# TRL names that set the work per step (read together, not one-to-one aliases)
BATCH_NAMES = ("per_device_train_batch_size", "gradient_accumulation_steps", "generation_batch_size",
               "steps_per_generation", "num_iterations")
GROUP_FIELDS = {"group_size", "rollout_batch_size", "mini_batch_size", "update_epochs", "iterations"}
OFFLINE_FIELDS = {"batch_size", "micro_batch_size", "epochs"}
# rlhfkit's former generation_batch_size (prompts per generate() call)
OWN_GENERATE = "prompts_per_generate"
TRL_DEFAULTS = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1, "num_iterations": 1}


def trainer_kind(fields: Iterable[str]) -> str | None:
    """``group`` (the GRPO family), ``offline`` (SFT, DPO, RM, KTO) or None: how a config with these
    `fields` reads TRL's batch names."""
    fields = set(fields)
    if GROUP_FIELDS <= fields:
        return "group"
    if OFFLINE_FIELDS <= fields and "rollout_batch_size" not in fields:
        return "offline"
    return None


def kept_names(fields: Iterable[str]) -> frozenset[str]:
    """The names a config with these `fields` reads as TRL does (the command line keeps them as given
    for `trl_batch_values`, instead of mapping each alone)."""
    fields = set(fields)
    kind = trainer_kind(fields)
    names = set(BATCH_NAMES) if kind else set()
    if kind == "group":
        names.add("max_steps")
    if kind != "group" and OWN_GENERATE in fields:
        names.add("generation_batch_size")  # rlhfkit's former name of prompts_per_generate
    if kind is None:
        names.discard("per_device_train_batch_size")  # PPO, online DPO: the micro-batch alias
        names.discard("num_iterations")
    return frozenset(names)


def _count(name: str, raw: Any) -> int:
    """`raw` as a count >= 1 (TRL's names take whole numbers), or a one-line ConfigError."""
    try:
        value = int(raw) if not isinstance(raw, bool) and float(raw) == int(float(raw)) else None
    except (TypeError, ValueError, OverflowError):
        value = None
    if value is None or value < 1:
        raise ConfigError(f"{name}={raw!r}: expected a whole number >= 1")
    return value


def _processes() -> int:
    """Training processes of this launch (torchrun/accelerate set WORLD_SIZE), TRL's num_processes."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def trl_batch_values(fields: Iterable[str], values: dict[str, Any],
                     canonical: dict[str, str]) -> tuple[dict[str, Any], str | None]:
    """`values` (as given: TRL's names kept) with TRL's batch names replaced by rlhfkit's options that
    do the same work per step, and the line that says so (None when no TRL batch name was given).

    `canonical`: given name -> rlhfkit option, for the other names (to see which rlhfkit options
    were given too: one that disagrees with what a TRL name sets is a ConfigError)."""
    fields = set(fields)
    kind = trainer_kind(fields)
    values = dict(values)
    notes = []
    if "warmup_ratio" in fields and _fraction(values.get("warmup_steps")):  # TRL: warmup_steps < 1 is a ratio
        values["warmup_ratio"], values["warmup_steps"] = float(values["warmup_steps"]), 0
    own_sizes = any(canonical.get(k, k) in ("rollout_batch_size", "mini_batch_size") for k in values)
    former = kind == "group" and own_sizes and not set(values) & (set(BATCH_NAMES) - {"generation_batch_size"})
    if (kind != "group" or former) and "generation_batch_size" in values and OWN_GENERATE in fields:
        values[OWN_GENERATE] = values.pop("generation_batch_size")
        notes.append(f"generation_batch_size is now called {OWN_GENERATE} (prompts per generate() call; "
                     "in GRPO generation_batch_size is TRL's: completions per generation"
                     f"{', read here as the former name beside rollout_batch_size' if former else ''})")
    trl = {k: values.pop(k) for k in BATCH_NAMES if k in values and k in kept_names(fields)}
    max_steps = values.pop("max_steps") if kind == "group" and "max_steps" in values else None
    if not trl:
        if max_steps is not None:
            values["iterations"] = max_steps
        return values, ("; ".join(notes) or None)
    given = {canonical.get(k, k) for k in values}
    counts = {k: _count(k, v) for k, v in trl.items()}
    if kind == "group":
        mapped, line = _group_step(counts, max_steps)
        defaults = {"update_epochs": 1, "warmup_steps": 0, "lr_scheduler_type": "linear"}
    else:
        mapped, line = _offline_step(counts)
        defaults = {"warmup_steps": 0, "lr_scheduler_type": "linear", "epochs": 3}
    for key, value in mapped.items():
        if key in given:
            name = next(k for k in values if canonical.get(k, k) == key)
            if _same(values[name], value):
                continue
            raise ConfigError(f"{name}={values[name]!r} and TRL's {', '.join(sorted(trl))} (which set {key}={value}) "
                              f"disagree: give one")
        values[key] = value
    applied = {k: v for k, v in defaults.items() if k not in given and k not in mapped and k in fields}
    values.update(applied)
    said = ", ".join(f"{k}={v}" for k, v in mapped.items())
    if applied:
        said += "; TRL's defaults " + ", ".join(f"{k}={v}" for k, v in applied.items())
    return values, "; ".join([*notes, f"TRL's batch options: {line} (rlhfkit: {said})"])


def _fraction(raw: Any) -> bool:
    """A value in (0, 1): TRL's warmup_steps read as a share of the run."""
    try:
        return not isinstance(raw, bool) and 0 < float(raw) < 1
    except (TypeError, ValueError):
        return False


def _same(raw: Any, value: int) -> bool:
    try:
        return float(raw) == value
    except (TypeError, ValueError):
        return False


def _group_step(trl: dict[str, int], max_steps: Any) -> tuple[dict[str, int], str]:
    """GRPO's step: rlhfkit's per-process rollout/mini/micro batches and update epochs, and the line."""
    p = trl.get("per_device_train_batch_size", TRL_DEFAULTS["per_device_train_batch_size"])
    a = trl.get("gradient_accumulation_steps", TRL_DEFAULTS["gradient_accumulation_steps"])
    mu = trl.get("num_iterations", TRL_DEFAULTS["num_iterations"])
    world = _processes()
    if "generation_batch_size" in trl and "steps_per_generation" in trl:
        raise ConfigError("generation_batch_size and steps_per_generation: give one (TRL refuses both)")
    if "generation_batch_size" in trl:
        g = trl["generation_batch_size"]
        if g % (p * world):
            raise ConfigError(f"generation_batch_size ({g}) must be divisible by per_device_train_batch_size x "
                              f"processes ({p} x {world})")
        s = g // (p * world)
    else:
        s = trl.get("steps_per_generation", a)
    if s % a:
        raise ConfigError(f"steps_per_generation ({s}) must be a multiple of gradient_accumulation_steps ({a}): "
                          "rlhfkit's optimiser steps do not straddle two generations")
    steps_per_generation = mu * s // a
    mapped = {"rollout_batch_size": p * s, "mini_batch_size": p * a, "micro_batch_size": p, "update_epochs": mu}
    line = (f"each optimiser step trains on {p * a * world} completions ({p} per forward/backward x {a} "
            f"accumulated{f' x {world} processes' if world > 1 else ''}); each generation samples "
            f"{p * s * world} completions and feeds {steps_per_generation} optimiser "
            f"step{'s' if steps_per_generation != 1 else ''} (num_iterations {mu})")
    if max_steps is not None:
        steps = _count("max_steps", max_steps)
        mapped["iterations"] = math.ceil(steps / steps_per_generation)
        if steps % steps_per_generation:
            line += (f"; max_steps {steps} runs {mapped['iterations']} whole generations = "
                     f"{mapped['iterations'] * steps_per_generation} optimiser steps")
    return mapped, line


def _offline_step(trl: dict[str, int]) -> tuple[dict[str, int], str]:
    """SFT/DPO/RM/KTO's step: rlhfkit's batch (all processes) and micro-batch, and the line."""
    unused = sorted(set(trl) & {"generation_batch_size", "steps_per_generation", "num_iterations"})
    if unused:
        raise ConfigError(f"{', '.join(unused)}: TRL's GRPO options; this command has no generation step")
    p = trl.get("per_device_train_batch_size", TRL_DEFAULTS["per_device_train_batch_size"])
    a = trl.get("gradient_accumulation_steps", TRL_DEFAULTS["gradient_accumulation_steps"])
    world = _processes()
    line = (f"each optimiser step trains on {p * a * world} examples ({p} per forward/backward x {a} "
            f"accumulated{f' x {world} processes' if world > 1 else ''})")
    return {"batch_size": p * a * world, "micro_batch_size": p}, line
