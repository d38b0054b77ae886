"""``reward=code``'s settings, checked: one definition for the trainers' option group
(trainers/reward_options.py) and `rlhfkit serve-reward`, kept below both (and below rewards/, whose
sandbox and package load torch), so a command line is checked without loading either."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlhfkit.core.choices import CODE_ISOLATIONS, CODE_REWARDS
from rlhfkit.errors import UserError


@dataclass(frozen=True)
class CodeSettings:
    """The code reward's options (the trainer's CodeRewardArgs, or serve-reward's), checked."""

    code_reward: str = "fraction"
    code_workers: int | None = None
    code_timeout: float = 10.0
    code_memory_mb: int = 1024
    code_isolation: str = "auto"
    tests_field: str | None = None

    def __post_init__(self) -> None:
        if self.code_reward not in CODE_REWARDS:
            raise UserError(f"code_reward ({self.code_reward!r}) must be one of: {', '.join(CODE_REWARDS)}")
        if self.code_workers is not None and self.code_workers < 1:
            raise UserError(f"code_workers ({self.code_workers}) must be >= 1 (or None: the cores)")
        if not self.code_timeout > 0 or not math.isfinite(self.code_timeout):
            raise UserError(f"code_timeout ({self.code_timeout}) must be a number of seconds > 0")
        if self.code_memory_mb < 64:
            raise UserError(f"code_memory_mb ({self.code_memory_mb}) must be >= 64 (the interpreter needs ~30 MB)")
        if self.code_isolation not in CODE_ISOLATIONS:
            raise UserError(f"code_isolation ({self.code_isolation!r}) must be one of: {', '.join(CODE_ISOLATIONS)}")
        if self.tests_field is not None and not str(self.tests_field).strip():
            raise UserError("tests_field ('') must name a column, or be None to find the tests column")

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> CodeSettings:
        """The settings named in `options` (others keep their defaults; None = the default)."""
        return cls(**{k: options[k] for k in cls.__dataclass_fields__ if options.get(k) is not None})
