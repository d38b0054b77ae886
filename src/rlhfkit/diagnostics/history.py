"""The metric history the rules read: per-metric series of finite values, grown one row at a time.

Values are coerced to float: numbers, 0-d tensors/arrays (anything with ``.item()``) and the
strings "nan"/"inf"/"-inf" that the run tracker writes for non-finite values (JSON has no NaN).
Non-numeric values (strings, lists) are ignored. Non-finite values are kept out of the series
(so a NaN never poisons a mean) and recorded per row for the ``non_finite`` rule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

Point = tuple[int, float]  # (iteration, value)

_NONFINITE_STRINGS = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf,
                      "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}


def to_float(value: Any) -> float | None:
    """A metric value as float, or None when it is not a number (bools count as numbers)."""
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return _NONFINITE_STRINGS.get(value.strip().lower())
    item = getattr(value, "item", None)
    if callable(item):
        try:
            out = item()
        except (TypeError, ValueError, RuntimeError):
            return None
        return float(out) if isinstance(out, (int, float)) else None
    return None


def clean_row(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Numeric metrics of one iteration as floats (the ``iteration`` key is dropped)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key == "iteration":
            continue
        number = to_float(value)
        if number is not None:
            out[str(key)] = number
    return out


class History:
    """Metric series up to the current (last appended) iteration.

    ``tail(key, n)`` and ``head(key, n)`` return ``(iteration, value)`` points of *finite*
    values, oldest first, in O(n).
    """

    def __init__(self, rows: Iterable[Mapping[str, Any]] = (), defaults: Mapping[str, float] | None = None) -> None:
        self.defaults = dict(defaults or {})  # run-level values for metrics the history lacks (from config.yaml)
        self._series: dict[str, list[Point]] = {}
        self._iterations: list[int] = []
        self._nonfinite: dict[str, float] = {}
        self._current: dict[str, float] = {}
        for row in rows:
            self.append(int(row["iteration"]), row)

    def append(self, iteration: int, metrics: Mapping[str, Any]) -> None:
        """Add one iteration; an iteration <= the last one (a resumed run) drops the later rows."""
        iteration = int(iteration)
        if self._iterations and iteration <= self._iterations[-1]:
            self.truncate_before(iteration)
        row = clean_row(metrics)
        self._iterations.append(iteration)
        self._current = row
        self._nonfinite = {k: v for k, v in row.items() if not math.isfinite(v)}
        for key, value in row.items():
            if math.isfinite(value):
                self._series.setdefault(key, []).append((iteration, value))

    def truncate_before(self, iteration: int) -> None:
        """Forget every row with iteration >= ``iteration``."""
        self._iterations = [i for i in self._iterations if i < iteration]
        for key in list(self._series):
            kept = [p for p in self._series[key] if p[0] < iteration]
            if kept:
                self._series[key] = kept
            else:
                del self._series[key]
        self._current, self._nonfinite = {}, {}

    # ---- queries ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._iterations)

    @property
    def iteration(self) -> int:
        """The current iteration (-1 when empty)."""
        return self._iterations[-1] if self._iterations else -1

    @property
    def nonfinite(self) -> dict[str, float]:
        """Metrics of the current iteration whose value is NaN or +-inf."""
        return dict(self._nonfinite)

    def keys(self) -> set[str]:
        """Metrics with at least one finite value so far."""
        return set(self._series)

    def current(self, key: str) -> float | None:
        """The metric's finite value at the current iteration, else None."""
        value = self._current.get(key)
        return value if value is not None and math.isfinite(value) else None

    def count(self, key: str) -> int:
        return len(self._series.get(key, ()))

    def tail(self, key: str, n: int, skip_current: bool = False) -> list[Point]:
        """The last ``n`` finite points (excluding the current iteration if ``skip_current``)."""
        series = self._series.get(key, [])
        if skip_current and series and series[-1][0] == self.iteration:
            series = series[:-1]
        return series[-n:] if n > 0 else []

    def head(self, key: str, n: int) -> list[Point]:
        """The first ``n`` finite points."""
        return self._series.get(key, [])[:n]

    def series(self, key: str) -> list[Point]:
        """Every finite point of a metric (a copy)."""
        return list(self._series.get(key, []))

    def current_or_default(self, key: str) -> tuple[float | None, str]:
        """(value, source): the metric at the current iteration ("logged"), else the run's own
        setting from ``defaults`` ("config.yaml"), else (None, "")."""
        value = self.current(key)
        if value is not None:
            return value, "logged"
        if key in self.defaults:
            return self.defaults[key], "config.yaml"
        return None, ""

    def first_present(self, *keys: str) -> str | None:
        """The first of ``keys`` logged at the current iteration."""
        return next((k for k in keys if self.current(k) is not None), None)


# ---- small statistics helpers -------------------------------------------------------------------
def values(points: list[Point]) -> list[float]:
    return [v for _, v in points]


def iterations(points: list[Point]) -> list[int]:
    return [i for i, _ in points]


def mean(points: list[Point]) -> float:
    return statistics.fmean(values(points))


def median(points: list[Point]) -> float:
    return float(statistics.median(values(points)))


def rel_change(new: float, old: float) -> float:
    """(new - old) / |old|, with a tiny floor on |old|."""
    return (new - old) / max(abs(old), 1e-12)


def fmt(x: float | None) -> str:
    """Compact number for messages: 3 significant digits."""
    if x is None:
        return "n/a"
    if not math.isfinite(x):
        return str(x)
    return f"{x:.3g}"  # scientific below 1e-4 and from 1e3 on: 1e-05, 1.23e+05
