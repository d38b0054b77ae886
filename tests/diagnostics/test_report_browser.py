"""The report renders in a real (headless, offline) Chromium: every chart is laid out with a
non-zero size, nothing is requested from the network, no script errors."""

from __future__ import annotations

import shutil

import pytest
from diag_synthetic import healthy_ppo, samples_for, with_values, write_run

from rlhfkit.diagnostics.report import build_report
from rlhfkit.diagnostics.rundir import load_run

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium")
def test_report_renders_offline(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    rows = with_values(healthy_ppo(), "params/grad_norm", lambda i, o: 60.0 if i == 20 else o)
    run = write_run(tmp_path, "run", rows, samples=samples_for(rows))
    page_path = build_report([load_run(run)], tmp_path / "out", png=False)
    requests, errors = [], []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("request", lambda r: requests.append(r.url))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.as_uri())
            sizes = page.eval_on_selector_all("svg.chart", "els => els.map(e => e.getBoundingClientRect().width)")
            text = page.inner_text("body")
        finally:
            browser.close()
    assert len(sizes) == 23 + 2 and min(sizes) > 300  # a chart per metric (22 + explained_variance), 2 overlays (no value_mean logged)
    assert [u for u in requests if not u.startswith("file://")] == [] and errors == []
    assert "grad_norm_explosion" in text and "<script>alert(10)</script>" in text  # shown as text
