"""Memory and speed knobs: one PPO iteration of the real default model per configuration,
written to docs/benchmarks.md between the bench_knobs markers.

Knobs: gradient checkpointing, full fine-tuning with and without reference offload, the scoring /
update micro-batch (4 vs 16 sequences), bf16 (only where bf16 matmuls are fast, or --force-bf16).
Every configuration runs in a fresh subprocess, so its peak RSS is its own; a sampler thread also
records the highest RSS during the iteration above the RSS just before it (model loaded), which is
what the knobs act on. The work is small by default (16 prompts x 16 new tokens, 1 PPO epoch, one
measured iteration, 1 torch thread): the whole script took 8.5 minutes on a shared 2-core CPU
(load average ~4). bf16 runs only where bf16 matmuls are fast (or with --force-bf16).

    python bench/bench_knobs.py [--configs baseline,ckpt,full-ckpt] [--max-new-tokens 32] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import benchdoc

BASE = {"lora": True, "dtype": "fp32", "lr": 1e-3, "lora_layers": None, "micro_batch_size": 8}
CONFIGS = {
    "baseline": ("LoRA fp32, all layers, micro-batch 8", {}),
    "ckpt": ("+ gradient_checkpointing", {"gradient_checkpointing": True}),
    "micro-4": ("micro_batch_size=4 (scoring and update)", {"micro_batch_size": 4}),
    "micro-16": ("micro_batch_size=16 (scoring and update)", {"micro_batch_size": 16}),
    "full": ("full fine-tuning (frozen reference copy)", {"lora": False, "lr": 1e-5}),
    "full-offload": ("full fine-tuning + offload_reference", {"lora": False, "lr": 1e-5, "offload_reference": True}),
    "full-ckpt": ("full fine-tuning + gradient_checkpointing", {"lora": False, "lr": 1e-5,
                                                              "gradient_checkpointing": True}),
    "bf16": ("LoRA, dtype=bf16", {"dtype": "bf16"}),
}
# glibc keeps freed heap memory and raises its mmap threshold as large blocks are freed, so RSS would
# remember every phase's transient tensors. A fixed threshold returns large blocks at once: RSS then
# follows live tensor memory (at the price of more page faults).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
DEFAULT = ("baseline", "ckpt", "micro-4", "micro-16", "full", "full-offload", "bf16")


def work(max_new_tokens: int) -> dict:
    return {"rollout_batch_size": 16, "mini_batch_size": 16, "max_new_tokens": max_new_tokens, "ppo_epochs": 1,
            "temperature": 1.0, "num_eval_prompts": 0, "prompts": "builtin:reviews", "reward": "sentiment",
            "iterations": 1, "quiet": True, "tensorboard": False, "save_every": 0}


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakSampler(threading.Thread):
    """Highest RSS seen every 10 ms while running."""

    def __init__(self):
        super().__init__(daemon=True)
        self.before = self.peak = rss_bytes()
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(0.01)


def run_one(name: str, max_new_tokens: int) -> None:
    """One configuration in this process; prints a RESULT line."""
    import resource

    import torch

    import rlhfkit.trainers.ppo as ppo
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo_config import PPOConfig

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))  # 1: no OpenMP spinning on a shared box
    out = benchdoc.scratch_dir()
    cfg = build_config(PPOConfig, {**work(max_new_tokens), **BASE, **CONFIGS[name][1], "output_dir": out,
                                   "run_name": name})
    sampler = PeakSampler()
    real_run = ppo.RLRun

    def start_then_sample(*a, **k):  # sample from the end of set-up (model loaded) to the end
        rl = real_run(*a, **k)
        with torch.no_grad():  # fault in every weight (safetensors loads lazily) before the baseline RSS
            for module in (rl.core, getattr(rl.reference, "frozen", None)):
                for p in module.parameters() if module is not None else ():
                    p.sum()
        sampler.before = sampler.peak = rss_bytes()
        sampler.start()
        return rl

    ppo.RLRun = start_then_sample
    ppo.train(cfg)
    sampler.stop.set()
    sampler.join()
    row = json.loads((Path(out) / name / "metrics.jsonl").read_text().splitlines()[0])
    res = {k: row[f"timing/{k}"] for k in ("generate_s", "logprobs_s", "update_s")}
    res["iteration_s"] = sum(res.values()) + row["timing/reward_s"]
    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    res["before_gb"] = sampler.before / 2**30
    res["iteration_peak_gb"] = sampler.peak / 2**30
    res["increment_gb"] = (sampler.peak - sampler.before) / 2**30
    print("RESULT " + json.dumps(res), flush=True)


def machine() -> str:
    import torch

    from rlhfkit.models.loading import fast_bf16_available

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "CPU")
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, Python {platform.python_version()}, "
            f"fast bf16: {fast_bf16_available()}, {time.strftime('%Y-%m-%d')}, 1-min load average at start "
            f"{os.getloadavg()[0]:.1f}")


def render(header: str, results: dict, max_new_tokens: int) -> str:
    base = results.get("baseline")
    w = {k: v for k, v in work(max_new_tokens).items() if k not in ("quiet", "tensorboard", "save_every")}
    busy = os.getloadavg()[0] > 1.5  # other jobs on these cores: the times are not comparable
    lines = [f"Machine: {header}." + (" The machine was shared with other jobs while this ran: times are indicative, "
                                      "memory figures are not affected." if busy else ""), "",
             f"Work: SmolLM2-135M-Instruct, one PPO iteration per configuration, each in a fresh process: "
             f"{json.dumps(w)}; LoRA r=16 on every layer unless noted. `peak RSS` is the process's high-water mark "
             "(model loading included); `iteration peak` the highest RSS sampled during the iteration; `increment` "
             "that peak minus the RSS just before the iteration (what the knobs act on), with every weight paged "
             "in before it and `MALLOC_MMAP_THRESHOLD_=65536` so that freed tensors leave RSS. 1 torch thread. "
             "Ratios are against `baseline`.", "",
             "| config | what | iteration s | generate s | logprobs+ref s | update s | peak RSS GB | iteration peak GB "
             "| increment GB | increment vs baseline | time vs baseline |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        what = CONFIGS[name][0]
        if isinstance(r, str):
            lines.append(f"| {name} | {what} | {r} | | | | | | | | |")
            continue
        ratio_m = f"{r['increment_gb'] / base['increment_gb']:.2f}x" if isinstance(base, dict) else "n/a"
        ratio_t = f"{r['iteration_s'] / base['iteration_s']:.2f}x" if isinstance(base, dict) else "n/a"
        lines.append(f"| {name} | {what} | {r['iteration_s']:.1f} | {r['generate_s']:.1f} | {r['logprobs_s']:.1f} "
                     f"| {r['update_s']:.1f} | {r['peak_rss_gb']:.2f} | {r['iteration_peak_gb']:.2f} "
                     f"| {r['increment_gb']:.2f} | {ratio_m} | {ratio_t} |")
    lines += ["", "offload_reference moves the frozen copy between CPU memory and the accelerator; on a CPU-only "
              "machine both are the same memory, so `full-offload` can only show that it costs nothing here. Its "
              "GPU saving is the reference's size, P x 2 bytes in bf16 (`rlhfkit estimate-memory`, docs/scale.md)."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=",".join(DEFAULT), help=f"comma-separated subset of {','.join(CONFIGS)}")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="response length limit")
    ap.add_argument("--force-bf16", action="store_true", help="run bf16 even where bf16 matmuls are slow")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        run_one(a.one, a.max_new_tokens)
        return
    from rlhfkit.models.loading import fast_bf16_available

    header = machine()
    print(header, flush=True)
    results: dict[str, dict | str] = {}
    for name in a.configs.split(","):
        if CONFIGS[name][1].get("dtype") == "bf16" and not (fast_bf16_available() or a.force_bf16):
            results[name] = "skipped: no fast bf16 here (bf16 matmuls are slower than fp32 on this CPU; --force-bf16)"
        else:
            proc = subprocess.run([sys.executable, __file__, "--one", name, "--max-new-tokens", str(a.max_new_tokens)],
                                  capture_output=True, text=True, env={**os.environ, **MALLOC_ENV})
            m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
            results[name] = json.loads(m.group(1)) if m else f"failed: {proc.stderr.strip().splitlines()[-1:]}"
        print(name, results[name], flush=True)
    table = render(header, results, a.max_new_tokens)
    print(table)
    if not a.no_write:
        benchdoc.write_block("bench_knobs", "Memory and speed knobs (bench/bench_knobs.py)", table)


if __name__ == "__main__":
    main()
