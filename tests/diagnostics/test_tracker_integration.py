"""The run tracker (rlhfkit.runtime.tracker) drives RunConsole, Monitor and the sinks as the
trainers will; the folder it writes feeds doctor and report."""

from __future__ import annotations

import json

import pytest
from diag_synthetic import healthy_ppo, with_values

from rlhfkit.commands.doctor import doctor_main, report_main

tracker_mod = pytest.importorskip("rlhfkit.runtime.tracker")


def test_tracker_run_folder_feeds_doctor_and_report(tmp_path, capsys):
    rows = with_values(healthy_ppo(12), "params/ratio_first_microbatch_maxdev", lambda i, o: 0.2, start=8)
    run = tmp_path / "runs" / "tiny"
    run.mkdir(parents=True)
    tracker = tracker_mod.Tracker(run, total_iterations=12, quiet=True, tensorboard=False)
    shown = []
    for r in rows:
        it = r["iteration"]
        with tracker.phase("rollout", 2) as bar:
            bar.advance(2)
        metrics = {k: v for k, v in r.items() if k != "iteration"}
        if it == 10:
            metrics["loss/value"] = float("nan")
        shown += tracker.log(it, metrics)
        tracker.log_samples(it, [{"prompt": "p", "completion": f"<i>{it}</i>", "reward": 0.1, "score": 0.1}])
    tracker.close()
    assert [f.rule for f in shown] == ["ratio_first_microbatch", "non_finite"]
    out = capsys.readouterr().out
    assert "[critical] ratio_first_microbatch @ it 8" in out and "it 11/12" in out
    stored = [json.loads(line) for line in (run / "diagnostics.jsonl").read_text().splitlines()]
    assert [(d["rule"], d["iteration"]) for d in stored] == [("ratio_first_microbatch", 8), ("non_finite", 10)]
    assert doctor_main([str(run)]) == 1
    assert "non_finite @ it 10" in capsys.readouterr().out
    assert report_main([str(run), "--no-png"]) == 0
    page = (run / "report" / "report.html").read_text()
    assert "&lt;i&gt;11&lt;/i&gt;" in page and "params/ratio_first_microbatch_maxdev" in page
