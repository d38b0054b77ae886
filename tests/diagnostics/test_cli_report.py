"""`rlhfkit doctor` and `rlhfkit report` on synthetic run folders; the report's content, escaping,
offline-ness and PNGs; the chart layout."""

from __future__ import annotations

import json
import math

import pytest
from diag_synthetic import healthy_dpo, healthy_ppo, samples_for, with_values, write_run

from rlhfkit.cli import main as rlhfkit_main
from rlhfkit.commands.doctor import doctor_main, report_main
from rlhfkit.diagnostics.plot import Marker, Series, layout_chart
from rlhfkit.diagnostics.png import available as png_available
from rlhfkit.diagnostics.png import render_png
from rlhfkit.diagnostics.report import choose_iterations, metric_names
from rlhfkit.diagnostics.rundir import load_run
from rlhfkit.errors import ConfigError, DataError, UserError


def _broken_rows():
    rows = with_values(healthy_ppo(), "params/policy_clip_frac", lambda i, o: 0.8, start=20)
    return with_values(rows, "loss/value", lambda i, o: math.nan if i == 25 else o)


@pytest.fixture
def runs(tmp_path):
    good, bad = healthy_ppo(), _broken_rows()
    a = write_run(tmp_path, "ppo-good", good, samples=samples_for(good),
                  summary={"before": {"reward": 0.1}, "after": {"reward": 0.62}})
    b = write_run(tmp_path, "ppo-bad", bad, samples=samples_for(bad),
                  config={"command": "ppo", "lr": 1e-4, "note": "<b>bold</b>"})
    return a, b


# ---- doctor ---------------------------------------------------------------------------------------
def test_doctor_healthy_exits_0(runs, capsys):
    assert doctor_main([str(runs[0])]) == 0
    out = capsys.readouterr().out
    assert "30 iterations (last 29), finished" in out and "healthy (exit status 0)" in out


def test_doctor_critical_exits_1(runs, capsys):
    assert doctor_main([str(runs[1])]) == 1
    out = capsys.readouterr().out
    assert "CRITICAL" in out and "policy_clip_frac" in out and "non_finite @ it 25" in out
    assert "critical problems found (exit status 1)" in out


def test_doctor_json_and_all(runs, capsys):
    assert doctor_main([str(runs[1]), "--json"]) == 1
    worst = json.loads(capsys.readouterr().out)
    assert {f["rule"] for f in worst} == {"policy_clip_frac", "non_finite"}
    assert doctor_main([str(runs[1]), "--json", "--all"]) == 1
    every = json.loads(capsys.readouterr().out)
    assert len(every) > len(worst)
    assert doctor_main([str(runs[1]), "--json", "--min-severity", "critical"]) == 1
    assert {f["severity"] for f in json.loads(capsys.readouterr().out)} == {"critical"}


def test_doctor_threshold_overrides(runs, tmp_path, capsys):
    args = [str(runs[1]), "--json", "--set", "clip_frac_critical=0.9", "--set", "clip_frac_warn=0.85",
            "--set", "clip_frac_rise=1"]
    assert doctor_main(args) == 1  # the NaN is still critical
    assert {f["rule"] for f in json.loads(capsys.readouterr().out)} == {"non_finite"}
    yml = tmp_path / "t.yaml"
    yml.write_text("clip_frac_warn: 0.85\nclip_frac_critical: 0.9\nclip_frac_rise: 1\n")
    assert doctor_main([str(runs[1]), "--json", "--thresholds", str(yml)]) == 1
    assert {f["rule"] for f in json.loads(capsys.readouterr().out)} == {"non_finite"}
    with pytest.raises(ConfigError, match="unknown diagnostics threshold 'clip_warn'"):
        doctor_main([str(runs[1]), "--set", "clip_warn=1"])
    with pytest.raises(ConfigError, match="NAME=VALUE"):
        doctor_main([str(runs[1]), "--set", "clip_frac_warn"])


def test_doctor_shows_stored_diagnostics_and_running_runs(tmp_path, capsys):
    from rlhfkit.diagnostics import Monitor

    rows = _broken_rows()
    run = write_run(tmp_path, "live", rows[:22])
    monitor = Monitor(path=run / "diagnostics.jsonl")
    for r in rows[:22]:
        monitor.observe(r["iteration"], r)
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"iteration": 22, "rollout/rew')  # the trainer is mid-write
    assert doctor_main([str(run)]) == 1
    out = capsys.readouterr().out
    assert "Reported during training (diagnostics.jsonl):" in out
    assert "skipped an incomplete last line" in out and "no summary.json yet" in out


def test_doctor_user_errors(tmp_path, capsys):
    with pytest.raises(UserError, match="does not exist"):
        doctor_main([str(tmp_path / "nope")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="has no metrics.jsonl"):
        doctor_main([str(tmp_path / "empty")])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"iteration": 0}\nnot json\n{"iteration": 2}\n')
    with pytest.raises(DataError, match="metrics.jsonl:2: not valid JSON"):
        doctor_main([str(bad)])
    (bad / "metrics.jsonl").write_text('{"epoch": 0}\n')  # ({"step": 0} is another tool's row: accepted)
    with pytest.raises(DataError, match="no integer 'iteration'"):
        doctor_main([str(bad)])
    # through the top-level dispatcher: one line on stderr, exit status 2
    assert rlhfkit_main(["doctor", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlhfkit: error: run folder") and err.count("\n") == 1


def test_doctor_help_and_list_rules(capsys):
    with pytest.raises(SystemExit) as e:
        doctor_main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "exit status" in out and "--set NAME=VALUE" in out and "--min-severity" in out
    assert doctor_main(["--list-rules"]) == 0
    out = capsys.readouterr().out
    assert "policy_clip_frac" in out and "clip_frac_warn = 0.2" in out


def test_resumed_run_keeps_the_last_row_per_iteration(tmp_path):
    run = write_run(tmp_path, "resumed", [{"iteration": 0, "a": 1}, {"iteration": 1, "a": 2},
                                          {"iteration": 1, "a": 3}, {"iteration": 2, "a": 4}])
    assert [r["a"] for r in load_run(run).metrics] == [1, 3, 4]


# ---- report ---------------------------------------------------------------------------------------
def test_report_two_runs(runs, tmp_path, capsys):
    out = tmp_path / "rep"
    assert report_main([str(runs[0]), str(runs[1]), "--out", str(out), "--iterations", "0,12,29"]) == 0
    assert "wrote" in capsys.readouterr().out
    page = (out / "report.html").read_text()
    # every metric of both runs is plotted (and has a PNG)
    metrics = metric_names([load_run(runs[0]), load_run(runs[1])])
    assert len(metrics) == 23  # healthy_ppo: 22, and rollout/explained_variance
    for m in metrics:
        assert f"<title>{m}" in page, m
        png = out / "plots" / (m.replace("/", "__") + ".png")
        assert (png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n") if png_available() else not png.exists()
    # findings, config (escaped), summary
    assert "policy_clip_frac" in page and "non_finite" in page and "healthy" in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "<b>bold</b>" not in page
    assert "before.reward" in page and "0.62" in page
    # samples at the snapped iterations 0, 10 (nearest to 12) and 25 (nearest to 29), escaped
    assert "&lt;script&gt;alert(10)&lt;/script&gt; &amp; more 0" in page
    assert "<script" not in page and "alert(5)" not in page
    assert "alert(25)" in page
    # opens offline: nothing loaded from elsewhere
    assert "src=" not in page and "<link" not in page and "@import" not in page and "url(" not in page


def test_report_default_out_and_no_png(runs, capsys):
    assert report_main([str(runs[0]), "--no-png", "--samples", "1"]) == 0
    assert (runs[0] / "report" / "report.html").exists()
    assert not (runs[0] / "report" / "plots").exists()
    page = (runs[0] / "report" / "report.html").read_text()
    assert page.count("alert(") == 4  # 4 iterations x 1 sample


def test_report_of_a_dpo_run_without_samples_or_config(tmp_path):
    run = tmp_path / "dpo"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in healthy_dpo()))
    assert report_main([str(run), "--out", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "report.html").read_text()
    assert "logps/chosen" in page and "No samples.jsonl rows" in page and "No config.yaml" in page


def test_report_user_errors(runs):
    with pytest.raises(UserError, match="comma-separated"):
        report_main([str(runs[0]), "--iterations", "a,b"])
    with pytest.raises(UserError, match="does not exist"):
        report_main([str(runs[0]) + "-missing"])


def test_choose_iterations():
    assert choose_iterations([0, 5, 10, 15, 20, 25], None) == [0, 10, 15, 25]
    assert choose_iterations([0, 5], None) == [0, 5]
    assert choose_iterations([0, 5, 10], [4, 6, 100]) == [5, 10]
    assert choose_iterations([], [1]) == []


# ---- charts -----------------------------------------------------------------------------------------
def test_layout_breaks_lines_at_non_finite_values_and_places_markers():
    s = Series("run", [(0, 1.0), (1, 2.0), (2, math.nan), (3, 2.5), (4, 3.0)], "#4e79a7")
    lay = layout_chart("loss/value", [s], [Marker(3, "critical", "x"), Marker(99, "info", "outside")])
    (color, runs), = lay.lines
    assert [len(r) for r in runs] == [2, 2] and len(lay.nonfinite) == 1 and len(lay.markers) == 1
    x0, y0, x1, y1 = lay.box
    assert runs[0][0] == (x0, pytest.approx(y1 - 0.05 / 1.1 * (y1 - y0)))  # min value 5% above the bottom
    assert all(y0 <= y <= y1 for r in runs for _, y in r)


def test_png_draws_the_series_markers_and_non_finite_values_inside_the_axes():
    pytest.importorskip("matplotlib")
    import io

    import numpy as np
    from matplotlib.image import imread

    s1 = Series("a", [(i, float(i)) if i != 12 else (i, math.nan) for i in range(20)], "#e15759")
    rgb = imread(io.BytesIO(render_png("m", [s1], [Marker(5, "warning", "x")], width=300, height=150)))[..., :3]
    assert rgb.shape == (150, 300, 3)

    def columns(hex_color: str) -> np.ndarray:
        """x of the pixels within a small distance of the colour (anti-aliased edges excluded)."""
        target = np.array([int(hex_color[i:i + 2], 16) for i in (1, 3, 5)]) / 255
        return np.nonzero(np.abs(rgb - target).max(-1) < 0.06)[1]

    line, marker, cross = columns("#e15759"), columns("#e8a400"), columns("#d62728")
    assert len(line) > 50 and 0.11 * 300 - 2 <= line.min() and line.max() <= 0.985 * 300 + 2  # inside the axes
    assert len(marker) > 10 and len(set(marker)) <= 3  # the finding: a vertical dashed line
    assert 0 < len(cross) and line.min() < cross.min() and cross.max() < line.max()  # the NaN's x


def test_long_runs_are_decimated_but_keep_spikes():
    pts = [(i, 1.0) for i in range(5000)]
    pts[2500] = (2500, 50.0)
    lay = layout_chart("m", [Series("a", pts, "#000000")])
    n = sum(len(r) for r in lay.lines[0][1])
    assert n < 1200 and min(y for r in lay.lines[0][1] for _, y in r) == pytest.approx(lay.box[1] + 0.05 / 1.1 * (lay.box[3] - lay.box[1]))
