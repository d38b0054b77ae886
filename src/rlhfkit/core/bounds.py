"""Bounds on what a run can be asked to do: counts that no machine finishes, schedules that never
reach their learning rate. Each refusal is one line naming the option, before anything is written.

- Every whole-number option (except `seed`) is at most MAX_COUNT: no count or length rlhfkit takes
  means a billion (`iterations=1e30` would train until killed).
- The optimiser steps a run plans are at most MAX_STEPS: ten million steps at 10 ms each, about as
  fast as a step of the tiny test models runs, is 28 hours; a real model's steps take seconds, weeks.
- A warm-up longer than the run is warned about (the lr peaks at lr x steps / warmup_steps); one more
  than WARMUP_FACTOR times longer is refused (the lr would stay under 1/WARMUP_FACTOR of its value).
- Memory-sized counts (a rollout's rows, an offline batch) are bounded by the machine's memory in
  estimate/memory.py `check_rollout_fits`.
"""

from __future__ import annotations

from rlhfkit.errors import ConfigError

MAX_COUNT = 10**9
MAX_STEPS = 10**7
WARMUP_FACTOR = 100


def check_count(key: str, value: int, where: str = "") -> None:
    """ConfigError when a whole-number option is beyond MAX_COUNT (or, except `seed`, below -MAX_COUNT)."""
    if key != "seed" and abs(value) > MAX_COUNT:
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}{key} ({value:.3g}) must be <= {MAX_COUNT:,} (no count or length "
                          "rlhfkit takes means more)")


def check_planned_steps(steps: int, how: str) -> None:
    """ConfigError when a run plans more than MAX_STEPS optimiser steps; `how` says what makes them."""
    if steps > MAX_STEPS:
        raise ConfigError(f"{how} plans {steps:,} optimiser steps, more than {MAX_STEPS:,} (weeks of training "
                          "even at milliseconds a step): lower it")


def check_warmup(warmup_steps: int, steps: int, lr: float) -> str | None:
    """ConfigError for a warm-up more than WARMUP_FACTOR times the run's `steps` optimiser steps; the
    warning to print (once, by the run) when the run ends before the warm-up does, else None."""
    if steps <= 0 or warmup_steps <= steps:
        return None
    peak = lr * steps / warmup_steps
    if warmup_steps > WARMUP_FACTOR * steps:
        raise ConfigError(f"warmup_steps ({warmup_steps:,}) is more than {WARMUP_FACTOR}x the run's {steps:,} "
                          f"optimiser steps: the lr would peak at ~{peak:.3g}, not lr={lr:g}; lower warmup_steps")
    return (f"warmup_steps ({warmup_steps}) is more than the run's {steps} optimiser steps: the lr peaks at "
            f"~{peak:.3g}, not lr={lr:g} (lower warmup_steps to reach it)")
