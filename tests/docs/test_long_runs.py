"""Entry 34's long runs (docs/learn/34-has-it-converged.md): the seed folders of
docs/learn/examples/long-runs are the 18-iteration demo run to its end with different seeds, and the
page's tables are what their metrics.jsonl and summary.json files hold (adding a seed's folder means
running `python docs/learn/examples/long-runs/table.py --write`)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from rlhfkit.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
RUNS = ROOT / "docs" / "learn" / "examples" / "long-runs"
PAGE = ROOT / "docs" / "learn" / "34-has-it-converged.md"
RECORDED_WITH = "5dfa0b0"  # the commit whose code recorded the runs
FREE_KEYS = {"seed", "run_name", "output_dir"}  # config keys that may differ between seeds
# the findings the page describes, per seed (a seed added later needs only exit status 0)
DOCTOR_SAYS = {"seed0": [],
               "seed1": [("rollout_kl_high", "warning", 17), ("stop_fraction_falling", "warning", 8),
                         ("value_loss_not_learning", "warning", 14)],
               "seed2": [("explained_variance_low", "warning", 5), ("loss_spike", "warning", 15),
                         ("value_loss_not_learning", "warning", 11)]}
BLOCKS = ((0, 5), (6, 11), (12, 17))
COLUMNS = ("rollout/score_mean", "rollout/reward_mean", "rollout/kl", "params/approx_kl", "params/policy_clip_frac",
           "loss/value", "rollout/entropy")


def seed_folders() -> list[Path]:
    return sorted((p for p in RUNS.iterdir() if p.is_dir()), key=lambda p: p.name)


def metrics(folder: Path) -> list[dict]:
    lines = (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def config(folder: Path) -> dict[str, str]:
    """config.yaml as flat `key: value` strings (the trainer writes one key per line)."""
    lines = (folder / "config.yaml").read_text(encoding="utf-8").splitlines()
    return dict(line.split(": ", 1) for line in lines if ": " in line and not line.startswith(" "))


def page_tables() -> list[list[list[str]]]:
    """The tables between the page's markers: each a list of rows of cells, header and rule excluded."""
    text = PAGE.read_text(encoding="utf-8")
    block = text[text.index("<!-- long-runs tables: begin"):text.index("<!-- long-runs tables: end")]
    tables = [t for t in block.split("\n\n") if "|---" in t]
    return [[[c.strip() for c in row.strip().strip("|").split("|")] for row in t.strip().splitlines()
             if row.startswith("|")][2:] for t in tables]


def test_the_seeds_differ_only_in_their_seed():
    folders = seed_folders()
    assert folders and all(re.fullmatch(r"seed\d+", p.name) for p in folders)
    configs = [config(p) for p in folders]
    for folder, cfg in zip(folders, configs):
        assert cfg["seed"] == folder.name[4:] and cfg["iterations"] == "18" and cfg["dtype"] == "bf16"
        assert cfg["model"] == "smollm2-135m-instruct" and cfg["save_every"] == "0"
        assert [r["iteration"] for r in metrics(folder)] == list(range(18)), folder.name
        assert {p.name for p in folder.iterdir()} == {"config.yaml", "metrics.jsonl", "summary.json"}, folder
        summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        assert "samples" not in summary["eval_before"] and "samples" not in summary["eval_after"]
        differing = {k for k in cfg.keys() | configs[0].keys() if cfg.get(k) != configs[0].get(k)}
        assert differing <= FREE_KEYS, (folder.name, differing)
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    assert f"in bf16 (`dtype: bf16`) with the code of commit {RECORDED_WITH}" in text
    readme = " ".join((ROOT / "docs" / "learn" / "README.md").read_text(encoding="utf-8").split())
    assert "34-has-it-converged.md" in readme and f"in bf16 with the code of commit {RECORDED_WITH}" in readme


def test_the_page_tables_are_the_shipped_metrics():
    """Every figure of the page's two tables, recomputed here from the shipped files."""
    runs = [metrics(p) for p in seed_folders()]
    blocks, held_out = page_tables()
    assert [row[0] for row in blocks] == [f"{a}-{b}" for a, b in BLOCKS]
    for (a, b), row in zip(BLOCKS, blocks):
        for key, got in zip(COLUMNS, row[1:], strict=True):
            per_seed = [sum(r[key] for r in run[a:b + 1]) / (b - a + 1) for run in runs]
            want = f"{sum(per_seed) / len(per_seed):#.3g}"
            if len(runs) > 1:
                want += f" [{min(per_seed):#.3g}, {max(per_seed):#.3g}]"
            assert got == want, (a, b, key)
    assert [row[0] for row in held_out] == [p.name[4:] for p in seed_folders()]
    for folder, (_, before, after, change) in zip(seed_folders(), held_out):
        s = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        b, a = s["eval_before"]["mean"], s["eval_after"]["mean"]
        assert (before, after, change) == (f"{b:.3f}", f"{a:.3f}", f"{a - b:+.3f}"), folder.name


def test_the_table_script_writes_what_the_page_holds():
    spec = importlib.util.spec_from_file_location("long_runs_table", RUNS / "table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    text = PAGE.read_text(encoding="utf-8")
    assert f"{table.BEGIN}\n{table.tables()}\n{table.END}" in text


def test_the_doctor_finds_what_the_page_says(capsys):
    """Each seed: warnings at most (exit status 0), and seed 0's only one is rollout_kl_high at iteration 11;
    reward_flat's window is longer than the run, so it cannot fire."""
    from rlhfkit.diagnostics import Thresholds

    assert Thresholds().reward_flat_window > 18 and Thresholds().rollout_kl_warn == 10
    for folder in seed_folders():
        assert cli_main(["doctor", str(folder), "--json"]) == 0
        found = json.loads(capsys.readouterr().out)
        assert "reward_flat" not in {f["rule"] for f in found}
        serious = [(f["rule"], f["severity"], f["iteration"]) for f in found if f["severity"] != "info"]
        if folder.name in DOCTOR_SAYS:
            assert sorted(serious) == DOCTOR_SAYS[folder.name], folder.name
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    assert '"0 critical, 0 warning, 0 info: healthy (exit status 0)"' in text and "`reward_flat_window` = 25" in text
    for rule, _, iteration in DOCTOR_SAYS["seed1"] + DOCTOR_SAYS["seed2"]:
        assert f"`{rule}` at iteration {iteration}" in text, rule


def test_the_seed0_figures_in_the_prose_are_its_metrics():
    """The plateau and the KL range the page and entry 21 give, from seed 0's metrics.jsonl."""
    rows = metrics(RUNS / "seed0")

    def mean(key: str, first: int, last: int) -> float:
        return sum(r[key] for r in rows[first:last + 1]) / (last - first + 1)

    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    assert f"mean {mean('rollout/score_mean', 10, 17):.3f} over iterations 10-17" in text
    assert f"mean {mean('rollout/kl', 10, 17):.1f} over iterations 10-17" in text
    assert f"0.06 x {mean('rollout/kl', 10, 17):.1f} = {0.06 * mean('rollout/kl', 10, 17):.2f} of reward" in text
    assert (f"averaged {mean('rollout/reward_mean', 0, 9):.3f} over iterations 0-9 and "
            f"{mean('rollout/reward_mean', 10, 17):.3f} over 10-17") in text
    first, last = rows[0]["rollout/reward_mean"], rows[-1]["rollout/reward_mean"]
    assert f"(seed 0: {first:.3f} at iteration 0, {last:.3f} at the end;" in text and last < first
    assert f"It rose from {rows[0]['rollout/score_mean']:.3f} at iteration 0 to {rows[8]['rollout/score_mean']:.2f}" in text
    later = [r["rollout/score_mean"] for r in rows[9:]]
    assert f"between {min(later):.2f} and {max(later):.2f} (mean" in text
    kl_later = [r["rollout/kl"] for r in rows[9:]]
    assert f"to {rows[8]['rollout/kl']:.1f} by iteration 8, then stayed between {min(kl_later):.1f} and {max(kl_later):.1f}" in text
    others = [metrics(RUNS / f"seed{s}") for s in (1, 2)]
    score = " and ".join(f"{sum(r['rollout/score_mean'] for r in run[10:]) / 8:.3f}" for run in others)
    kl = " and ".join(f"{sum(r['rollout/kl'] for r in run[10:]) / 8:.1f}" for run in others)
    assert f"score means {score} over iterations 10-17, KL means {kl} there" in text
    every = [r["rollout/kl"] for folder in seed_folders() for r in metrics(folder)[5:]]
    span = f"{min(every):.1f} to {max(every):.1f}"
    defaults = " ".join((ROOT / "docs" / "learn" / "21-defaults-and-beyond.md").read_text(encoding="utf-8").split())
    assert f"0.06 kept {span} nats from iteration 5 on over the three seeds of entry 34" in defaults
