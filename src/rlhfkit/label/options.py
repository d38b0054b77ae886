"""Command-line plumbing shared by the `rlhfkit label` commands: one-line errors, numbers."""

from __future__ import annotations

import argparse
import math
import os
import re
from pathlib import Path
from typing import NoReturn

from rlhfkit.errors import UserError

TOKEN_RE = re.compile(r"[A-Za-z0-9_.~-]{8,128}")
TOKEN_VARIABLE = "RLHFKIT_LABEL_TOKEN"  # the access token, kept out of `ps` (an option is not)
LEAD_TOKEN_VARIABLE = "RLHFKIT_LABEL_LEAD_TOKEN"  # the secret of the lead's view, likewise
DURATION_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([mhd])")
DURATION_UNITS = {"m": 60, "h": 3600, "d": 86400}


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one ``command line: ...`` line and exit code 2 (through
    ``UserError``), like every other rlhfkit error, instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        raise UserError(f"command line: {message} (see `{self.prog} --help`)")  # "rlhfkit: error: " comes first


def check_number(option: str, value: float, low: float, high: float) -> None:
    """Refuse NaN, infinities and anything outside [low, high] with one line naming the option."""
    if not low <= value <= high:  # False for NaN too
        raise UserError(f"{option} must be a number from {low:g} to {high:g}, got {value}")


def check_positive(option: str, value: float, high: float) -> None:
    """Refuse anything but a finite number in (0, high]."""
    if not (math.isfinite(value) and 0 < value <= high):
        raise UserError(f"{option} must be a number above 0 and at most {high:g}, got {value}")


def check_duration(option: str, raw: str, high_days: int) -> float:
    """'30m', '12h', '7d' -> seconds; anything else, zero or more than ``high_days`` is one line."""
    match = DURATION_RE.fullmatch(raw.strip())
    seconds = float(match[1]) * DURATION_UNITS[match[2]] if match else math.nan
    if not 0 < seconds <= high_days * 86400:  # False for NaN too
        raise UserError(f"{option} must be a duration such as 30m, 12h or 7d, at most {high_days}d, got {raw!r}")
    return seconds


def default_db(pairs_path: str | os.PathLike[str]) -> Path:
    """pairs.jsonl -> pairs.labels.sqlite next to it."""
    p = Path(pairs_path)
    return p.with_name(p.stem + ".labels.sqlite")
