"""The output head and the optimiser step in isolation, written to docs/benchmarks.md.

1. Output head, forward + backward, SmolLM2-135M shapes (H = 576, V = 49152): the plain path
   (`lm_head(hidden)` -> `logprobs_and_entropy`) against the fused `rlhfkit.algos.head_logprobs`,
   for a DPO micro-batch (272 response positions, log-probs only) and a PPO one (384 positions,
   log-probs and the entropy as a metric), with a frozen head (LoRA) and a trained one (full
   fine-tuning).
2. AdamW step over SmolLM2-135M's parameter shapes (134.5M parameters): torch's default
   multi-tensor AdamW against the fused one that single-process rlhfkit runs use.

Each runs twice, in fresh processes: with glibc malloc as it comes, and tuned as rlhfkit's trainers
tune it (rlhfkit.core.allocator). Median of 7 repeats after one warm-up; ratios from the same process.

    python bench/bench_head.py [--no-write]      # about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

import benchdoc

H, V, LAYERS, FFN, KV = 576, 49152, 30, 1536, 192  # SmolLM2-135M
CASES = {  # name: (rows, with_entropy, frozen head)
    "DPO micro-batch, LoRA (frozen head)": (272, False, True),
    "PPO micro-batch, LoRA (frozen head), entropy logged": (384, True, True),
    "PPO micro-batch, full fine-tuning (trained head), entropy logged": (384, True, False),
}


def median_ms(fn, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1e3 * statistics.median(times)


def head_case(rows: int, with_entropy: bool, frozen: bool) -> dict:
    import torch

    from rlhfkit.algos import logprobs_and_entropy
    from rlhfkit.algos.head import head_logprobs

    g = torch.Generator().manual_seed(rows)
    head = torch.nn.Linear(H, V, bias=False).requires_grad_(not frozen)
    torch.nn.init.normal_(head.weight, std=0.05, generator=g)
    hidden0 = torch.randn(1, rows, H, generator=g)
    tokens = torch.randint(0, V, (1, rows), generator=g)

    def run(fused: bool):
        def once():
            hidden = hidden0.clone().requires_grad_()
            head.zero_grad(set_to_none=True)
            if fused:
                lp, ent = head_logprobs(hidden, head, tokens, None, 1.0, with_entropy, entropy_grad=False)
            else:
                lp, ent = logprobs_and_entropy(head(hidden), tokens, 1.0, with_entropy)
                ent = ent.detach() if ent is not None else None
            lp.sum().backward()
        return once

    plain, fused = median_ms(run(False)), median_ms(run(True))
    return {"plain_ms": plain, "fused_ms": fused}


def adamw_case() -> dict:
    import torch

    shapes = [(V, H), (H,)] + [s for _ in range(LAYERS) for s in
                               [(H, H), (KV, H), (KV, H), (H, H), (FFN, H), (FFN, H), (H, FFN), (H,), (H,)]]
    params = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    out = {"params_m": sum(p.numel() for p in params) / 1e6}
    for name, fused in (("foreach_ms", None), ("fused_ms", True)):
        opt = torch.optim.AdamW(params, lr=1e-5, fused=fused)
        out[name] = median_ms(opt.step, repeats=5)
    return out


def run_one(tuned: bool) -> None:
    import torch

    from rlhfkit.core.allocator import tune_malloc

    torch.manual_seed(0)
    applied = tune_malloc() if tuned else None
    res = {"tuned": applied is not None, "cases": {k: head_case(*v) for k, v in CASES.items()}, "adamw": adamw_case()}
    print("RESULT " + json.dumps(res), flush=True)


def machine() -> str:
    import torch

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "CPU")
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"Python {platform.python_version()}, glibc {platform.libc_ver()[1]}, {time.strftime('%Y-%m-%d')}, "
            f"1-min load average at start {os.getloadavg()[0]:.1f}")


def render(header: str, results: dict) -> str:
    lines = [f"Machine: {header}.", "",
             "Output head, forward + backward (SmolLM2-135M: H = 576, V = 49152), median ms of 7 repeats; plain = "
             "`lm_head(hidden)` then `logprobs_and_entropy`, fused = `rlhfkit.algos.head_logprobs`:", "",
             "| case | malloc | plain ms | fused ms | speed-up |", "| --- | --- | ---: | ---: | ---: |"]
    for mode, r in results.items():
        for name, c in r["cases"].items():
            lines.append(f"| {name} | {mode} | {c['plain_ms']:.0f} | {c['fused_ms']:.0f} | "
                         f"{c['plain_ms'] / c['fused_ms']:.2f}x |")
    lines += ["", "AdamW step over SmolLM2-135M's parameter shapes, median ms of 5 steps:", "",
              "| malloc | parameters | multi-tensor (torch default) ms | fused ms | speed-up |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for mode, r in results.items():
        a = r["adamw"]
        lines.append(f"| {mode} | {a['params_m']:.1f}M | {a['foreach_ms']:.0f} | {a['fused_ms']:.0f} | "
                     f"{a['foreach_ms'] / a['fused_ms']:.2f}x |")
    lines += ["", "`as it comes` = glibc's defaults (RLHFKIT_TUNE_MALLOC=0); `tuned` = what rlhfkit's trainers set at "
              "start (mmap threshold 32 MiB, trim threshold 1 GiB: core/allocator.py). In a whole PPO iteration "
              "the tuning matters more than here, where one process repeats one shape: see the text above."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--one", choices=["tuned", "untuned"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        run_one(a.one == "tuned")
        return
    header = machine()
    print(header, flush=True)
    results = {}
    for mode, env in (("as it comes", {"RLHFKIT_TUNE_MALLOC": "0"}), ("tuned", {})):
        proc = subprocess.run([sys.executable, __file__, "--one", "untuned" if env else "tuned"],
                              capture_output=True, text=True, env={**os.environ, **env})
        m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
        if not m:
            sys.exit(f"bench_head: the {mode} run failed: {proc.stderr.strip().splitlines()[-1:]}")
        results[mode] = json.loads(m.group(1))
    table = render(header, results)
    print(table)
    if not a.no_write:
        benchdoc.write_block("bench_head", "Output head and optimiser step (bench/bench_head.py)", table)


if __name__ == "__main__":
    main()
