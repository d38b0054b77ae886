"""Entry 31's measured A/B (docs/learn/31-the-critic.md): the shipped run folders of
docs/learn/examples/critic-ab are paired runs that differ only in `critic_model`, and the page's table
is what their metrics.jsonl files hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AB = ROOT / "docs" / "learn" / "examples" / "critic-ab"
PAGE = ROOT / "docs" / "learn" / "31-the-critic.md"
ARMS = {"shared trunk": "shared", "separate critic": "separate"}
# config keys that may differ between the two arms of one seed (where and how long the run went, and the critic)
FREE_KEYS = {"output_dir", "run_name", "critic_model", "iterations", "num_eval_prompts"}
RECORDED_WITH = "3a7bf23"  # the commit whose code recorded the A/B runs


def metrics(folder: Path) -> list[dict]:
    """The rows of a run folder's metrics.jsonl, one dict per iteration."""
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
            if line.strip()]


def config(folder: Path) -> dict[str, str]:
    """config.yaml as flat `key: value` strings (the trainer writes one key per line)."""
    lines = (folder / "config.yaml").read_text(encoding="utf-8").splitlines()
    return dict(line.split(": ", 1) for line in lines if ": " in line and not line.startswith(" "))


def table_cells(rows: list[dict], k: int) -> list[str]:
    """One A/B table row's numbers from the first `k` iterations of a run: the means of the score, value
    loss, approx KL, clip fraction, grad norm and seconds per iteration, and at iteration k-1 the KL to
    the reference and the critic's gap |value_mean - return_mean|, each to 3 significant digits."""
    head = rows[:k]

    def mean(key: str) -> float:
        return sum(r[key] for r in head) / k

    last = head[-1]
    seconds = sum(r["timing/rollout_s"] + r["timing/update_s"] for r in head) / k
    values = (mean("rollout/score_mean"), mean("loss/value"), abs(last["rollout/value_mean"] - last["rollout/return_mean"]),
              mean("params/approx_kl"), mean("params/policy_clip_frac"), mean("params/grad_norm"), last["rollout/kl"],
              seconds)
    return [f"{v:.3g}" for v in values]


def page_table() -> list[list[str]]:
    """The A/B table of the page: its rows' cells, header and rule excluded."""
    text = PAGE.read_text(encoding="utf-8")
    table = text[text.index("| arm | seed |"):].split("\n\n")[0].splitlines()[2:]
    return [[c.strip() for c in row.strip("|").split("|")] for row in table]


def test_the_ab_runs_are_pairs_that_differ_only_in_the_critic():
    folders = sorted(p for p in AB.iterdir() if p.is_dir())
    names = {p.name for p in folders}
    seeds = sorted({int(re.fullmatch(r"(shared|separate)-seed(\d+)", n).group(2)) for n in names})
    assert names == {f"{arm}-seed{s}" for arm in ARMS.values() for s in seeds} and len(seeds) >= 1
    for s in seeds:
        shared, separate = config(AB / f"shared-seed{s}"), config(AB / f"separate-seed{s}")
        assert shared["critic_model"] == "null" and separate["critic_model"] != "null"
        assert shared["seed"] == separate["seed"] == str(s)
        assert {k for k in shared.keys() | separate.keys() if shared.get(k) != separate.get(k)} <= FREE_KEYS
        assert shared["model"] == "smollm2-135m-instruct" and not (AB / f"separate-seed{s}" / "final").exists()
        # the first rollout is sampled before any update from the same policy with the same seed: one number
        first = [metrics(AB / f"{arm}-seed{s}")[0] for arm in ("shared", "separate")]
        assert first[0]["rollout/score_mean"] == first[1]["rollout/score_mean"]


def test_the_page_table_is_the_shipped_metrics():
    text = " ".join(PAGE.read_text(encoding="utf-8").split())
    assert {config(p)["dtype"] for p in AB.iterdir() if p.is_dir()} == {"bf16"}
    assert f"in bf16 (`dtype: bf16`) with the code of commit {RECORDED_WITH}" in text
    k = int(re.search(r"the first (\d+) iterations of each run", text).group(1))
    rows = page_table()
    assert len(rows) == 2 * len({p.name.split("-")[1] for p in AB.iterdir() if p.is_dir()})
    for arm, seed, *cells in rows:
        run = metrics(AB / f"{ARMS[arm]}-seed{seed}")
        assert len(run) >= k
        assert cells[:8] == table_cells(run, k), (arm, seed)


@pytest.mark.parametrize("arm", sorted(ARMS.values()))
def test_the_ab_runs_ship_metrics_and_config_only(arm):
    folders = sorted(AB.glob(f"{arm}-seed*"))
    assert folders, f"no {arm}-seed* run in {AB}"
    for folder in folders:
        assert {p.name for p in folder.iterdir()} == {"config.yaml", "metrics.jsonl"}, folder
