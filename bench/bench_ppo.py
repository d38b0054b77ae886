"""PPO iteration speed on the standard work (issue 3), written to docs/benchmarks.md.

Standard work: SmolLM2-135M-Instruct, 16 prompts per iteration (builtin:reviews), 48 new tokens,
temperature 1, 2 PPO epochs, mini-batch 8, sentiment reward; LoRA and full fine-tuning, fp32 and
bf16 (bf16 only where it is fast: see rlhfkit.models.loading.fast_bf16_available, or --force-bf16).

Each configuration runs in its own subprocess so peak RSS is per configuration. The first
iteration is a warm-up and is excluded from the means.

    python bench/bench_ppo.py [--iterations 3] [--configs lora-fp32,full-fp32] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIGS = {
    "lora-fp32": {"lora": True, "dtype": "fp32", "lr": 1e-3, "lora_layers": None},
    "lora-top12-fp32": {"lora": True, "dtype": "fp32", "lr": 1e-3, "lora_layers": 12},  # the demo default
    "lora-bf16": {"lora": True, "dtype": "bf16", "lr": 1e-3, "lora_layers": None},
    "full-fp32": {"lora": False, "dtype": "fp32", "lr": 1e-5},
    "full-bf16": {"lora": False, "dtype": "bf16", "lr": 1e-5},
}
STANDARD = {"rollout_batch_size": 16, "max_new_tokens": 48, "temperature": 1.0, "ppo_epochs": 2,
            "mini_batch_size": 8, "micro_batch_size": 8, "num_eval_prompts": 0, "prompts": "builtin:reviews",
            "reward": "sentiment", "quiet": True, "tensorboard": False}
DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
START, END = "<!-- bench_ppo:start -->", "<!-- bench_ppo:end -->"


def run_one(name: str, iterations: int) -> dict:
    """Run one configuration in this process; print a JSON line with its figures."""
    import resource

    from rlhfkit.runtime.config import build_config
    from rlhfkit.trainers.ppo import train
    from rlhfkit.trainers.ppo_config import PPOConfig

    out = tempfile.mkdtemp()
    cfg = build_config(PPOConfig, {**STANDARD, **CONFIGS[name], "iterations": iterations,
                                   "output_dir": out, "run_name": name})
    train(cfg)
    rows = [json.loads(line) for line in open(Path(out) / name / "metrics.jsonl")]
    rows = rows[1:] or rows  # drop the warm-up iteration
    mean = lambda k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    res = {k: mean(f"timing/{k}") for k in ("generate_s", "reward_s", "logprobs_s", "update_s")}
    res["iteration_s"] = res["generate_s"] + res["reward_s"] + res["logprobs_s"] + res["update_s"]
    res["tokens_per_s"] = mean("throughput/tokens_per_s")
    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("RESULT " + json.dumps(res), flush=True)
    return res


def machine() -> str:
    import torch

    cpu = "unknown CPU"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from rlhfkit.models.loading import fast_bf16_available

    load = os.getloadavg()[0]
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"Python {platform.python_version()}, fast bf16: {fast_bf16_available()}, "
            f"{time.strftime('%Y-%m-%d')}, 1-min load average at start {load:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iterations", type=int, default=3, help="iterations per configuration (first is warm-up)")
    ap.add_argument("--configs", default=None, help=f"comma-separated subset of {','.join(CONFIGS)}")
    ap.add_argument("--force-bf16", action="store_true", help="run bf16 configurations even without fast bf16")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        run_one(a.one, a.iterations)
        return
    from rlhfkit.models.loading import fast_bf16_available

    names = a.configs.split(",") if a.configs else list(CONFIGS)
    header = machine()
    print(header)
    results: dict[str, dict | str] = {}
    for name in names:
        if CONFIGS[name]["dtype"] == "bf16" and not (fast_bf16_available() or a.force_bf16):
            results[name] = "skipped: no fast bf16 on this machine (bf16 matmuls are slower than fp32 here)"
            print(f"{name}: {results[name]}")
            continue
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--iterations", str(a.iterations)],
                              capture_output=True, text=True)
        m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
        results[name] = json.loads(m.group(1)) if m else f"failed: {proc.stderr.strip().splitlines()[-1:]}"
        print(name, results[name], flush=True)
    table = render(header, results, a.iterations)
    print(table)
    if not a.no_write:
        write_block(table)


def render(header: str, results: dict, iterations: int) -> str:
    base = results.get("lora-fp32")
    lines = [f"Machine: {header}.", "",
             f"Standard work: {json.dumps({k: v for k, v in STANDARD.items() if k not in ('quiet', 'tensorboard')})}; "
             f"{iterations} iterations per configuration, the first excluded as warm-up; seconds per iteration.", "",
             "| config | generate s | reward s | logprobs+ref s | update s | iteration s | vs lora-fp32 | tokens/s | peak RSS GB |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in results.items():
        if isinstance(r, str):
            lines.append(f"| {name} | {r} | | | | | | | |")
            continue
        ratio = f"{base['iteration_s'] / r['iteration_s']:.2f}x" if isinstance(base, dict) else "n/a"
        lines.append(f"| {name} | {r['generate_s']:.1f} | {r['reward_s']:.3f} | {r['logprobs_s']:.1f} | {r['update_s']:.1f} "
                     f"| {r['iteration_s']:.1f} | {ratio} | {r['tokens_per_s']:.1f} | {r['peak_rss_gb']:.2f} |")
    lines.append("")
    lines.append("TRL comparison: not run (the `bench` extra with trl==1.12.0 is not installed by the set-up).")
    return "\n".join(lines)


def write_block(table: str) -> None:
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n"
    block = f"{START}\n{table}\n{END}"
    if START in text:
        text = re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text += f"\n## PPO iteration (bench/bench_ppo.py)\n\n{block}\n"
    DOC.write_text(text)


if __name__ == "__main__":
    main()
