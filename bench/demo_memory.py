"""Peak resident memory of every trainer's default demo, against `rlhfkit estimate-memory`.

Each demo runs in a fresh process under bench/memory_phases.py (phases wrapped, each phase's exact
peak) with one torch thread; the whole run's peak is the highest of the phases' exact peaks (the
kernel's VmHWM), so the memory figures do not depend on the machine's load. Runs are
shortened only where the per-step peak does not change: fewer iterations / optimiser steps, every
evaluation phase kept (they sample, and can be the peak). The GRPO family runs whole: an update runs
the rows of the groups whose rewards differ, few at first on the arithmetic task, all later. The estimate is `estimate-memory` with
the demo's own shapes (`ESTIMATES`).

Results accumulate in a JSON file under a label (`--label before` on the old code, `--label after`
on the new), so a long series can be stopped and resumed; `--write` puts the table into
docs/benchmarks.md.

    python bench/demo_memory.py --label after [--only grpo,dpo] [--results runs/demo_memory.json]
    python bench/demo_memory.py --write            # the table from the stored results
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import benchdoc

HERE = Path(__file__).resolve().parent
GB = 1e9
# name: (the demo as the README / docs give it, the shortening appended to it)
DEMOS = {
    "ppo": ("ppo", "iterations=1"),
    "trpo": ("trpo", "iterations=1"),
    # the GRPO family whole: the rows an update runs grow as fewer groups have all-equal rewards
    "grpo": ("grpo", ""),
    "grpo multi-turn": ("grpo env=arithmetic-tool max_turns=3 max_total_tokens=128 iterations=10 "
                        "rollout_batch_size=32 num_eval_prompts=50", "iterations=1"),
    "rloo": ("rloo", ""),
    "dapo": ("dapo", ""),
    "gspo": ("gspo", ""),
    "reinforce_pp": ("reinforce_pp", ""),
    "dpo": ("dpo", "max_steps=3"),
    "simpo": ("simpo", "max_steps=3"),
    "orpo": ("orpo", "max_steps=3"),
    "kto": ("kto", "max_steps=3"),
    "online-dpo": ("online-dpo", "iterations=2"),
    "sft": ("sft", "max_steps=3"),
    "rm": ("rm data=builtin:prefs_reviews lora_layers=4", "max_steps=3"),
    "pipeline": ("pipeline", "sft.max_steps=2 rm.max_steps=2 ppo.iterations=1"),
}
# name: estimate-memory arguments with the demo's shapes: the trainer's defaults and the widest
# prompt / response of its data (SmolLM2 tokenizer, chat template): reviews prompts 54 tokens,
# arithmetic 62, arithmetic-tool with its worked examples ~260 (responses up to max_total_tokens),
# prefs_reviews pairs 54 + at most 36 (+ stop), instructions at most 113 in all.
PPO = "method=ppo lora_layers=12 micro_batch_size=8 prompt_length=54 max_new_tokens=48 prompts_per_generate=48"
GRPO = "method=grpo micro_batch_size=16 group_size=8 prompt_length=62 max_new_tokens=16 prompts_per_generate=64 rollout_batch_size=64"
GRPO_MINI = GRPO + " mini_batch_size=32"
DPO = "method=dpo micro_batch_size=8 group_size=2 prompt_length=54 max_new_tokens=37"
ESTIMATES = {
    "ppo": PPO, "trpo": PPO.replace("method=ppo", "method=trpo"),  # rollout_batch_size 16, fvp_fraction 0.25
    # the pipeline's peak is its largest stage's (src/rlhfkit/configs/pipeline.yaml): SFT (8-example
    # micro-batches of instructions), the reward model (8 pairs, top 4 layers), PPO (40 new tokens)
    "pipeline": ["method=sft micro_batch_size=8 prompt_length=60 max_new_tokens=53 lora_dropout=0.05",
                 "method=rm lora_layers=4 micro_batch_size=8 prompt_length=54 max_new_tokens=37",
                 PPO.replace("max_new_tokens=48", "max_new_tokens=40")],
    # mini-batches of 32 of the 64 rows: a micro-batch holds rows of ~5 prompts (memory.py prompts_per_micro_batch)
    "grpo": GRPO_MINI, "dapo": GRPO_MINI, "gspo": GRPO_MINI,
    "rloo": GRPO + " mini_batch_size=64",  # RLOO updates the rollout whole (its mini_batch_size None)
    "reinforce_pp": GRPO.replace("group_size=8", "group_size=1"),  # a prompt per row
    "grpo multi-turn": "method=grpo micro_batch_size=16 group_size=8 prompt_length=260 max_new_tokens=128 "
                       "prompts_per_generate=64 rollout_batch_size=32 mini_batch_size=32",
    "dpo": DPO, "simpo": DPO, "orpo": DPO,
    "kto": "method=dpo micro_batch_size=8 group_size=1 prompt_length=54 max_new_tokens=37",  # 16 unpaired rows
    "online-dpo": "method=dpo micro_batch_size=8 group_size=2 prompt_length=54 max_new_tokens=64",
    "sft": "method=sft micro_batch_size=4 prompt_length=60 max_new_tokens=53 lora_dropout=0.05",  # SFT's default
    "rm": "method=rm lora_layers=4 micro_batch_size=8 prompt_length=54 max_new_tokens=37",
}
COMMON_ESTIMATE = "model=smollm2-135m device=cpu dtype=bf16"
# Demos whose code path the memory work of 2026-11-24 (row chunks, micro-batch columns, heap trims around
# the RL update) left as it was: their peak before is the peak after.
UNCHANGED = {"sft", "rm"}
MIDDLE = "after_v3_session11"  # the results label of the figures before 91d48a8 (the table's middle column)


def measure(name: str, out_dir: str, pythonpath: str | None) -> dict:
    """Run one demo under memory_phases.py; its whole-run peak RSS (bytes) and the phase that reached it."""
    demo, short = DEMOS[name]
    argv = [*demo.split(), *short.split(), f"output_dir={out_dir}", f"run_name=demo-{name.replace(' ', '-')}"]
    if demo.startswith("pipeline"):
        argv = [a for a in argv if not a.startswith("run_name=")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    log = Path(out_dir) / f"{name.replace(' ', '-')}.log"
    with open(log, "w") as err_file, subprocess.Popen([sys.executable, str(HERE / "memory_phases.py"), *argv], env=env,
                                                      stdout=subprocess.PIPE, stderr=err_file, text=True) as proc:
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak RSS (ru_maxrss, KiB)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return result(name, out, log.read_text(), proc.returncode, usage.ru_maxrss)


def result(name: str, out: str, err: str, rc: int, maxrss_kib: int) -> dict:
    """A demo's record from memory_phases.py's stdout (its phase table) and stderr (the phase lines)."""
    demo, short = DEMOS[name]
    peaks = dict(re.findall(r"^\| (\S[^|]*?) \| ([0-9.]+) \|$", out, flags=re.M))
    # memory_phases resets the kernel's peak mark at each phase, so ru_maxrss holds only the last
    # phase's peak: the whole run's is the highest phase peak (its summary's "whole run")
    whole = float(peaks.pop("whole run", maxrss_kib / 2**20))
    lines = re.findall(r"\] (\S+): entry ([0-9.]+) peak ([0-9.]+) exit", err)
    phase = peak_phase([(p, float(e), float(k)) for p, e, k in lines])
    return {"command": "rlhfkit " + demo, "shortened": short, "peak_gib": whole, "peak_gb": whole * 2**30 / GB,
            "phase": phase, "phases": [line for line in err.splitlines() if line.startswith("[memory")],
            "rc": rc, "error": (err.strip().splitlines() or [""])[-1] if rc else ""}


def peak_phase(phases: list[tuple[str, float, float]]) -> str:
    """The phase that first reached the run's highest phase peak and grew the memory to it: the
    earliest (innermost: nested phases finish first) of (path, entry GiB, peak GiB) whose peak is
    the highest and above its entry. glibc keeps freed memory, so later phases start at that level."""
    if not phases:
        return "?"
    top = max(p for _, _, p in phases)
    grew = [path for path, entry, p in phases if p >= top - 0.005 and p > entry + 0.005]
    return grew[0] if grew else next(path for path, _, p in phases if p >= top - 0.005)


def estimate_gb(name: str) -> float:
    from rlhfkit.commands.estimate_memory import PROG, for_method
    from rlhfkit.core.command_line import parse_values
    from rlhfkit.estimate.memory import MemoryArgs, estimate

    shapes = ESTIMATES[name] if isinstance(ESTIMATES[name], list) else [ESTIMATES[name]]
    return max(estimate(for_method(parse_values(MemoryArgs, f"{COMMON_ESTIMATE} {one}".split(), PROG)[0]))["peak"]
               for one in shapes) / GB  # as the command line computes it


FINDINGS = """
Where the peaks go (bench/memory_phases.py): the policy update's forward or a DPO-family step, the fused head's
CPU workspace, and glibc's heap: with the trainers' malloc tuning (runtime/allocator.py) freed blocks stay in the
heap, and a phase of other shapes does not reuse them. What keeps the peaks down: micro-batches run in row chunks
of at most `cpu_chunk_positions` positions (640; a shared prompt counted once), the same results up to float
rounding (tests/trainers/test_chunked_passes.py); the heap is trimmed around each RL update, after each online-DPO
and KTO step and between pipeline stages (DPO, SFT and the reward model have no trim: it gave no measured gain
and cost up to 1 s a step); oneDNN's kernel caches are capped at 64 entries (`cap_kernel_caches`). The multi-turn
demo's update runs its 260-token shared prompt once per 2-row chunk; `cpu_chunk_positions=800` gives it 4-row
chunks where memory allows (docs/scale.md). The estimate's 0.5 heap share stands for the heap's free space
between micro-batches of different widths.
"""


def cell(r: dict | None) -> str:
    """A result's peak in GB, "failed", or "-" when not measured."""
    return f"{r['peak_gb']:.2f}" if r and r["rc"] == 0 else ("failed" if r else "-")


def table(results: dict) -> str:
    before, after = results.get("before", {}), results.get("after", {})
    middle = results.get(MIDDLE, {})
    rows = ["| trainer | demo command (shortened to) | peak before, GB | before 91d48a8, GB | peak after, GB | "
            "phase of the peak | estimate, GB | estimate / measured |",
            "| --- | --- | ---: | ---: | ---: | --- | ---: | ---: |"]
    for name in DEMOS:
        b, a = before.get(name), after.get(name)
        if not (a or b):
            continue
        last = a or b
        est = estimate_gb(name)
        ratio = f"{est / last['peak_gb']:.2f}" if last["rc"] == 0 else "-"
        before_cell = cell(b) if b or name not in UNCHANGED else "= after"
        rows.append(f"| {name} | `{last['command']}` ({last['shortened'] or 'whole'}) | {before_cell} | "
                    f"{cell(middle.get(name))} | {cell(a)} | {last['phase']} | {est:.2f} | {ratio} |")
    note = (f"\nPeak resident set size of the whole process (kernel's figure, decimal GB; 2.5 GB = 2.33 GiB), "
            f"one torch thread, {platform.processor() or platform.machine()}, {os.cpu_count()} cores shared with "
            "other jobs (memory figures do not depend on load). Phase: the wrapped phase of "
            "bench/memory_phases.py whose exact peak was highest (eval = held-out sampling, update/backward = "
            "the policy update, step = a DPO-family optimiser step). Estimate: `rlhfkit estimate-memory "
            f"{COMMON_ESTIMATE} ...` with the demo's shapes (bench/demo_memory.py ESTIMATES). Before = the code "
            "before the row chunks and heap trims reached the demo's path (pipeline: before its stage trims); \"= after\": a demo whose code path they do not change (`UNCHANGED`); "
            "\"-\": not measured before. Before 91d48a8: the figures of 2026-11-24 before the chunk budget counted "
            "prompt positions (sft and rm were not measured again: their demos' micro-batches run whole under "
            "both budgets). \"whole\": the demo unshortened (the GRPO family since 6a058ae; its earlier "
            "columns are of the first iteration).")
    return "\n".join(rows) + "\n" + note + "\n" + FINDINGS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="after", help="results label: before (old code) or after")
    ap.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(DEMOS)}")
    ap.add_argument("--results", default=str(HERE.parent / "runs" / "demo_memory.json"))
    ap.add_argument("--pythonpath", default=None, help="run the demos on another source tree (PYTHONPATH)")
    ap.add_argument("--redo", action="store_true", help="measure again what the results already hold")
    ap.add_argument("--write", action="store_true", help="write the table to docs/benchmarks.md and stop")
    args = ap.parse_args()
    path = Path(args.results)
    results = json.loads(path.read_text()) if path.exists() else {}
    if args.write:
        benchdoc.write_block("demo_memory", "Peak memory of the default demos (bench/demo_memory.py)", table(results))
        print(table(results))
        return
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(DEMOS)
    out_dir = benchdoc.scratch_dir()
    for name in names:
        if name in results.get(args.label, {}) and not args.redo:
            continue
        r = measure(name, out_dir, args.pythonpath)
        results.setdefault(args.label, {})[name] = r
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=1))
        print(f"{name}: {r['peak_gb']:.2f} GB ({r['phase']}) rc={r['rc']} {r['error']}", flush=True)


if __name__ == "__main__":
    main()
