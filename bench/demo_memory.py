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
PPO = "method=ppo lora_layers=12 micro_batch_size=8 prompt_length=54 max_new_tokens=48 generation_batch_size=48"
GRPO = "method=grpo micro_batch_size=16 group_size=8 prompt_length=62 max_new_tokens=16 generation_batch_size=64 rollout_batch_size=64"
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
                       "generation_batch_size=64 rollout_batch_size=32 mini_batch_size=32",
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
    from rlhfkit.core.config import parse_values
    from rlhfkit.estimate.memory import MemoryArgs, estimate

    shapes = ESTIMATES[name] if isinstance(ESTIMATES[name], list) else [ESTIMATES[name]]
    return max(estimate(for_method(parse_values(MemoryArgs, f"{COMMON_ESTIMATE} {one}".split(), PROG)[0]))["peak"]
               for one in shapes) / GB  # as the command line computes it


FINDINGS = """
Where the peaks went (bench/memory_phases.py per phase, with glibc's view): in the multi-turn demo the
policy update's forward (16 rows of up to 128 response tokens and two ~260-token prompts per micro-batch:
about 1.4 MB of activations per position through 30 layers, fp32 norm
inputs); in DPO the training step (+1.1 GiB over its entry) and the fused head's CPU workspace
(0.55 GiB, sized by the held-out pass over every pair at once). And in both, glibc's heap: with the
trainers' malloc tuning (core/allocator.py) freed blocks stay in the heap, but a phase of other
shapes (sampling after the update, an evaluation after training, a micro-batch of another width) does
not reuse them and grows the heap anew, so RSS summed the phases' peaks.

Cuts (the same results up to float rounding, tests/trainers/test_chunked_passes.py): on the CPU a
micro-batch of more than 512 response positions ran (since 91d48a8: more than 640 positions run,
below) in near-equal row chunks with the micro-batch's
columns (rollout/logprobs.py `row_chunks`, `rows_of`: the scoring pass, the update, DPO's reference
table, steps and held-out pass cut alike, so the first update chunk still repeats the scoring pass
bit for bit); DPO's held-out passes run in micro-batches; the heap's free pages go back to the kernel
before and after each RL update (core/allocator.py `trim_heap`; in DPO a trim before the steps
left the peak where it was, 2.44 against 2.32 GiB, so DPO has none). The multi-turn demo's per-step peak grows with the response width, which
grows as the model learns to call the tool: measured here at iteration 1. Cost of the chunks: a DPO
micro-batch of the demo (8 pairs, 2 chunks) took 18.6 CPU-s whole and 18.6 CPU-s chunked over 3
alternating repeats in one process (ratio 1.00).

Added 2026-11-24: online DPO's step and KTO's reference table, z_0 pass, steps and held-out pass run in
the same row chunks (tests/trainers/test_chunked_passes.py: equal to whole micro-batches), KTO trims the
heap after each step, and the pipeline after each stage. Online DPO 3.49 -> 2.17 GB (its 8-pair
micro-batches of 64-token samples had run whole); KTO 4.06 -> 3.41 GB (the trims; its held-out pass,
which had run every row at once, fell from 3.78 to 1.45 GiB); the pipeline 3.11 -> 2.60 GB (its later
stages now start at 0.6-1.0 GiB; the peak moved to the SFT stage's steps). The same per-step trim in DPO
left its peak where it was (2.67 against 2.66 GB, max RSS of `rlhfkit dpo max_steps=5`) and cost up to
1 s a step, so DPO, SFT and the reward model have none.

Added 2026-11-24 (91d48a8): the chunk budget counts the positions a forward runs, prompt and
response (R per row, P per distinct prompt, since a shared prompt runs once), at most 640
(`cpu_chunk_positions`), where it had counted response positions only (512), and SFT's steps cut
their micro-batches the same way. Before, KTO (3.41 GB), REINFORCE++ (3.07) and the pipeline (2.60)
were over 2.5 GB: REINFORCE++ ran 16 rows of 62 + 16 tokens whole (256 response positions), KTO 8 rows
of ~91 tokens per chunk, the pipeline's SFT stage 8 examples at once; with glibc keeping the freed
blocks of every width, RSS reached 1.6-1.8x the bytes in use. Now: REINFORCE++ 2.01 GB (chunks of 8
rows), KTO 1.92 (3 chunks of 5-6 rows), the pipeline 2.34 (its SFT stage's first step; two chunks of 4
examples), PPO 1.52 -> 1.20 (chunks of 4 rows of 102 tokens), DPO 2.49 -> 1.88 (micro-batches whose
responses were at most 32 tokens wide had run 8 pairs whole; now every one runs as 2 chunks of 4
pairs), multi-turn GRPO 2.31 -> 1.92. Every demo is under 2.5 GB. Cost, measured before/after in one
run each (two processes at once, one torch thread each, docs/benchmarks.md "Row chunks by positions
run"): REINFORCE++ and PPO updates unchanged (ratios 0.98-1.01), KTO steps 0.96x the time, and the
multi-turn GRPO update 1.28x at its second iteration (chunks of 2 rows instead of 4, so the 260-token
shared prompt runs 8 times per micro-batch instead of 4): there `cpu_chunk_positions=800` gives the
old cut back (4 x 128 + 260 = 772 positions).
Estimate: `rlhfkit estimate-memory` now counts at most max(cpu_chunk_positions, one row) positions
per chunk whatever the widths (an upper bound for the chunk); the pipeline's estimate is the largest
of its stages'. TRPO's policy step was not modelled then (its estimate was the PPO one, 0.58 of the
measured peak); since a44bde6 it is (below).
The table's demos are shortened (first iteration or first steps). The whole `rlhfkit grpo` demo (30
iterations, one thread) peaked at 2.44 GB (max RSS; 5% -> 36% held-out accuracy), against 1.43 for its
first iteration: in bf16 glibc's bytes in use grow by about 30 MiB per iteration (0.64 GiB after the first
update, 0.96 after the twelfth) while Python objects and live tensors stay constant, and not in fp32 (flat
at 0.29 GiB over the same run, `grpo iterations=8 rollout_batch_size=32 num_eval_prompts=0`);
ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 halves the growth, so part of it is oneDNN's cache of bf16 kernels for
each new shape. Neither the merged LoRA copy used for sampling nor autocast's weight-cast cache is the
cause (each turned off in `grpo iterations=8 rollout_batch_size=32`: the same +30 MiB per iteration).
The mechanism, isolated by bench/shape_cache.py (two bf16 linears of the MLP's shape, forward and
backward): with the row count M drawn from 300-1199 each step, bytes in use rise ~2 MiB per new M and
level off near 690 MiB after ~300 steps; with M fixed they stay at 97 MiB, and fp32 stays flat. So
bf16 kernels are kept per matmul shape (oneDNN's primitive cache and a second cache it does not
control: with ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 or 64 the level is ~370-390 MiB), and every
micro-batch width is a new shape. Bounded, but the whole grpo demo reached 2.44 GB, next to the 2.5 GB
target, where its first iteration peaked at 1.43.

Fixed 2026-11-24 (356666b): the trainers cap both caches at 64 entries (core/allocator.py `cap_kernel_caches`:
ONEDNN_PRIMITIVE_CACHE_CAPACITY and ideep's LRU_CACHE_CAPACITY, unless the user set them; both are read at
the first oneDNN matmul, so `Run` sets them first). bench/shape_cache.py over 300 steps of new row counts:
685 MiB in use uncapped, 418 with LRU_CACHE_CAPACITY=16 alone, 105 with both (flat; fixed M: 97). A whole
PPO iteration creates 53 distinct oneDNN primitives (`ONEDNN_VERBOSE=profile_create rlhfkit ppo
iterations=1 num_eval_prompts=0`: 53 cache misses and 59,054 hits with a capacity of 64 and the same with
1024), so 64 keeps every kernel an iteration reuses. `python bench/ab_demo.py --before 6e57ecd -- grpo`
(the whole 30-iteration demo, both at once, one thread each): peak 2.44 -> **1.92 GB**, generate 155.4 ->
149.7 s, log-prob pass 51.7 -> 49.4 s, update 271.8 -> 260.6 s (0.96), CPU 514 -> 494 s, 5% -> 36%
held-out accuracy on both sides. The same with `iterations=8 rollout_batch_size=32 num_eval_prompts=0`:
1.67 -> 1.57 GB, update 1.00, generate 1.00. With the caps glibc's bytes in use stay at 0.57-0.60 GiB
through the 30 iterations (bench/memory_phases.py grpo); what still moves the peak is free space in the
heap (0.77 -> 0.94 GiB) after a micro-batch of a new, longer width. The whole multi-turn demo (10
iterations) peaked at 2.27 GB.

On the code of 29b7522 (the kernel caps, and bf16 attention in float32 up to 256 keys: rlhfkit/models/attention.py),
against that of 91d48a8: DPO, SimPO, ORPO and KTO 0.07-0.12 GB lower, DAPO, REINFORCE++ and online DPO 0.03-0.07
higher, TRPO 2.30 -> 2.25, the pipeline 2.34 -> 2.38; all under 2.5 GB.

The "peak after" column is the code of e9cde13 (TRPO's step in row chunks, grouped
key/value heads in the CPU attention kernel), every demo measured again. Against 29b7522's: TRPO 2.25 ->
1.95, DAPO 2.00 -> 1.81, REINFORCE++ 2.04 -> 1.94, DPO / SimPO / ORPO 1.79-1.80 -> 1.68-1.71, KTO 1.85 -> 1.78,
online DPO 2.00 -> 1.92, the pipeline 2.38 -> 2.31; PPO, GRPO, multi-turn GRPO, GSPO, SFT and the reward model
within 0.03; RLOO 1.37 -> 1.48 (its second held-out evaluation, after one update: bytes in use 0.53 GiB in
both runs, free heap 0.53 -> 0.63 GiB; the update differs by float rounding, so the evaluation samples
other responses). The
estimate column is `estimate-memory` with the activation bytes of bench/activation_bytes.py (section above)
and the process baseline measured with the model loaded: 15 of the 16 demos within 20% of the measured peak,
9 of them within 5%; DAPO was under by 21% (1d0aa27 found why: below).

Since 6a058ae the GRPO family (grpo, rloo, dapo, gspo, reinforce_pp) is measured whole, 30 iterations.
Shortened to its first iteration, `rlhfkit grpo`, `rloo` and `gspo` had updated 8 rows (the one group
whose rewards differed: the model solves ~5% of the arithmetic at first), so their peak was the held-out
sampling; later updates run up to all 64 rows. And the estimate counted 2 prompts per 16-row micro-batch
(ceil(16 / 8)), where an update's mini-batches of 32 of the 64 rows, shuffled and then ordered by prompt,
hold rows of ~5 (DAPO's update instrumented: micro-batches of 16 rows and 73-77 tokens, 0.41-0.52 GiB of
bytes in use added by each forward). `estimate-memory` now counts them (estimate/memory.py
`prompts_per_micro_batch`, option `mini_batch_size`): grpo, dapo and gspo 1.44 -> 1.70 GB; rloo, whose
update takes the rollout whole, 2 prompts as before (1.44). The table's whole runs against it: grpo 1.91 GB
(0.89), rloo 1.63 (0.88), dapo 1.83 (0.93), gspo 1.92 (0.88), reinforce_pp 2.07 (0.84, its peak in sampling after an update): all 16
demos within 20% of their measured peak, all under 2.5 GB. What the estimate's 0.5 heap share stands for,
seen in DAPO's update: bytes in use peak at 1.0-1.1 GiB after each forward while RSS climbs from 1.41 to
1.70 GiB over the 8 micro-batches, the heap's free space growing 0.2 -> 0.4 GiB. Tried, each in the same
instrumented run, none lowered it: every micro-batch at the rollout's full width (so every shape is the
same: 1.76 GiB), the gradients allocated once in one flat buffer and zeroed in place instead of freed
(1.72), glibc's own settings instead of the trainers' malloc tuning (`RLHFKIT_TUNE_MALLOC=0`: 1.71).

TRPO (a44bde6). Its policy step was the one pass that ran 8-row micro-batches whole on the CPU, and its
gradient terms computed the token KL too (whose gradient is 0 at theta_old): bench/memory_phases.py with the
step's parts wrapped (`trpo iterations=1 num_eval_prompts=0 --wrap rlhfkit.trainers.trpo:summed_flat_grad:grad
--wrap rlhfkit.trainers.trpo:gauss_newton_fvp:fisher_build --wrap rlhfkit.trainers.trpo:trpo_step:cg_and_search`)
put the gradient pass at 1.95 GiB and the conjugate gradients at 2.04. Now the gradient, Fisher and
line-search terms and the critic's passes run in the row chunks every trainer cuts (equal steps:
tests/trainers/test_trpo.py), the gradient terms leave the KL out, and the float32 logits skip the division at
T = 1: gradient pass 1.29 GiB; the peak is now the conjugate gradients (1.83 GiB), which hold the rollout's
float32 logits (16 x 48 x V x 4 = 0.15 GB) and the Fisher graphs of its 4 drawn rows (0.51 GiB of bytes in use).
The demo: 2.25 -> 2.00 GB. `estimate-memory method=trpo` now models the step (the rollout's logits, the Fisher
graphs and one product's transient, docs/scale.md): 1.87 GB, 0.94 of the measured peak (was 0.58).
`python bench/ab_demo.py --before 2a0973f -- trpo iterations=3 num_eval_prompts=0` (both at once, one thread
each, the machine shared with two benchmarks): peak 2.51 -> 1.99 GB (0.79), update 135.3 -> 129.1 s (0.95),
CPU 105.7 -> 101.4 s (0.96), generate and log-prob pass 0.97-0.99.
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
