"""The CPU PPO bench (bench/bench_ppo.py, the figures the README's performance section quotes) on two commits,
back to back on the same machine, with the ratio of their CPU seconds per iteration.

Each commit is extracted with `git archive` into a temporary folder and runs its own bench/bench_ppo.py with
its own src/ first on PYTHONPATH (the working tree is not used, so uncommitted changes are not measured:
commit them first). The sides alternate (before, after, before, after, ... for --rounds), one torch thread
each, so a drift of the machine's load falls on both; the ratio is after / before of the mean CPU seconds per
iteration (below 1: the after commit is faster). Nothing is written to docs/benchmarks.md. Run it on a quiet
machine, nothing else running:

    python bench/before_after.py --before 3a7bf23 --after HEAD                        # default + lora-fp32, 3 iterations
    python bench/before_after.py --before 3a7bf23 --after HEAD --rounds 2              # ~12 min on 2 cores
    python bench/before_after.py --before HEAD~1 --after HEAD --smoke                 # plumbing only, ~1 min

--smoke shrinks the work (4 rollouts of 8 tokens, 2 iterations, `default` only): its figures say nothing
about speed, only that both sides run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE_SETS = ["rollout_batch_size=4", "mini_batch_size=4", "micro_batch_size=4", "max_new_tokens=8"]
RESULT = re.compile(r"^RESULT (\{.*\})$", re.M)  # bench_ppo.py --one prints 'RESULT {json}'


def extract(rev: str, into: Path) -> tuple[Path, str]:
    """`git archive` of `rev` unpacked under `into`; (its folder, its short commit)."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True, text=True)
    if commit.returncode != 0:
        raise SystemExit(f"--before/--after {rev!r}: not a commit of this repository")
    short = commit.stdout.strip()
    folder = into / short
    if not folder.exists():
        folder.mkdir(parents=True)
        archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", short], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(folder)], stdin=archive.stdout, check=True)
        archive.wait()
    return folder, short


def bench_command(tree: Path, config: str, iterations: int, smoke: bool) -> list[str]:
    """The command of one configuration on one side: the tree's own bench_ppo.py in `--one` mode (one process,
    one thread; it prints a RESULT line and writes nothing)."""
    sets = [arg for kv in SMOKE_SETS for arg in ("--set", kv)] if smoke else []
    return [sys.executable, str(tree / "bench" / "bench_ppo.py"), "--one", config, "--iterations", str(iterations),
            "--threads", "1", *sets]


def run_config(tree: Path, command: list[str]) -> dict | str:
    """Run one configuration with its tree's src/ first on PYTHONPATH: its RESULT figures, or 'failed: ...'."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tree / "src"), os.environ.get("PYTHONPATH"))
                                                       if p), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run(command, cwd=tree, capture_output=True, text=True, env=env)
    found = RESULT.findall(proc.stdout)
    if proc.returncode != 0 or not found:
        return f"failed (exit {proc.returncode}): {proc.stderr.strip().splitlines()[-1:]}"
    return json.loads(found[-1])


def mean_of(runs: list[dict], config: str, key: str) -> float | None:
    """The mean of `key` over the runs in which `config` gave figures (None: none did)."""
    values = [r[config][key] for r in runs if isinstance(r.get(config), dict) and key in r[config]]
    return sum(values) / len(values) if values else None


def ratio_table(configs: list[str], before: list[dict], after: list[dict], names: tuple[str, str]) -> str:
    """One row per configuration: mean CPU s per iteration and peak RSS on each side, and after / before.

    before, after: one {config: result} per round, results holding "cpu_s" and "peak_rss_gb"."""
    lines = [f"| config | CPU s/iteration {names[0]} | CPU s/iteration {names[1]} | after / before | "
             f"peak RSS GB {names[0]} | peak RSS GB {names[1]} |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for config in configs:
        cb, ca = mean_of(before, config, "cpu_s"), mean_of(after, config, "cpu_s")
        pb, pa = mean_of(before, config, "peak_rss_gb"), mean_of(after, config, "peak_rss_gb")
        cell = lambda v, f="{:.2f}": "failed" if v is None else f.format(v)  # noqa: E731
        ratio = f"**{ca / cb:.3f}**" if cb and ca else "-"
        lines.append(f"| {config} | {cell(cb)} | {cell(ca)} | {ratio} | {cell(pb)} | {cell(pa)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the older commit (any git revision)")
    ap.add_argument("--after", default="HEAD", help="the newer commit (default HEAD)")
    ap.add_argument("--configs", default="default,lora-fp32",
                    help="bench_ppo.py configurations (default: the README's rlhfkit rows without TRL)")
    ap.add_argument("--iterations", type=int, default=3, help="iterations per configuration, the first a warm-up")
    ap.add_argument("--rounds", type=int, default=1, help="alternating before/after rounds")
    ap.add_argument("--smoke", action="store_true", help="a tiny work to check the plumbing; figures meaningless")
    ap.add_argument("--keep", default=None, metavar="DIR", help="extract the commits here and keep them")
    a = ap.parse_args(argv)
    configs = "default" if a.smoke else a.configs
    iterations = 2 if a.smoke else a.iterations
    with tempfile.TemporaryDirectory(prefix="rlhfkit-before-after-") as tmp:
        where = Path(a.keep or tmp)
        trees = [extract(rev, where) for rev in (a.before, a.after)]
        runs: list[list[dict]] = [[], []]
        for round_ in range(a.rounds):
            for side, (tree, short) in enumerate(trees):
                results = {}
                for config in configs.split(","):
                    command = bench_command(tree, config, iterations, a.smoke)
                    print(f"round {round_ + 1}, {short}: {' '.join(command[1:])}", flush=True)
                    results[config] = run_config(tree, command)
                    print(f"  {json.dumps(results[config])}", flush=True)
                runs[side].append(results)
    print(ratio_table(configs.split(","), runs[0], runs[1], (trees[0][1], trees[1][1])))
    if a.smoke:
        print("--smoke: a reduced work; the ratio says nothing about speed")
    failed = [r for side in runs for results in side for r in results.values() if not isinstance(r, dict)]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
