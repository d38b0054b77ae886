"""The report teaches: related metrics overlaid on one chart (value vs return, approx_kl vs clip
fraction, score vs KL) with a legend saying how to read each, and the doctor's findings marked on
the charts they concern, named in the chart's legend."""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

import pytest
from diag_synthetic import healthy_grpo, healthy_ppo, with_values, write_run

from rlhfkit.diagnostics.findings import Finding
from rlhfkit.diagnostics.report import OVERLAYS, build_report, finding_notes, overlay_series
from rlhfkit.diagnostics.rundir import load_run


def ppo_rows(n: int = 20) -> list[dict]:
    """healthy_ppo with a critic (value_mean closing in on return_mean) and a clip fraction that
    jumps to 0.5 from iteration 12 (the doctor's `policy_clip_frac`: a warning at 12 and 13, critical
    from 14)."""
    rows = with_values(healthy_ppo(n), "rollout/return_mean", lambda i, _: 0.5)
    rows = with_values(rows, "rollout/value_mean", lambda i, _: 0.5 * (1 - 0.8 ** i))
    return with_values(rows, "params/policy_clip_frac", lambda i, _: 0.5, start=12)


def figures(html: str, cls: str) -> list[str]:
    return re.findall(rf"<figure class='{cls}'>.*?</figure>", html, re.S)


def test_overlay_series_divides_each_line_by_its_largest_absolute_value(tmp_path):
    rows = [{"iteration": i, "params/approx_kl": kl, "params/policy_clip_frac": clip}
            for i, (kl, clip) in enumerate([(0.01, 0.1), (0.04, 0.0), (-0.02, 0.0)])]
    run = load_run(write_run(tmp_path, "r", rows))
    kl, clip = overlay_series(run, OVERLAYS[1])
    # approx_kl: max |v| = 0.04, so 0.01 / 0.04 = 0.25, 0.04 / 0.04 = 1, -0.02 / 0.04 = -0.5
    assert kl.label == "params/approx_kl / 0.04" and [v for _, v in kl.points] == pytest.approx([0.25, 1.0, -0.5])
    assert clip.label == "params/policy_clip_frac / 0.1" and [v for _, v in clip.points] == pytest.approx([1, 0, 0])
    value = [{"iteration": 0, "rollout/value_mean": 0.0, "rollout/return_mean": 0.3}]
    v, r = overlay_series(load_run(write_run(tmp_path, "v", value)), OVERLAYS[0])  # same units: not scaled
    assert (v.label, v.points, r.label, r.points) == ("rollout/value_mean", [(0, 0.0)], "rollout/return_mean", [(0, 0.3)])


def test_finding_notes_name_each_rule_once_with_its_first_iteration_and_worst_severity():
    def finding(rule, it, sev, metric):
        return Finding(rule=rule, severity=sev, iteration=it, message="m", evidence={"metric": metric, "iterations": [it]},
                       action="a")
    fs = [finding("policy_clip_frac", 5, "warning", "params/policy_clip_frac"),
          finding("policy_clip_frac", 7, "critical", "params/policy_clip_frac"),
          finding("approx_kl_high", 3, "warning", "params/approx_kl"),
          finding("grad_norm", 1, "critical", "params/grad_norm")]
    assert finding_notes(["params/approx_kl", "params/policy_clip_frac"], fs) == [
        "approx_kl_high (warning) from iteration 3", "policy_clip_frac (critical) from iteration 5"]


def test_the_report_overlays_related_metrics_and_marks_the_findings_on_them(tmp_path):
    run = write_run(tmp_path, "ppo", ppo_rows())
    html = build_report([load_run(run)], tmp_path / "out", png=False).read_text(encoding="utf-8")
    assert "<h2 id='together'>Read together</h2>" in html and "href='#together'" in html
    assert html.index("id='together'") < html.index("id='metrics'")
    overlays = figures(html, "overlay")
    assert len(overlays) == 3
    for fig, overlay in zip(overlays, OVERLAYS):
        assert f"<title>{overlay.title} - {overlay.title}</title>" in fig
        assert fig.count("<polyline") == 2 and escape(overlay.how_to_read) in fig  # two lines, the legend
        assert ("divided by its largest absolute value" in fig) == overlay.scaled
    value, clip, score = overlays
    assert ">rollout/value_mean</text>" in value and ">rollout/return_mean</text>" in value
    # the clip fraction's finding: dashed lines in the chart (one per iteration it fired, its message on
    # hover) and, in the legend under it, its first iteration and worst severity
    assert clip.count("stroke-dasharray") == 3 and clip.count("<title>ppo: policy_clip_frac (warning)") == 2
    assert "Dashed lines mark" in clip and "policy_clip_frac (critical) from iteration 12" in clip
    assert "stroke-dasharray" not in value and "Dashed lines mark" not in value
    # the single-metric chart of the clip fraction carries the same legend line
    single = re.search(r"<figure id='m-params__policy_clip_frac'>.*?</figure>", html, re.S).group(0)
    assert "policy_clip_frac (critical) from iteration 12" in single


def test_two_runs_get_one_overlay_per_run_and_a_grpo_run_no_value_chart(tmp_path):
    a = write_run(tmp_path, "ppo", ppo_rows())
    b = write_run(tmp_path, "grpo", healthy_grpo(20), config={"command": "grpo", "run_name": "grpo"})
    html = build_report([load_run(a), load_run(b)], tmp_path / "out", png=False).read_text(encoding="utf-8")
    titles = re.findall(r"<figure class='overlay'><svg[^>]*><title>([^<]*) - ", html)
    assert "value vs return (ppo)" in titles and not any(t.startswith("value vs return (grpo") for t in titles)
    assert "approx_kl vs clip fraction (ppo)" in titles and "score vs KL (ppo)" in titles
    single = re.search(r"<figure id='m-params__policy_clip_frac'>.*?</figure>", html, re.S).group(0)
    assert "ppo: policy_clip_frac (critical) from iteration 12" in single  # named by run when there are several


def test_the_shipped_unhealthy_run_gets_the_findings_entry_17_names_on_its_overlays(tmp_path):
    """docs/learn/19-reading-a-run.md: approx_kl_high from iteration 0, policy_clip_frac from 2,
    rollout_kl_high from 3, each in the legend of the overlay of its metric."""
    run = load_run(Path(__file__).resolve().parents[2] / "docs" / "learn" / "examples" / "unhealthy")
    html = build_report([run], tmp_path / "out", png=False).read_text(encoding="utf-8")
    value, clip, score = figures(html, "overlay")
    assert "approx_kl_high (critical) from iteration 0; policy_clip_frac (warning) from iteration 2." in clip
    assert "rollout_kl_high (critical) from iteration 3." in score and "Dashed lines mark" not in value
