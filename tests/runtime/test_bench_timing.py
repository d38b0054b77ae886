"""Per-unit timing and the TRL ratio table of bench/benchdoc.py: golden values worked by hand."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from benchdoc import ratio_table, unit_times  # noqa: E402


def test_unit_times_means_the_units_after_the_warm_up():
    # boundaries (wall, cpu): units are (10, 4), (6, 5), (8, 7); the first is the warm-up.
    stamps = [(0.0, 0.0), (10.0, 4.0), (16.0, 9.0), (24.0, 16.0)]
    t = unit_times(stamps, warmup=1)
    # wall (6 + 8) / 2 = 7, cpu (5 + 7) / 2 = 6
    assert t["units"] == 2
    assert t["wall_s"] == pytest.approx(7.0, rel=1e-12)
    assert t["cpu_s"] == pytest.approx(6.0, rel=1e-12)


def test_unit_times_keeps_the_warm_up_when_it_is_the_only_unit():
    t = unit_times([(1.0, 0.5), (4.0, 2.5)], warmup=1)
    assert (t["units"], t["wall_s"], t["cpu_s"]) == (1, 3.0, 2.0)


def test_unit_times_of_no_unit_is_nan():
    t = unit_times([(1.0, 1.0)])
    assert t["units"] == 0 and math.isnan(t["wall_s"]) and math.isnan(t["cpu_s"])


def test_unit_times_loop_matches_the_per_unit_differences():
    # invariance: the mean of per-unit differences equals (last - first) / n over the timed units.
    stamps = [(0.1 * k * k, 0.05 * k * k + 0.01 * k) for k in range(7)]
    t = unit_times(stamps, warmup=2)
    first, last = stamps[2], stamps[-1]
    assert t["wall_s"] == pytest.approx((last[0] - first[0]) / 4, rel=1e-12)
    assert t["cpu_s"] == pytest.approx((last[1] - first[1]) / 4, rel=1e-12)


RESULTS = {"trl-a": {"cpu_s": 90.0, "peak_rss_gb": 8.0}, "ours-fast": {"cpu_s": 30.0, "peak_rss_gb": 2.0},
           "ours-slow": {"cpu_s": 45.0, "peak_rss_gb": 3.2}, "trl-failed": "failed: boom"}


def row(table: str, label: str) -> list[str]:
    line = next(ln for ln in table.splitlines() if ln.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_ratio_table_golden_speed_up_memory_and_verdict():
    table = ratio_table([("fast", "trl-a", "ours-fast", 3.0, 0.3), ("slow", "trl-a", "ours-slow", 3.0, 0.3),
                         ("big", "trl-a", "ours-slow", 2.0, 0.3), ("small", "trl-a", "ours-fast", 4.0, 0.3)], RESULTS)
    # 90 / 30 = 3.00x (target met exactly), 2 / 8 = 0.25
    assert row(table, "fast")[3:] == ["**3.00x**", ">= 3x", "**0.25**", "<= 0.3", "met"]
    # 90 / 45 = 2.00x, 3.2 / 8 = 0.40: both short of 3x / 0.3
    assert row(table, "slow")[3:] == ["**2.00x**", ">= 3x", "**0.40**", "<= 0.3", "not met (speed, memory)"]
    assert row(table, "big")[-1] == "not met (memory)"
    assert row(table, "small")[-1] == "not met (speed)"


def test_ratio_table_names_a_side_that_did_not_run():
    table = ratio_table([("gone", "trl-failed", "ours-fast", 3.0, 0.3), ("absent", "trl-a", "nobody", 3.0, 0.3)],
                        RESULTS)
    assert row(table, "gone")[3] == "not run"
    assert row(table, "absent")[3] == "not run"


def test_ratio_table_reads_the_memory_key_and_a_target_of_none_leaves_speed_to_decide():
    # bench/gpu.py: seconds per unit under "s", peak CUDA memory under "gb"
    results = {"trl": {"s": 10.0, "gb": 4.0}, "ours": {"s": 4.0, "gb": 6.0}}
    table = ratio_table([("free", "trl", "ours", 2.0, None), ("capped", "trl", "ours", 2.0, 1.0)], results,
                        key="s", memory_key="gb")
    # 10 / 4 = 2.50x; 6 / 4 = 1.50: no memory target, so speed alone decides; under a cap of 1, memory fails
    assert row(table, "free")[3:] == ["**2.50x**", ">= 2x", "**1.50**", "-", "met"]
    assert row(table, "capped")[3:] == ["**2.50x**", ">= 2x", "**1.50**", "<= 1", "not met (memory)"]
