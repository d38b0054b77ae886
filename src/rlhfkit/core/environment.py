"""Environment variables a run reads, checked like options: a value the reader would ignore or
misread (``OMP_NUM_THREADS=abc``, ``ACCELERATE_MIXED_PRECISION=fp13``) is one line naming the
variable, before anything loads. Unset or empty variables are not checked.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from rlhfkit.errors import ConfigError

# accelerate's str_to_bool words
_BOOL_WORDS = ("1", "0", "true", "false", "yes", "no", "y", "n", "t", "f", "on", "off")


def _whole(minimum: int) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        ok = value.isdigit() and int(value) >= minimum
        return None if ok else f"expected a whole number >= {minimum}"
    return check


def _one_of(*words: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value.lower() in words else f"expected one of {', '.join(words)}"
    return check


# variable -> its check (None: fine, else what was expected). Read by torch (threads), accelerate
# and torchrun (precision, processes, ranks) and runtime/ (ACCELERATE_USE_*).
CHECKS: dict[str, Callable[[str], str | None]] = {
    "OMP_NUM_THREADS": _whole(1),
    "MKL_NUM_THREADS": _whole(1),
    "ACCELERATE_MIXED_PRECISION": _one_of("no", "fp16", "bf16", "fp8"),
    "ACCELERATE_USE_CPU": _one_of(*_BOOL_WORDS),
    "ACCELERATE_USE_FSDP": _one_of(*_BOOL_WORDS),
    "ACCELERATE_USE_DEEPSPEED": _one_of(*_BOOL_WORDS),
    "WORLD_SIZE": _whole(1),
    "RANK": _whole(0),
    "LOCAL_RANK": _whole(0),
    "LOCAL_WORLD_SIZE": _whole(1),
}


def check_environment(env: Mapping[str, str] | None = None) -> None:
    """ConfigError naming the first environment variable in CHECKS whose value is not what its reader takes."""
    env = os.environ if env is None else env
    for name, check in CHECKS.items():
        value = env.get(name, "").strip()
        problem = check(value) if value else None
        if problem:
            raise ConfigError(f"{name}={env[name]!r} (environment): {problem}; fix or unset it")
