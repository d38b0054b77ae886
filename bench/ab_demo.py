"""One rlhfkit command on two source trees at once: an older commit and the working tree.

Both run side by side, one torch thread each (one per core of a 2-core machine, so neither waits on
the other), in fresh processes. Prints each side's peak RSS (the kernel's ru_maxrss), CPU time, and
the sum of every `timing/*` metric over the run's metrics.jsonl, with after / before ratios, and each
side's held-out outcome (its `[eval]` change and accuracy lines). The old
tree is a `git worktree` of REV under the scratch folder, put first on PYTHONPATH.

    python bench/ab_demo.py --before 82233b2 -- kto max_steps=3 num_eval_prompts=0
    python bench/ab_demo.py --before HEAD --after-args cpu_chunk_positions=800 -- grpo env=arithmetic-tool ...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import benchdoc

ROOT = Path(__file__).resolve().parents[1]


def start(args: list[str], out_dir: Path, pythonpath: str | None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    log = open(out_dir.with_suffix(".log"), "w")
    return subprocess.Popen([sys.executable, "-m", "rlhfkit.cli", *args, f"output_dir={out_dir}", "quiet=true"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)


def timings(out_dir: Path) -> dict[str, float]:
    """Each timing/* metric summed over every metrics.jsonl row under out_dir."""
    sums: dict[str, float] = defaultdict(float)
    for path in out_dir.rglob("metrics.jsonl"):
        for line in path.read_text().splitlines():
            for k, v in json.loads(line).items():
                if k.startswith("timing/"):
                    sums[k] += v
    return dict(sums)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="git revision of the old tree")
    ap.add_argument("--after-args", default="", help="extra key=value arguments for the working tree's run only")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the rlhfkit command and its arguments")
    a = ap.parse_args()
    command = [c for c in a.command if c != "--"]
    scratch = Path(benchdoc.scratch_dir())
    tree = scratch / "before-tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), a.before], check=True,
                   stdout=subprocess.DEVNULL)
    try:
        procs = {"before": start(command, scratch / "before", str(tree / "src")),
                 "after": start(command + a.after_args.split(), scratch / "after", None)}
        results = {}
        for side, proc in procs.items():
            _, status, usage = os.wait4(proc.pid, 0)
            rc = os.waitstatus_to_exitcode(status)
            results[side] = {"rc": rc, "peak_gb": usage.ru_maxrss * 1024 / 1e9,
                             "cpu_s": usage.ru_utime + usage.ru_stime, "timings": timings(scratch / side)}
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    b, f = results["before"], results["after"]
    print(f"rlhfkit {' '.join(command)}  (after also: {a.after_args or '-'}; before = {a.before})")
    for name in ("peak_gb", "cpu_s"):
        print(f"  {name:24s} before {b[name]:8.2f}  after {f[name]:8.2f}  after/before {f[name] / b[name]:.2f}")
    for key in sorted(set(b["timings"]) & set(f["timings"])):
        if b["timings"][key] > 0:
            print(f"  {key:24s} before {b['timings'][key]:8.2f}  after {f['timings'][key]:8.2f}  "
                  f"after/before {f['timings'][key] / b['timings'][key]:.2f}")
    for side in ("before", "after"):  # the held-out outcome: the change must not cost learning
        for line in (scratch / f"{side}.log").read_text(errors="replace").splitlines():
            if line.startswith("[eval]") and ("change:" in line or "accuracy" in line):
                print(f"  {side:6s} {line}")
    if b["rc"] or f["rc"]:
        sys.exit(f"exit status: before {b['rc']}, after {f['rc']} (logs under {scratch})")


if __name__ == "__main__":
    main()
