"""Entry 34's tables (docs/learn/34-has-it-converged.md), recomputed from the seed folders shipped here.

    python docs/learn/examples/long-runs/table.py           # print the tables
    python docs/learn/examples/long-runs/table.py --write   # and put them into the page

Each seedS/ folder is one `rlhfkit ppo iterations=18 seed=S save_every=0` run (metrics.jsonl,
config.yaml, summary.json). Adding a seed's folder and running `--write` regenerates the page's tables.
Standard library only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PAGE = HERE.parents[1] / "34-has-it-converged.md"
BLOCKS = ((0, 5), (6, 11), (12, 17))  # inclusive iteration ranges
METRICS = (("score", "rollout/score_mean"), ("penalised reward", "rollout/reward_mean"), ("rollout KL", "rollout/kl"),
           ("approx KL", "params/approx_kl"), ("clip fraction", "params/policy_clip_frac"),
           ("value loss", "loss/value"), ("entropy", "rollout/entropy"))
BEGIN, END = "<!-- long-runs tables: begin (table.py --write) -->", "<!-- long-runs tables: end -->"


def seed_folders(root: Path = HERE) -> list[Path]:
    """The shipped seedS folders, by seed number."""
    found = [p for p in root.iterdir() if p.is_dir() and re.fullmatch(r"seed\d+", p.name)]
    return sorted(found, key=lambda p: int(p.name[4:]))


def metrics(folder: Path) -> list[dict]:
    """metrics.jsonl's rows, one dict per iteration."""
    lines = (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def block_mean(rows: list[dict], key: str, first: int, last: int) -> float:
    """Mean of `key` over iterations first..last (inclusive) of one run."""
    values = [r[key] for r in rows if first <= r["iteration"] <= last]
    return sum(values) / len(values)


def cell(values: list[float]) -> str:
    """'mean [min, max]' over seeds, 3 significant digits; the mean alone for one seed."""
    mean = f"{sum(values) / len(values):#.3g}"
    return mean if len(values) == 1 else f"{mean} [{min(values):#.3g}, {max(values):#.3g}]"


def block_table(runs: list[list[dict]]) -> str:
    """Markdown table: one row per iteration block, each metric's per-seed block means summarised by `cell`."""
    head = "| iterations | " + " | ".join(name for name, _ in METRICS) + " |"
    rule = "|---" * (len(METRICS) + 1) + "|"
    body = [f"| {a}-{b} | " + " | ".join(cell([block_mean(r, key, a, b) for r in runs]) for _, key in METRICS) + " |"
            for a, b in BLOCKS]
    return "\n".join([head, rule, *body])


def held_out_table(folders: list[Path]) -> str:
    """Markdown table: each seed's held-out mean reward before and after training (summary.json)."""
    rows = ["| seed | held-out reward before | after | change |", "|---|---|---|---|"]
    for folder in folders:
        s = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        before, after = s["eval_before"]["mean"], s["eval_after"]["mean"]
        rows.append(f"| {folder.name[4:]} | {before:.3f} | {after:.3f} | {after - before:+.3f} |")
    return "\n".join(rows)


def tables(root: Path = HERE) -> str:
    """Both tables, as they stand between the page's markers."""
    folders = seed_folders(root)
    return block_table([metrics(f) for f in folders]) + "\n\n" + held_out_table(folders)


def write(page: Path = PAGE, root: Path = HERE) -> None:
    """Replace the text between the page's markers with `tables()`."""
    text = page.read_text(encoding="utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    page.write_text(text[:start] + "\n" + tables(root) + "\n" + text[end:], encoding="utf-8")


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        write()
    print(tables())
