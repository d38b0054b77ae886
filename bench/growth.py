"""How the cost of a PPO iteration grows: seconds per iteration and peak RSS against the
rollout batch, the response length and the model size, with fitted growth laws.

Each point runs bench/bench_ppo.py's standard work (LoRA on the top 12 layers, dtype=auto) with one
setting changed, in its own subprocess (peak RSS per point; the first iteration is a warm-up):
  --axis batch    rollout_batch_size in --points (default 8,16,32,64,128); fit t = a + b x
  --axis length   max_new_tokens in --points (default 48,128,256,512,1024); fit t = a + b x + c x^2
                  (attention and the KV cache grow with the square of the length). Responses run to the
                  limit: the stop token is one a reply never holds (NEVER_STOP), so the cost is the length's
                  and not where the model happens to stop; the table shows the mean response length
  --axis size     smollm2-135m (the default weights) and randomly initialised 360m and 1.7b models of
                  the same family built from their configurations (no download); --points picks names
Peak memory is fitted the same way. The full sweep takes hours on a CPU: run it axis by axis.
Each iteration's CPU time (user + system of the process, all threads) is recorded next to its wall time:
with --threads 1 it equals the wall time on an idle core and is not inflated when the machine is shared,
so the CPU column is the one to fit on a busy machine (both are fitted).

    python bench/growth.py --axis batch --points 8,16 --iterations 2 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import benchdoc

# config.json sizes of the family (SmolLM2-360M and -1.7B), applied over the default model's config.
SIZES = {
    "135m": None,
    "360m": {"hidden_size": 960, "intermediate_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 15,
             "num_key_value_heads": 5},
    "1.7b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24, "num_attention_heads": 32,
             "num_key_value_heads": 32},
}
NEVER_STOP = 16  # `<empty_output>` in the SmolLM2 vocabulary: a special token a chat reply never holds
AXES = {"batch": ("rollout_batch_size", [8, 16, 32, 64, 128], 1),
        "length": ("max_new_tokens", [48, 128, 256, 512, 1024], 2),
        "size": ("model", list(SIZES), 0)}


def fit_polynomial(xs: list[float], ys: list[float], degree: int) -> list[float]:
    """Least-squares coefficients [c0, c1, ..., c_degree] of y = sum_k c_k x^k.

    xs, ys: equal lengths with more distinct x than `degree`. Solved in float64 with x scaled to
    [0, 1]-ish (by max |x|) so that x^2 at x ~ 1000 does not swamp the normal equations."""
    import numpy as np

    x, y = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if x.shape != y.shape or len(set(x.tolist())) <= degree:
        raise ValueError(f"fit of degree {degree} needs more than {degree} distinct x values, got {xs}")
    scale = float(np.abs(x).max()) or 1.0
    A = np.vander(x / scale, degree + 1, increasing=True)  # (n, degree + 1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    return [float(c) / scale**k for k, c in enumerate(coef)]


def model_folder(size: str) -> str:
    """The model spec for a size: the default, or a folder with a randomly initialised model of the
    family built once from the default's config with SIZES' dimensions (bf16 weights on disk)."""
    if SIZES[size] is None:
        return "smollm2-135m-instruct"
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlhfkit.models.loading import cache_dir, resolve_model_path

    base = resolve_model_path("smollm2-135m-instruct")
    target = cache_dir() / "bench-models" / f"random-{size}"
    if not (target / "model.safetensors").is_file() and not (target / "model.safetensors.index.json").is_file():
        target.mkdir(parents=True, exist_ok=True)
        cfg = AutoConfig.from_pretrained(base)
        for k, v in SIZES[size].items():
            setattr(cfg, k, v)
        cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(target)
        for f in base.iterdir():  # tokenizer and chat template
            if f.name.startswith(("tokenizer", "chat_template", "special_tokens", "generation_config")):
                shutil.copy(f, target / f.name)
    return str(target)


def run_point(axis: str, value: str, iterations: int) -> None:
    """One point in this process; prints a RESULT line."""
    import resource

    from bench_ppo import CONFIGS, STANDARD

    from rlhfkit.core.config import build_config
    from rlhfkit.trainers import rl
    from rlhfkit.trainers.ppo import train
    from rlhfkit.trainers.ppo_config import PPOConfig

    key = AXES[axis][0]
    setting = model_folder(value) if axis == "size" else int(value)
    over = {key: setting}
    if axis == "length":
        over["stop_ids"] = [NEVER_STOP]
    if axis == "batch":  # mini-batches of 8 need a multiple of 8
        over["mini_batch_size"] = min(STANDARD["mini_batch_size"], int(value))
        over["micro_batch_size"] = min(STANDARD["micro_batch_size"], int(value))
    stamps = cpu_stamps(rl.RLRun)
    out = benchdoc.scratch_dir()
    cfg = build_config(PPOConfig, {**STANDARD, **CONFIGS["lora-top12-fp32"], "dtype": "auto", **over,
                                   "iterations": iterations, "output_dir": out, "run_name": "p"})
    train(cfg)
    rows = [json.loads(line) for line in open(Path(out) / "p" / "metrics.jsonl")]
    rows = rows[1:] or rows
    keys = ("generate_s", "reward_s", "logprobs_s", "update_s")
    s = sum(sum(r[f"timing/{k}"] for k in keys) for r in rows) / len(rows)
    cpu = [b - a for a, b in zip(stamps, stamps[1:])]  # per iteration: sampling entry to the next (or to finish)
    cpu = cpu[1:] or cpu
    length = sum(r["rollout/response_length"] for r in rows) / len(rows)
    print("RESULT " + json.dumps({"iteration_s": s, "iteration_cpu_s": sum(cpu) / len(cpu), "response_length": length,
                                  "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}), flush=True)


def cpu_stamps(run_cls) -> list[float]:
    """Wrap run_cls.sample (first draw of an iteration) and run_cls.finish to record the process's CPU time
    at each iteration's start and at the end of the last one; returns the list they fill."""
    stamps: list[float] = []
    sample, finish = run_cls.sample, run_cls.finish

    def stamped_sample(self, records, iteration, *args, **kwargs):
        if not (args[0] if args else kwargs.get("draw", 0)):
            stamps.append(time.process_time())
        return sample(self, records, iteration, *args, **kwargs)

    def stamped_finish(self, *args, **kwargs):
        stamps.append(time.process_time())
        return finish(self, *args, **kwargs)

    run_cls.sample, run_cls.finish = stamped_sample, stamped_finish
    return stamps


def render(axis: str, results: dict, header: str) -> str:
    key, _, degree = AXES[axis]
    lines = [f"Machine: {header}.", "", f"PPO standard work (bench/bench_ppo.py, LoRA top 12, dtype=auto), {key} varied:",
             "", f"| {key} | s / iteration (wall) | CPU s / iteration | peak RSS GB | mean response tokens |",
             "| --- | ---: | ---: | ---: | ---: |"]
    ok = {k: v for k, v in results.items() if isinstance(v, dict)}
    lines += [f"| {k} | {v['iteration_s']:.2f} | {v.get('iteration_cpu_s', float('nan')):.2f} | {v['peak_rss_gb']:.2f} | "
              f"{v.get('response_length', float('nan')):.1f} |" if isinstance(v, dict) else f"| {k} | {v} | | | |"
              for k, v in results.items()]
    if degree and len(ok) > degree:
        xs = [float(k) for k in ok]
        names = ["a", "b", "c"][: degree + 1]
        for what, unit in (("iteration_s", "s"), ("iteration_cpu_s", "CPU s"), ("peak_rss_gb", "GB")):
            if any(what not in v for v in ok.values()):
                continue
            c = fit_polynomial(xs, [v[what] for v in ok.values()], degree)
            law = " + ".join(f"{n} x^{k}" if k > 1 else (f"{n} x" if k else n) for k, n in enumerate(names))
            lines += ["", f"{what} = {law}: " + ", ".join(f"{n} = {v:.4g} {unit}" for n, v in zip(names, c))]
    elif degree:
        lines += ["", f"(a fit of degree {degree} needs more than {degree} points)"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--axis", choices=list(AXES), required=True)
    ap.add_argument("--points", default=None, help="comma-separated values (size: 135m,360m,1.7b)")
    ap.add_argument("--iterations", type=int, default=3, help="iterations per point (first is warm-up)")
    ap.add_argument("--threads", type=int, default=None, help="torch threads per point (OMP_NUM_THREADS; default torch's)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        run_point(a.axis, a.one, a.iterations)
        return
    env = dict(os.environ)
    if a.threads:
        env.update(OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    from bench_ppo import machine

    points = a.points.split(",") if a.points else [str(p) for p in AXES[a.axis][1]]
    if a.axis == "size" and (bad := [p for p in points if p not in SIZES]):
        raise SystemExit(f"--points {','.join(bad)}: expected sizes among {','.join(SIZES)}")
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)  # so that machine() reports the points' thread count
    header = machine()
    print(header, flush=True)
    results: dict = {}
    for p in points:
        proc = subprocess.run([sys.executable, __file__, "--axis", a.axis, "--one", p, "--iterations", str(a.iterations)],
                              capture_output=True, text=True, env=env)
        m = re.search(r"^RESULT (.*)$", proc.stdout, re.M)
        results[p] = json.loads(m.group(1)) if m else f"failed: {proc.stderr.strip().splitlines()[-1:]}"
        print(p, results[p], flush=True)
    table = render(a.axis, results, header)
    print(table)
    if not a.no_write:
        benchdoc.write_block(f"growth_{a.axis}", f"Growth with {AXES[a.axis][0]} (bench/growth.py)", table)


if __name__ == "__main__":
    main()
