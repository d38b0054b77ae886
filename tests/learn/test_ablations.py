"""rlhfkit.learn.ablations and docs/learn/ablations.md: the page's tables are the script's, from the
per-seed numbers it wrote, and one row comes out again when run."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from rlhfkit.learn import ablations

DOCS = Path(__file__).resolve().parents[2] / "docs" / "learn"
NUMBER = re.compile(r"-?\d+\.\d+")


@pytest.fixture(autouse=True)
def one_thread():
    """One thread, as main() runs (the numbers of the page were measured so)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def saved() -> dict:
    return json.loads((DOCS / "ablations.json").read_text(encoding="utf-8"))


def test_the_pages_tables_are_the_scripts():
    data, page = saved(), (DOCS / "ablations.md").read_text(encoding="utf-8")
    assert data["seeds"] == [0, 1, 2, 3, 4] and data["iterations"] == 8
    assert list(data["results"]) == list(ablations.ABLATIONS)
    for group, rows in data["results"].items():
        assert ablations.table(group, rows) in page, group
        # the settings written are the script's, label by label
        assert data["settings"][group] == {label: asdict(s) for label, s in ablations.ABLATIONS[group]}
        assert all(len(per_seed) == 5 for per_seed in rows.values())


def test_cell_is_the_mean_and_the_sample_std():
    # mean (1 + 2 + 6) / 3 = 3; sample variance ((-2)^2 + (-1)^2 + 3^2) / 2 = 7
    assert ablations.cell([1.0, 2.0, 6.0]) == f"3.000 ± {math.sqrt(7):.3f}"
    assert ablations.cell([0.01, 0.03]) == f"0.0200 ± {math.sqrt(2e-4):.4f}"  # 4 decimals below 0.1
    assert ablations.cell([float("nan")]) == "n/a"


def test_summarise_reads_the_last_and_first_three_iterations():
    rows = [dict(score=s, clip_frac=0.1 * i, approx_kl=0.01, explained_var=ev, kl_ref=float(i))
            for i, (s, ev) in enumerate(zip([0.1, 0.2, 0.3, 0.4, 0.5, 0.9], [0, 0, 0, 0.5, float("nan"), 0.7]))]
    got = ablations.summarise(rows)
    assert got["score"] == pytest.approx((0.4 + 0.5 + 0.9) / 3)
    assert got["gain"] == pytest.approx((0.4 + 0.5 + 0.9) / 3 - 0.2)
    assert got["clip_frac"] == pytest.approx(0.1 * 15 / 6) and got["kl_ref"] == 5.0
    assert got["explained_var"] == pytest.approx(0.6)  # NaN (returns that did not vary) left out


def test_one_row_is_rederived_by_running_it():
    """The cheapest row (1 epoch), 5 seeds of 8 iterations, re-run: on the CPU kind that wrote the page each
    seed's summary comes back to float noise; on another kind (AVX2 vs AVX-512, another BLAS) a rounding
    difference may sample other tokens, so the check is the row's mean over seeds, within three standard
    errors of the saved seeds' spread (floored so a row that did not vary still allows float noise)."""
    data = saved()
    want = data["results"]["epochs"]["1"]
    setting = ablations.setting("epochs", "1")
    assert asdict(setting) == data["settings"]["epochs"]["1"]
    got = [ablations.summarise(ablations.run(setting, seed, data["iterations"])) for seed in data["seeds"]]
    n = len(data["seeds"])
    for key in ablations.COLUMNS:
        saved_values = [row[key] for row in want]
        mean_saved = sum(saved_values) / n
        sd_saved = math.sqrt(sum((v - mean_saved) ** 2 for v in saved_values) / (n - 1))
        scale = max(abs(mean_saved), 1e-3)
        allowed = 3 * sd_saved / math.sqrt(n) + 1e-3 * scale
        mean_got = sum(row[key] for row in got) / n
        assert abs(mean_got - mean_saved) <= allowed, (key, mean_got, mean_saved, allowed)


def test_the_baseline_is_learn_tinys_settings():
    from rlhfkit.learn import tiny

    s = ablations.Setting()
    text = Path(tiny.__file__).read_text(encoding="utf-8")
    for fragment in ("lr=1e-2", "kl_coef=0.0", "rollout_batch_size=16", "mini_batch_size=8"):
        assert fragment in text
    assert (s.lr, s.kl_coef, s.rollout, s.mini_batch) == (1e-2, 0.0, 16, 8)
    from rlhfkit.trainers.ppo import PPOConfig

    d = PPOConfig.__dataclass_fields__
    assert (s.epochs, s.lam, s.gamma, s.clip_eps, s.value_clip, s.vf_coef, s.ent_coef, s.max_grad_norm) == tuple(
        d[k].default for k in ("ppo_epochs", "lam", "gamma", "clip_eps", "value_clip_eps", "vf_coef", "ent_coef",
                               "max_grad_norm"))


def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys):
    for argv, words in ((["--seeds", "0"], "--seeds must be >= 1"),
                        (["--tables-from", str(tmp_path / "none.json")], "not a file written by --json")):
        with pytest.raises(SystemExit) as stop:
            ablations.main(argv)
        assert stop.value.code == 2 and words in capsys.readouterr().err
