"""bench/compare_algorithms.py: the table's figures worked by hand, and --reuse going on from saved rows."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compare_algorithms as ca  # noqa: E402


def _row(method, seed, before, after, wall=None, cpu=None):
    return {"method": method, "seed": seed, "steps": 3, "train_min": wall, "train_cpu_min": cpu,
            "before": before, "after": after, "change": after - before}


def test_rl_table_means_the_change_over_seeds_and_marks_unrecorded_times():
    rows = [_row("grpo", 0, 0.05, 0.39, 2.0, 6.1), _row("grpo", 1, 0.05, 0.51), _row("rloo", 0, 0.05, 0.31)]
    text = ca.table(rows, "rl", 6, "cpu", 1)
    lines = text.splitlines()
    assert "| `grpo` | 0 | 3 | 5.0% -> 39.0% | +34.0% | 2.0 | 6.1 |" in lines
    assert "| `grpo` | 1 | 3 | 5.0% -> 51.0% | +46.0% | n/a | n/a |" in lines
    # grpo mean change: (0.34 + 0.46) / 2 = 0.40; rloo alone: 0.26
    assert "| `grpo` | 2 | +40.0% |" in lines
    assert "| `rloo` | 1 | +26.0% |" in lines
    assert "1 torch thread per run" in text


def test_reuse_takes_saved_rows_and_runs_only_the_missing_ones(tmp_path, monkeypatch):
    saved = _row("grpo", 0, 0.05, 0.39)
    (tmp_path / "grpo-s0.row.json").write_text(json.dumps(saved))
    ran = []

    def fake_run(method, seed, *rest):
        ran.append((method, seed))
        return _row(method, seed, 0.05, 0.10, 1.0, 6.0)

    monkeypatch.setattr(ca, "run_one", fake_run)
    assert ca.main(["rl", "--budget-min", "6", "--only", "grpo", "--seeds", "0", "1", "--reuse",
                    "--out", str(tmp_path)]) == 0
    assert ran == [("grpo", 1)]
    rows = json.loads((tmp_path / "rl.json").read_text())
    assert [r["seed"] for r in rows] == [0, 1] and rows[0]["after"] == 0.39

    ran.clear()  # without --reuse every run is done again
    ca.main(["rl", "--budget-min", "6", "--only", "grpo", "--seeds", "0", "--out", str(tmp_path)])
    assert ran == [("grpo", 0)]
