"""Sampling speed: HF generate (rollout/core.py, the reference path) against the lean decode
loop (rollout/decode.py) on the default model, back to back in one process, written to docs/benchmarks.md.

Model as the PPO demo builds it (`build_policy` with PPOConfig defaults: SmolLM2-135M-Instruct, dtype auto,
LoRA on the top 12 layers, merged while sampling), under the trainer's autocast. Workloads:
  ppo:  16 prompts of builtin:reviews, 48 new tokens, T = 1, shared prompt prefix (the PPO demo's rollout)
  grpo: 8 prompts of builtin:arithmetic x 8 samples = 64 rows, 128 new tokens, T = 1, shared prompts
The two samplers alternate (HF first, then lean, `--repeats` times) with the same seed per pair. Tokens/s
counts kept tokens (up to and including each row's stop token). The bound: per decoding step the larger
of (linear-layer weight bytes / memory bandwidth) and (2 x linear-layer parameters x rows still going /
matmul peak), both measured here at start, plus the prefill's FLOPs; "of bound" = bound time / measured time.

    python bench/bench_decode.py [--workloads ppo,grpo] [--repeats 3] [--no-write]
    python bench/bench_decode.py --profile          # torch.profiler breakdown of one ppo rollout, both samplers
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import benchdoc
import torch

WORKLOADS = {
    "ppo": {"prompts": "builtin:reviews", "n": 16, "copies": 1, "max_new_tokens": 48, "share_prompts": False,
            "share_prefix": True},
    "grpo": {"prompts": "builtin:arithmetic", "n": 8, "copies": 8, "max_new_tokens": 128, "share_prompts": True,
             "share_prefix": False},
}


def build():
    """(policy, tokenizer, cfg) exactly as the PPO trainer builds them with its defaults."""
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.build import build_policy
    from rlhfkit.trainers.ppo_config import PPOConfig

    cfg = build_config(PPOConfig, {"output_dir": benchdoc.scratch_dir(), "quiet": True, "num_eval_prompts": 0})
    policy, tok = build_policy(cfg)
    return policy.eval(), tok, cfg


def texts_for(tok, cfg, w: dict) -> list[str]:
    from rlhfkit.data.chat import format_prompts
    from rlhfkit.data.prompts import load_prompts

    records = load_prompts(w["prompts"], split="train", seed=0)[: w["n"]]
    return [t for t in format_prompts(tok, [r["prompt"] for r in records], cfg) for _ in range(w["copies"])]


def sample(which: str, policy, tok, cfg, texts, w: dict, seed: int):
    from rlhfkit.core.precision import autocast
    from rlhfkit.rollout.core import SamplingParams, generate
    from rlhfkit.rollout.decode import lean_generate

    params = SamplingParams(w["max_new_tokens"], 1.0, 0, 1.0, (tok.eos_token_id,))
    fn = generate if which == "hf" else lean_generate
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with autocast(cfg.dtype, torch.device("cpu")):
        r = fn(policy, tok, texts, params, batch_size=len(texts), share_prompts=w["share_prompts"],
               share_prefix=w["share_prefix"])
    return time.perf_counter() - t0, r


def machine_peaks() -> tuple[float, float]:
    """(memory bandwidth GB/s from a 256 MiB copy, bf16 matmul GFLOP/s at 16 x 576 x 1536 x ... large), best of 5."""
    src = torch.empty(64 * 2**20, dtype=torch.float32).uniform_()
    dst = torch.empty_like(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(5))
    bw = 2 * src.numel() * 4 / best / 1e9  # read + write
    a = torch.randn(1024, 1024, dtype=torch.bfloat16)
    b = torch.randn(1024, 4096, dtype=torch.bfloat16)
    best = min(_timed(lambda: a @ b) for _ in range(5))
    return bw, 2 * 1024 * 1024 * 4096 / best / 1e9


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def linear_params(policy) -> int:
    """Parameters the per-token matmuls read: every 2-D weight but the input embedding (the tied output
    head counts once, as the head)."""
    n = sum(p.numel() for name, p in policy.named_parameters() if p.dim() == 2 and "lora_" not in name)
    return n  # tied: embed_tokens is the head's weight, listed once by named_parameters


def bound_seconds(r, n_params: int, weight_bytes: int, bw: float, peak: float) -> float:
    """Lower bound on sampling `r`: prefill FLOPs plus, per step, max(weights / bandwidth, FLOPs / peak)
    with the rows still going at that step."""
    lengths = r.response_mask.sum(1).long()
    prefill = 2 * n_params * int(r.query_mask.sum()) / (peak * 1e9)
    steps = sum(max(weight_bytes / (bw * 1e9), 2 * n_params * int((lengths > t).sum()) / (peak * 1e9))
                for t in range(int(lengths.max())))
    return prefill + steps


def run(names: list[str], repeats: int) -> str:
    policy, tok, cfg = build()
    bw, peak = machine_peaks()
    n_params = linear_params(policy)
    weight_bytes = n_params * (2 if cfg.dtype == "bf16" else 4)
    header = (f"{machine()}; dtype {cfg.dtype}, LoRA on the top {cfg.lora_layers} layers (merged while sampling); "
              f"measured here: copy bandwidth {bw:.1f} GB/s, bf16 matmul {peak:.0f} GFLOP/s")
    print(header, flush=True)
    lines = [f"Machine: {header}. The machine was shared with other jobs while this ran (see the load "
             "average): compare the ratios, taken back to back in one process, not seconds across runs.", "",
             "| workload | rows x max new | sampler | seconds (median) | kept tokens | tokens/s | of bound "
             "| speed-up (HF s / lean s, per pair) |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for name in names:
        w = WORKLOADS[name]
        texts = texts_for(tok, cfg, w)
        sample("lean", policy, tok, cfg, texts[:2], {**w, "max_new_tokens": 2}, 0)  # warm-up
        times = {"hf": [], "lean": []}
        kept = {}
        for rep in range(repeats):
            for which in ("hf", "lean"):
                s, r = sample(which, policy, tok, cfg, texts, w, seed=1000 + rep)
                times[which].append(s)
                kept[which] = (int(r.response_mask.sum()), bound_seconds(r, n_params, weight_bytes, bw, peak))
                print(f"{name} {which} rep {rep}: {s:.2f} s, {kept[which][0]} tokens, load {os.getloadavg()[0]:.1f}",
                      flush=True)
        ratios = [h / lean for h, lean in zip(times["hf"], times["lean"])]
        for which in ("hf", "lean"):
            med = statistics.median(times[which])
            tokens, bound = kept[which]
            cell = " / ".join(f"{x:.2f}x" for x in ratios) + f" (median {statistics.median(ratios):.2f}x)"
            lines.append(f"| {name} | {len(texts)} x {w['max_new_tokens']} | {which} | {med:.2f} | {tokens} "
                         f"| {tokens / med:.1f} | {100 * bound / med:.0f}% | {cell if which == 'lean' else ''} |")
    lines += ["", "Workloads: " + "; ".join(f"{k}: {v}" for k, v in WORKLOADS.items() if k in names) + ". "
              "Both samplers draw with the exponential race at T = 1 over the full vocabulary; HF generate keeps "
              "computing rows that have stopped until the last row stops, the lean loop drops them. "
              "`of bound`: the lower bound described in bench/bench_decode.py over the measured time (its kept "
              "tokens, from the last repeat)."]
    return "\n".join(lines)


def profile() -> None:
    """Where one ppo rollout's time goes, per sampler (torch.profiler, self CPU time by category)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    policy, tok, cfg = build()
    w = WORKLOADS["ppo"]
    texts = texts_for(tok, cfg, w)
    sample("lean", policy, tok, cfg, texts[:2], {**w, "max_new_tokens": 2}, 0)
    for which in ("hf", "lean"):
        with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            seconds, r = sample(which, policy, tok, cfg, texts, w, seed=7)
        cats: dict[str, float] = {}
        for e in prof.key_averages(group_by_input_shape=True):
            cat = category(e.key, str(e.input_shapes))
            cats[cat] = cats.get(cat, 0.0) + e.self_cpu_time_total / 1e6
        total = sum(cats.values())
        steps = int(r.response_mask.sum(1).max())
        print(f"\n{which}: {seconds:.2f} s wall, {steps} steps, profiled self CPU {total:.2f} s")
        for cat, s in sorted(cats.items(), key=lambda kv: -kv[1]):
            print(f"  {cat:34s} {s:7.2f} s  {100 * s / total:5.1f}%  {1e3 * s / steps:7.1f} ms/step")


SAMPLING_OPS = ("aten::uniform_", "aten::log_", "aten::neg_", "aten::argmax", "aten::_softmax", "aten::div",
                "aten::scatter_", "aten::isin")


def category(op: str, shapes: str) -> str:
    vocab = "49152"
    if op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"):
        return "lm_head matmul" if vocab in shapes else "body matmuls"
    if "attention" in op:
        return "attention (sdpa)"
    if op == "aten::cat":
        return "KV cache cat + other cat"
    if op in SAMPLING_OPS and vocab in shapes:
        return "sampling ((B, V) softmax/race/argmax)"
    if op in ("aten::copy_", "aten::_to_copy", "aten::to"):
        return "dtype casts / copies"
    if op in ("aten::mul", "aten::add", "aten::pow", "aten::mean", "aten::rsqrt", "aten::silu", "aten::neg",
              "aten::sin", "aten::cos", "aten::sum", "aten::div", "aten::div_", "aten::where", "aten::fill_"):
        return "elementwise (norms, rotary, SiLU, masks)"
    return "other ops (views, indexing, allocation)"


def machine() -> str:
    cpu = "unknown CPU"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} ({torch.get_num_threads()} threads), "
            f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}, "
            f"1-min load average at start {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="ppo,grpo", help=f"comma-separated subset of {','.join(WORKLOADS)}")
    ap.add_argument("--repeats", type=int, default=3, help="HF / lean pairs per workload")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    ap.add_argument("--profile", action="store_true", help="print a profiler breakdown of one ppo rollout per sampler")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.profile:
        profile()
        return
    table = run(a.workloads.split(","), a.repeats)
    print(table)
    if not a.no_write:
        benchdoc.write_block("bench_decode", "Sampling: HF generate against the lean decode loop (bench/bench_decode.py)",
                             table)


if __name__ == "__main__":
    main()
