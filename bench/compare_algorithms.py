"""Compare the methods of one family at the same wall-clock budget, each with its own defaults:

    .venv/bin/python bench/compare_algorithms.py rl --budget-min 20 --seeds 0 1       # grpo dapo gspo reinforce_pp rloo
    .venv/bin/python bench/compare_algorithms.py prefs --budget-min 10 --seeds 0 1    # dpo kto simpo orpo online-dpo
    ... --only grpo,dapo   ... --set dtype=fp32 num_eval_prompts=50   ... --doc (write the table into docs/algorithms.md)

rl: held-out accuracy of the arithmetic task (`builtin:arithmetic`, exact match: the mean reward is the
accuracy) before and after training. prefs: the judged (VADER) win rate over the starting model on the
held-out review prompts, and the mean judged score before and after.

Each run is `rlhfkit METHOD seed=S` with a length no budget reaches; when the budget is spent (counted from the
launch: model load and the evaluation before training are in it, the same for every method of a family; never
before the first step is logged) it gets SIGTERM: the harness finishes its step and writes a checkpoint. Then
`rlhfkit METHOD --resume RUN iterations=N` (max_steps=N for dpo/kto/simpo/orpo), N = the steps done, has no step
left: it runs the evaluation after training and writes summary.json. Runs go to --out (kept), one log and one
row file (NAME.row.json) each; --reuse takes the rows already there, so an interrupted series goes on where it
stopped (delete the run directory of a run that was cut off).

--clock wall (default) counts the budget on the wall clock; --clock cpu counts the CPU time of the run's process
(user + system, all its threads), which equals the wall clock of a run alone on --threads idle cores and stays fair
when the machine is shared. --jobs J runs J methods at once, each with --threads T torch threads (J x T <= cores
keeps every run on its own cores).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "algorithms.md"
FAMILIES = {"rl": ("grpo", "dapo", "gspo", "reinforce_pp", "rloo"), "prefs": ("dpo", "kto", "simpo", "orpo", "online-dpo")}
EPOCH_BASED = ("dpo", "kto", "simpo", "orpo")  # length in epochs / max_steps; the others in iterations


def length_args(method: str, steps: int | None = None) -> list[str]:
    """A length no budget reaches (steps None), or exactly `steps` optimiser steps / iterations."""
    if method in EPOCH_BASED:
        return ["epochs=1000"] if steps is None else [f"max_steps={steps}"]
    return [f"iterations={100_000 if steps is None else steps}"]


def logged_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU time of a process and its children (all threads)."""
    try:
        procs = [proc, *proc.children(recursive=True)]
        return sum(t.user + t.system for t in (p.cpu_times() for p in procs))
    except psutil.NoSuchProcess:
        return 0.0


def run_one(method: str, seed: int, budget_s: float, out: Path, extra: list[str], clock: str = "wall",
            threads: int | None = None) -> dict:
    """One budgeted run, then its evaluation; returns the table row."""
    from rlhfkit.core.run_files import latest_checkpoint

    name = f"{method}-s{seed}"
    run_dir = out / name
    cli = [sys.executable, "-m", "rlhfkit.cli", method]
    env = dict(os.environ)
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    log = (out / f"{name}.log").open("w")
    t0 = time.time()
    proc = subprocess.Popen([*cli, f"seed={seed}", f"output_dir={out}", f"run_name={name}", "quiet=true",
                             *length_args(method), *extra], stdout=log, stderr=subprocess.STDOUT, env=env)
    watched, cpu_s = psutil.Process(proc.pid), 0.0
    while proc.poll() is None:
        cpu_s = max(cpu_s, cpu_seconds(watched))
        spent = time.time() - t0 if clock == "wall" else cpu_s
        if spent >= budget_s and logged_steps(run_dir) >= 1:
            proc.send_signal(signal.SIGTERM)  # the step in progress finishes, then a checkpoint
            proc.wait()
            break
        time.sleep(1.0)
    train_s = time.time() - t0
    if proc.returncode not in (0, 128 + signal.SIGTERM):
        raise SystemExit(f"{name}: exit code {proc.returncode}; see {out / (name + '.log')}")
    steps = int(latest_checkpoint(run_dir).name.split("-")[1])
    if proc.returncode != 0:  # stopped by the budget: evaluate the checkpoint
        subprocess.run([*cli, "--resume", str(run_dir), *length_args(method, steps)], stdout=log,
                       stderr=subprocess.STDOUT, check=True, env=env)
    summary = json.loads((run_dir / "summary.json").read_text())
    row = {"method": method, "seed": seed, "steps": steps, "train_min": train_s / 60, "train_cpu_min": cpu_s / 60,
           "total_min": (time.time() - t0) / 60, **result(summary)}
    (out / f"{name}.row.json").write_text(json.dumps(row))
    return row


def result(summary: dict) -> dict:
    """before, after and the family's headline figure from a run's summary.json."""
    if "win_rate" in summary:  # preference family: judged scores are means already
        return {"before": summary["eval_before"], "after": summary["eval_after"], "win_rate": summary["win_rate"]}
    before, after = summary["eval_before"]["mean"], summary["eval_after"]["mean"]
    return {"before": before, "after": after, "change": after - before}


def table(rows: list[dict], family: str, budget_min: float, clock: str = "wall", threads: int | None = None) -> str:
    """Markdown: one row per run, then the mean of each method over its seeds."""
    head = "accuracy before -> after | change" if family == "rl" else "judged score before -> after | win rate"
    key = "change" if family == "rl" else "win_rate"
    what = "wall clock" if clock == "wall" else "CPU time (user + system of the run's process)"
    on = f", {threads} torch thread{'s' if threads > 1 else ''} per run" if threads else ""
    lines = [f"Budget {budget_min:g} min of {what} per run from its launch{on} (load and evaluation before "
             "training included).", "", f"| method | seed | steps | {head} | training wall min | CPU min |",
             "|---|---|---|---|---|---|---|"]
    fmt = "{:.1%}" if family == "rl" else "{:.3f}"
    for r in rows:
        figure = f"{r[key]:+.1%}" if family == "rl" else f"{r[key]:.1%}"
        wall, cpu = ("n/a" if r.get(k) is None else f"{r[k]:.1f}" for k in ("train_min", "train_cpu_min"))
        lines.append(f"| `{r['method']}` | {r['seed']} | {r['steps']} | {fmt.format(r['before'])} -> "
                     f"{fmt.format(r['after'])} | {figure} | {wall} | {cpu} |")
    lines += ["", f"| method | runs | mean {key} |", "|---|---|---|"]
    for method in dict.fromkeys(r["method"] for r in rows):
        values = [r[key] for r in rows if r["method"] == method]
        mean = sum(values) / len(values)
        lines.append(f"| `{method}` | {len(values)} | {mean:+.1%} |" if family == "rl" else
                     f"| `{method}` | {len(values)} | {mean:.1%} |")
    return "\n".join(lines) + "\n"


def write_doc(text: str, family: str) -> None:
    start, end = f"<!-- compare_algorithms:{family}:start -->", f"<!-- compare_algorithms:{family}:end -->"
    doc = DOC.read_text()
    if start not in doc or end not in doc:
        raise SystemExit(f"{DOC}: markers {start} ... {end} not found")
    before, rest = doc.split(start, 1)
    DOC.write_text(before + start + "\n" + text + end + rest.split(end, 1)[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("--budget-min", type=float, required=True, help="minutes per run, on --clock")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="count the budget in wall-clock time or in the run's CPU time (fair on a shared machine)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per run (OMP_NUM_THREADS)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--only", default=None, help="comma-separated methods of the family (default: all)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "compare")
    ap.add_argument("--doc", action="store_true", help="write the table into docs/algorithms.md")
    ap.add_argument("--reuse", action="store_true", help="take the rows of runs already in --out (NAME.row.json)")
    args = ap.parse_args(argv)
    methods = args.only.split(",") if args.only else FAMILIES[args.family]
    unknown = [m for m in methods if m not in FAMILIES[args.family]]
    if unknown:
        ap.error(f"--only: {', '.join(unknown)} not in the {args.family} family ({', '.join(FAMILIES[args.family])})")
    args.out.mkdir(parents=True, exist_ok=True)
    plan = [(m, s) for s in args.seeds for m in methods]

    def row(method: str, seed: int) -> dict:
        done = args.out / f"{method}-s{seed}.row.json"
        if args.reuse and done.exists():
            return json.loads(done.read_text())
        return run_one(method, seed, args.budget_min * 60, args.out, args.set, args.clock, args.threads)

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda ms: row(*ms), plan))
    text = table(rows, args.family, args.budget_min, args.clock, args.threads)
    print(text)
    (args.out / f"{args.family}.json").write_text(json.dumps(rows, indent=1))
    if args.doc:
        write_doc(text, args.family)
    return 0


if __name__ == "__main__":
    sys.exit(main())
