"""How much harness code a reader follows from `rlhfkit ppo` to the first optimiser step, counted on two commits.

What it counts: `rlhfkit ppo` runs through the CLI (`rlhfkit.cli.main`) on the tiny Llama (rlhfkit/learn/tiny.py,
seed 0; LoRA, one iteration of 4 rollouts of 6 tokens, no held-out evaluation) under `sys.setprofile`. Every
Python function of rlhfkit that is *called* is recorded until the first optimiser step (the first call of a
`step` in torch/optim, accelerate's optimiser wrapper included; not the lr schedule's). Counted are the distinct functions (file, first
line, name; nested functions and methods included; lambdas, comprehensions and class bodies left out) in the harness layers:

    cli.py, commands/, trainers/, runtime/, rollout/

and left out: the pure maths (algos/), model internals (models/), diagnostics rules (diagnostics/), data loading
(data/), and core/, rewards/, envs/, estimate/ and the rest. Printed per commit: the functions, the files they
are in and their lines (first to last line of each function), for the whole path (CLI -> first optimiser step,
set-up included) and for the iteration alone (from the first call of the run's `steps()` to the step), and
the harness frames on the stack at the step (the depth a reader descends).

    python bench/read_path.py --before 60561c4 --after HEAD
    python bench/read_path.py --before 60561c4 --after HEAD --list      # also every counted function

Each commit is extracted with `git archive` (committed files only) and run with its own src/ first on the path.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from before_after import extract  # noqa: E402

LAYERS = ("cli.py", "commands/", "trainers/", "runtime/", "rollout/")
RESULT = re.compile(r"^READPATH (\{.*\})$", re.M)
PROMPTS = [f"Write a review of thing number {i}." for i in range(8)]
VOWELS = ("def reward(prompts, completions, **kw):\n"
          "    return [sum(ch in 'aeiou' for ch in c) / max(1, len(c)) for c in completions]\n")


def layer_of(filename: str, package: str) -> str | None:
    """The file's path inside rlhfkit when it is in a harness layer, else None."""
    if not filename.startswith(package):
        return None
    rel = filename[len(package):].lstrip(os.sep)
    return rel if rel.startswith(LAYERS) else None


def span(code) -> int:
    """Lines from a function's first line to its last."""
    lines = [line for _, _, line in code.co_lines() if line is not None]
    return max(lines, default=code.co_firstlineno) - code.co_firstlineno + 1


def side(list_functions: bool) -> dict:
    """In an extracted tree: one PPO iteration under the profiler; the counts."""
    import torch

    import rlhfkit
    from rlhfkit.cli import main as cli_main
    from rlhfkit.learn.tiny import build_tiny_model, build_tokenizer

    torch.set_num_threads(1)
    package = str(Path(rlhfkit.__file__).resolve().parent)
    with tempfile.TemporaryDirectory(prefix="rlhfkit-read-path-") as tmp:
        tmp = Path(tmp)
        tok = build_tokenizer()
        build_tiny_model(len(tok)).save_pretrained(tmp / "tiny")
        tok.save_pretrained(tmp / "tiny")
        (tmp / "prompts.txt").write_text("\n".join(PROMPTS))
        (tmp / "vowels.py").write_text(VOWELS)
        argv = ["ppo", f"model={tmp / 'tiny'}", f"prompts={tmp / 'prompts.txt'}",
                f"reward=python:{tmp / 'vowels.py'}:reward", "iterations=1", "rollout_batch_size=4",
                "mini_batch_size=4", "micro_batch_size=2", "max_new_tokens=6", "num_eval_prompts=0", "dtype=fp32",
                f"output_dir={tmp / 'runs'}", "run_name=t", "quiet=true", "tensorboard=false", "save_every=0"]
        seen: dict = {}  # (file, line, name) -> (lines, in the iteration)
        state = {"iteration": False, "done": False, "stack": []}

        def profile(frame, event, arg):
            if event != "call" or state["done"]:
                return
            code = frame.f_code
            name = code.co_name
            where = code.co_filename.replace(os.sep, "/")
            if name == "step" and ("/torch/optim/" in where and "lr_scheduler" not in where
                                   or where.endswith("accelerate/optimizer.py")):
                stack, f = [], frame.f_back
                while f is not None:
                    rel = layer_of(str(Path(f.f_code.co_filename).resolve()), package)
                    if rel is not None:
                        stack.append(f"{rel}:{f.f_code.co_name}")
                    f = f.f_back
                state["stack"], state["done"] = stack[::-1], True
                return
            rel = layer_of(str(Path(code.co_filename).resolve()), package)
            if rel is None or name.startswith("<") or not code.co_flags & inspect.CO_NEWLOCALS:  # a class body
                return
            if name == "steps" and rel.startswith("runtime/run"):
                state["iteration"] = True
            key = (rel, code.co_firstlineno, getattr(code, "co_qualname", name))
            lines, in_it = seen.get(key, (span(code), False))
            seen[key] = (lines, in_it or state["iteration"])

        sys.setprofile(profile)
        try:
            code = cli_main(argv)
        finally:
            sys.setprofile(None)
        if code != 0 or not state["done"]:
            raise SystemExit(f"the PPO run did not reach an optimiser step (exit {code})")

    def summary(keys) -> dict:
        keys = list(keys)
        return {"functions": len(keys), "files": len({k[0] for k in keys}), "lines": sum(seen[k][0] for k in keys)}

    out = {"path": summary(seen), "iteration": summary(k for k in seen if seen[k][1]),
           "stack_at_step": state["stack"]}
    if list_functions:
        out["list"] = sorted(f"{k[0]}:{k[1]} {k[2]}{' (iteration)' if seen[k][1] else ''}" for k in seen)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", help="the older commit")
    ap.add_argument("--after", default="HEAD", help="the newer commit (default HEAD)")
    ap.add_argument("--list", action="store_true", help="print every counted function")
    ap.add_argument("--side", action="store_true", help=argparse.SUPPRESS)  # inside an extracted tree
    a = ap.parse_args(argv)
    if a.side:
        print("READPATH " + json.dumps(side(a.list)), flush=True)
        return 0
    revs = [r for r in (a.before, a.after) if r]
    rows = []
    with tempfile.TemporaryDirectory(prefix="rlhfkit-read-path-") as tmp:
        for rev in revs:
            tree, short = extract(rev, Path(tmp))
            env = {**os.environ, "PYTHONPATH": str(tree / "src"), "OMP_NUM_THREADS": "1",
                   "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--side",
                                   *(["--list"] if a.list else [])], cwd=tree, capture_output=True, text=True, env=env)
            found = RESULT.findall(proc.stdout)
            if proc.returncode != 0 or not found:
                print(proc.stderr[-3000:])
                raise SystemExit(f"{short}: the count did not finish (exit {proc.returncode})")
            rows.append((short, json.loads(found[-1])))
    print("| commit | CLI -> first optimiser step: functions / files / lines | the iteration: functions / files / "
          "lines | harness frames on the stack at the step |")
    print("| --- | ---: | ---: | ---: |")
    for short, r in rows:
        p, it = r["path"], r["iteration"]
        print(f"| {short} | {p['functions']} / {p['files']} / {p['lines']} | {it['functions']} / {it['files']} / "
              f"{it['lines']} | {len(r['stack_at_step'])} |")
    for short, r in rows:
        print(f"\n{short} stack at the step: {' -> '.join(r['stack_at_step'])}")
        for line in r.get("list", []):
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
