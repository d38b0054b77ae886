"""Small facts the learning path states about the code and the measurements, each checked against
its source: a cited figure is in the cited page, a line count is the file's, a glossary row points
to the entry that answers it, a named function is defined where the page says."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LEARN = ROOT / "docs" / "learn"


def _text(path: Path) -> str:
    return " ".join(path.read_text(encoding="utf-8").split())


def _entry_titles() -> dict[int, str]:
    titles = {}
    for page in LEARN.glob("[0-9][0-9]-*.md"):
        for n, title in re.findall(r"^## (\d+)\. (.+)$", page.read_text(encoding="utf-8"), re.M):
            titles[int(n)] = title
    return titles


def test_the_lambda_figure_is_in_the_page_it_cites():
    text = _text(LEARN / "09-advantages.md")
    assert "[README](../../README.md)'s demo doubled" not in text
    assert "whose gain was +0.198: [demo results](../benchmarks.md#demo-results)" in text
    bench = _text(ROOT / "docs" / "benchmarks.md")
    assert "## Demo results" in (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "`lam=1.0` is what doubled the gain over the old defaults (`kl_coef=0.05 lam=0.95`: +0.198)" in bench


def test_the_one_iteration_page_gives_the_reference_files_line_count():
    lines = len((ROOT / "src" / "rlhfkit" / "learn" / "ppo_reference.py").read_text(encoding="utf-8").splitlines())
    assert f"ppo_reference.py), {lines} lines:" in _text(LEARN / "01-one-iteration.md")


def test_the_returns_entry_names_the_module_that_defines_compute_advantages():
    text = _text(LEARN / "09-advantages.md")
    module, name = re.search(r"`(rlhfkit\.trainers\.\w+)\.(compute_advantages)`", text).groups()
    assert getattr(importlib.import_module(module), name).__module__ == module


def test_glossary_rows_point_to_the_entries_that_answer_them():
    titles = _entry_titles()
    rows = {r.split("|")[1].strip(): r.split("|")[-2].strip()
            for r in (LEARN / "glossary.md").read_text(encoding="utf-8").splitlines() if r.startswith("| ")}
    cases = {"SFT, supervised fine-tuning": ("SFT",), "greedy decoding vs sampling, temperature, top-k, top-p":
             ("greedily",), "preference data, chosen / rejected": ("preferences",)}
    for term, words in cases.items():
        cited = [int(n) for n in rows[term].split(",")]
        assert any(all(w in titles[n] for w in words) for n in cited), (term, cited)


def test_the_zero_head_claim_is_limited_to_the_first_step():
    text = _text(LEARN / "24-beyond-ppo.md")
    assert "a zero head would give the backbone no gradient" not in text
    assert "A zero head gives the backbone no gradient at the first step only" in text


def test_the_kl_coef_comment_gives_entry_21s_figures():
    src = (ROOT / "src" / "rlhfkit" / "trainers" / "ppo_config.py").read_text(encoding="utf-8")
    assert "0.05 touched 10.6 at one seed, 0.07 stayed at 4-5" in src
    page = _text(LEARN / "21-defaults-and-beyond.md")
    assert "0.05 reached 10.6 at seed 0" in page and "0.07 stayed at 4-5" in page
