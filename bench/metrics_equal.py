"""Every training command's tiny-model metrics on two commits, compared key by key.

Each commit is extracted with `git archive` (bench/before_after.py `extract`: committed files only) and runs,
in one process with its own src/ and tests/ first on the path, every command of its tests/command_matrix.py on
the tiny Llama (tests/tiny_lm.py, seed 0) with two steps (iterations=2 / max_steps=2) and one torch thread.
The non-timing metrics of every logged row (metrics.jsonl) and the summary's numbers (summary.json) of the two
sides are then compared key by key, exactly (same seed, same machine: a refactor must change no value). Keys
named timing/*, throughput/*, *_s, *_per_s, memory/*, run_dir and paths are left out.

    python bench/metrics_equal.py --before 6cff9b8 --after HEAD
    python bench/metrics_equal.py --before HEAD~1 --after HEAD --only ppo-lora-top-trunk,sft

Prints one line per command (equal / the keys that differ) and exits 1 when any value differs or a side fails.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from before_after import extract  # noqa: E402

RESULT = re.compile(r"^METRICS (\{.*\})$", re.M)
SKIP = re.compile(r"^(timing/|throughput/|memory/)|(_s|_per_s|_gb|_mb)$|^(run_dir|final|merged|path)$")


def two_steps(argv: list[str]) -> list[str]:
    """The command line with its step count set to 2."""
    return [re.sub(r"^(iterations|max_steps)=\d+$", r"\1=2", a) for a in argv]


def numbers(value, prefix: str = "") -> dict:
    """{dotted key: number or string} of a nested summary, timing keys left out."""
    out: dict = {}
    if isinstance(value, dict):
        for k, v in value.items():
            if not SKIP.search(str(k)):
                out.update(numbers(v, f"{prefix}{k}."))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.update(numbers(v, f"{prefix}{i}."))
    elif isinstance(value, (int, float, str, bool)) or value is None:
        if not (isinstance(value, str) and ("/" in value or "\\" in value)):  # paths differ per side
            out[prefix.rstrip(".")] = value
    return out


def side(only: list[str]) -> dict:
    """In the extracted tree: run each command; {command: {key: value}} of its rows and summary."""
    import torch

    sys.path.insert(0, str(Path.cwd() / "tests"))
    from rlhfkit.cli import main as cli_main

    from command_matrix import COMMANDS, command_line
    from tiny_lm import build_tiny_model, build_tokenizer

    torch.set_num_threads(1)
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="rlhfkit-metrics-") as tmp:
        model_dir = Path(tmp) / "tiny"
        tok = build_tokenizer()
        build_tiny_model(len(tok)).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        for name in COMMANDS:
            if only and name not in only:
                continue
            work = Path(tmp) / name
            work.mkdir()
            argv = two_steps(command_line(name, work, model_dir))
            try:
                code = cli_main(argv)
            except SystemExit as e:
                code = e.code
            run = work / "runs" / "t"
            if code != 0 or not (run / "summary.json").exists():
                out[name] = f"failed (exit {code})"
                continue
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
            out[name] = {**numbers(rows, "rows."), **numbers(json.loads((run / "summary.json").read_text()), "summary.")}
    return out


def compare(a, b) -> str:
    """'equal', or what differs between two sides' values of one command."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return f"before: {a if not isinstance(a, dict) else 'ran'}; after: {b if not isinstance(b, dict) else 'ran'}"
    differ = [k for k in sorted(set(a) | set(b)) if a.get(k, "<missing>") != b.get(k, "<missing>")]
    if not differ:
        return f"equal ({len(a)} values)"
    shown = ", ".join(f"{k}: {a.get(k, '<missing>')} -> {b.get(k, '<missing>')}" for k in differ[:6])
    return f"DIFFER in {len(differ)} of {len(set(a) | set(b))}: {shown}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="the older commit")
    ap.add_argument("--after", default="HEAD", help="the newer commit (default HEAD)")
    ap.add_argument("--only", default="", help="comma-separated command ids of tests/command_matrix.py")
    ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)  # inside an extracted tree
    a = ap.parse_args(argv)
    only = [n for n in a.only.split(",") if n]
    if a.side:
        print("METRICS " + json.dumps(side(only)), flush=True)
        return 0
    if not a.before:
        ap.error("--before is required")
    results = []
    with tempfile.TemporaryDirectory(prefix="rlhfkit-metrics-equal-") as tmp:
        for rev in (a.before, a.after):
            tree, short = extract(rev, Path(tmp))
            env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1",
                   "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
            print(f"{short}: running the command matrix ...", flush=True)
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--side", "--only", a.only],
                                  cwd=tree, capture_output=True, text=True, env=env)
            found = RESULT.findall(proc.stdout)
            if proc.returncode != 0 or not found:
                print(proc.stderr[-3000:])
                raise SystemExit(f"{short}: the matrix did not finish (exit {proc.returncode})")
            results.append((short, json.loads(found[-1])))
    (b_name, before), (a_name, after) = results
    bad = 0
    for name in sorted(set(before) | set(after)):
        verdict = compare(before.get(name, "absent"), after.get(name, "absent"))
        bad += not verdict.startswith("equal")
        print(f"{name:28s} {verdict}")
    print(f"{b_name} -> {a_name}: {len(before) - bad} of {len(before)} commands equal")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
