"""reward=code's sandbox: overhead per execution and executions per second, against a bare subprocess.

One process measures, back to back and interleaved round by round:
- baseline: `python -I -S -c PROGRAM` as a plain subprocess (no limits, no folder, no harness);
- rlimits: Sandbox(isolation="rlimits").run(job) (folder, harness, limits, fork, uid sweep as root);
- bwrap: the same under bubblewrap (skipped where it does not run).
Each runs the same small program with three passing asserts. Overhead = median seconds per execution
of a level / the baseline's. Executions per second: a batch scored by CodeReward with code_workers
threads (default: the cores), wall seconds over the batch.

    python bench/bench_sandbox.py [--repeats 20] [--batch 32] [--no-doc]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import benchdoc  # noqa: E402

from rlhfkit.rewards.code import CodeReward, CodeSettings  # noqa: E402
from rlhfkit.rewards.sandbox import Limits, Sandbox, bwrap_works, interpreter  # noqa: E402

TITLE = "reward=code's sandbox (bench/bench_sandbox.py)"
PROGRAM = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-1, 1) == 0"]


def one_baseline(python: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([python, "-I", "-S", "-c", PROGRAM + "\n".join(TESTS)], check=True, stdin=subprocess.DEVNULL)
    return time.perf_counter() - t0


def one_sandboxed(sandbox: Sandbox) -> float:
    t0 = time.perf_counter()
    ex = sandbox.run({"kind": "asserts", "solution": PROGRAM, "setup": "", "tests": TESTS})
    assert ex.statuses == ["pass"] * 3, ex
    return time.perf_counter() - t0


def per_execution(levels: dict[str, Sandbox], python: str, repeats: int) -> dict[str, list[float]]:
    """Seconds per execution of each level, interleaved round by round (load drifts hit all alike)."""
    times: dict[str, list[float]] = {"baseline": [], **{k: [] for k in levels}}
    for _ in range(repeats):
        times["baseline"].append(one_baseline(python))
        for name, sandbox in levels.items():
            times[name].append(one_sandboxed(sandbox))
    return times


def throughput(sandbox: Sandbox, batch: int, workers: int) -> float:
    """Executions per second of a batch scored by CodeReward over `workers` threads."""
    reward = CodeReward(CodeSettings(code_workers=workers, code_isolation=sandbox.isolation), sandbox)
    t0 = time.perf_counter()
    scores = reward(["p"] * batch, [PROGRAM] * batch, test_list=[TESTS] * batch)
    assert scores == [1.0] * batch
    return batch / (time.perf_counter() - t0)


def render(times: dict[str, list[float]], rates: dict[str, float], args, load: float, python: str) -> str:
    base = statistics.median(times["baseline"])
    lines = [f"1-min load average at start {load:.1f}; {args.repeats} executions per level, interleaved; "
             f"interpreter {python}; throughput: a batch of {args.batch} with code_workers={args.workers}. "
             "The machine was shared with other jobs: compare the ratios, taken in one process.", "",
             "| level | median s / execution | overhead (x bare subprocess) | executions / s (pool) |",
             "| --- | ---: | ---: | ---: |", f"| bare `python -I -S -c` | {base:.3f} | 1.00x | - |"]
    for name in times:
        if name != "baseline":
            med = statistics.median(times[name])
            lines.append(f"| {name} | {med:.3f} | {med / base:.2f}x | {rates[name]:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-doc", action="store_true", help="print only; do not rewrite docs/benchmarks.md")
    args = ap.parse_args(argv)
    python = interpreter()[0]
    limits = Limits(cpu_s=5, wall_s=60.0)
    levels = {"rlimits": Sandbox(limits, "rlimits")}
    if bwrap_works(python)[0]:
        levels["bwrap"] = Sandbox(limits, "bwrap")
    load = os.getloadavg()[0]
    times = per_execution(levels, python, args.repeats)
    rates = {name: throughput(sandbox, args.batch, args.workers) for name, sandbox in levels.items()}
    block = render(times, rates, args, load, python)
    print(block)
    if not args.no_doc:
        benchdoc.write_block("bench_sandbox", TITLE, block)
        print(f"wrote {benchdoc.DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
