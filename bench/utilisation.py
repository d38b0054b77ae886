"""Utilisation of the standard PPO work: model FLOPs per second per phase against this
machine's measured matmul peak, written to docs/benchmarks.md.

1. Peak: torch.mm GFLOP/s in fp32 and bf16 at the default model's shapes (hidden 576, intermediate
   1536, vocabulary 49152) with the token counts the phases use (decode: the generation batch's
   rows; prefill and the teacher-forced passes: micro-batch x tokens). The peak of a dtype is the
   best of its shapes. Memory bandwidth: a large tensor copy (bytes read + written / time).
2. The standard work of bench/bench_ppo.py (its STANDARD settings, dtype=auto or --dtype), run in this process
   with timers around sampling, the log-prob pass and the update; the rollout's shapes give the model
   FLOPs of each phase by rlhfkit.estimate.flops (the counting rules are in its docstring; padded
   widths as computed, attention causal, LoRA base weights 1x in the backward, the frozen trunk none).
3. Sampling's memory-bandwidth bound: per decode step every weight and the KV cache are read once
   (rlhfkit.estimate.flops.decode_step_bytes), over the measured bandwidth; the larger of that and
   the compute bound (FLOPs / peak) is the bound that binds.

    python bench/utilisation.py [--configs lora-top12,full] [--iterations 3] [--no-write]

Per machine kind: the block is keyed by the instruction set torch and oneDNN use. To see an AVX2-only CPU's
figures on an AVX-512 one, cap both (the same cores and caches, only the vector instructions change; not a
substitute for a real AVX2 machine):

    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python bench/utilisation.py
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import time

import benchdoc
import torch
from bench_ppo import CONFIGS, STANDARD, machine

HIDDEN, INTER, VOCAB = 576, 1536, 49152
RUNS = {"lora-top12": "lora-top12-fp32", "lora-all": "lora-fp32", "full": "full-fp32"}  # bench_ppo configurations, dtype set by --dtype
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def mm_gflops(n: int, k: int, m: int, dtype: torch.dtype, seconds: float = 0.3) -> float:
    """Best-of-repeats GFLOP/s of an (n, k) @ (k, m) matmul in `dtype`."""
    a, b = torch.randn(n, k).to(dtype), torch.randn(k, m).to(dtype)
    out = torch.empty(n, m, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up
    best, spent = float("inf"), 0.0
    while spent < seconds:
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
    return 2 * n * k * m / best / 1e9


def measure_peak(token_counts: dict[str, int]) -> dict:
    """{'shapes': [(phase, n, k, m, {dtype: GFLOP/s})], 'peak': {dtype: GFLOP/s}}."""
    shapes = []
    for phase, n in token_counts.items():
        for k, m in ((HIDDEN, INTER), (INTER, HIDDEN), (HIDDEN, VOCAB)):
            shapes.append((phase, n, k, m, {name: mm_gflops(n, k, m, dt) for name, dt in DTYPES.items()}))
    peak = {name: max(s[4][name] for s in shapes) for name in DTYPES}
    return {"shapes": shapes, "peak": peak}


def bandwidth_gbs(mb: int = 512, repeats: int = 5) -> float:
    """GB/s of a large copy, counting the bytes read and the bytes written."""
    src = torch.ones(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src)) for _ in range(repeats))
    return 2 * src.numel() * 4 / best / 1e9


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_standard(name: str, iterations: int, dtype: str = "auto") -> list[dict]:
    """Run the standard PPO work for `name` in `dtype`; per iteration: phase seconds and the rollout's shapes."""
    import rlhfkit.trainers.rl as rl
    from rlhfkit.core.config import build_config
    from rlhfkit.trainers.ppo import train
    from rlhfkit.trainers.ppo_config import PPOConfig

    records: list[dict] = []
    orig = {k: getattr(rl.RLRun, k) for k in ("sample", "logprob_pass", "update")}

    def timed(key):
        @functools.wraps(orig[key])
        def inner(self, *a, **k):
            t0 = time.perf_counter()
            out = orig[key](self, *a, **k)
            dt = time.perf_counter() - t0
            if key == "sample":
                records.append({"sample_s": out.timings["timing/generate_s"]})
            elif key == "logprob_pass":
                records[-1].update(logprobs_s=dt, **rollout_shape(self, out))
            else:
                records[-1]["update_s"] = dt
            return out
        return inner

    for key in orig:
        setattr(rl.RLRun, key, timed(key))
    try:
        cfg = build_config(PPOConfig, {**STANDARD, **CONFIGS[RUNS[name]], "dtype": dtype, "iterations": iterations,
                                       "output_dir": benchdoc.scratch_dir(), "run_name": name})
        train(cfg)
    finally:
        for key, fn in orig.items():
            setattr(rl.RLRun, key, fn)
    return [{**r, "lora": cfg.lora, "lora_r": cfg.lora_r, "lora_layers": cfg.lora_layers, "epochs": cfg.ppo_epochs,
             "prompts_per_generate": cfg.prompts_per_generate} for r in records]


def rollout_shape(rl_run, rollout) -> dict:
    """What the FLOP count needs from a scored rollout."""
    (B, P), R = rollout.query_ids.shape, rollout.response_ids.shape[1]
    return {"rows": B, "prompt": P, "response": R, "response_tokens": int(rollout.response_mask.sum()),
            "trunk_depth": int(getattr(rl_run.core, "trunk_depth", 0) or 0), "trunk_kept": rollout.trunk is not None,
            "reference": rollout.ref_logprobs is not None}


def phase_flops(shape, r: dict) -> dict[str, float]:
    """Model FLOPs of one iteration's phases (rlhfkit.estimate.flops); `r` from run_standard."""
    from rlhfkit.estimate.flops import forward_flops, sampling_flops, train_flops

    B, P, R, n_head = r["rows"], r["prompt"], r["response"], r["response_tokens"]
    seqs, L, D = [P + R] * B, shape.layers, r["trunk_depth"]
    lora_r = r["lora_r"] if r["lora"] else 0
    top = L - D  # layers above the frozen trunk
    # Sampling on the CPU runs a merged copy of the LoRA weights: no adapter FLOPs.
    sample = sampling_flops(shape, [P] * B, R)["total"]
    # Policy forward (trunk once, shared with the reference), then the reference above the trunk.
    policy = forward_flops(shape, seqs, n_head, lora_r=lora_r, lora_layers=r["lora_layers"])
    ref = forward_flops(shape, seqs, n_head, layers=top) if r["reference"] else 0
    logprobs = policy + ref
    upd = train_flops(shape, seqs, n_head, lora_r=lora_r if r["lora"] else None, lora_layers=r["lora_layers"],
                      forward_layers=top if r["trunk_kept"] else None)["total"] * r["epochs"]
    return {"sampling": sample, "log-prob pass": logprobs, "update": upd}


def render(header: str, peak: dict, bw: float, results: dict, dtype: str,
           chosen_by: str = "`dtype=auto` picks it here") -> str:
    from rlhfkit.estimate.flops import decode_step_bytes
    from rlhfkit.estimate.shape import PRESETS

    shape = PRESETS["smollm2-135m"]
    lines = [f"Machine: {header}.", "",
             f"Matmul peak (best torch.mm over the shapes below): fp32 {peak['peak']['fp32']:.1f} GFLOP/s, bf16 "
             f"{peak['peak']['bf16']:.1f} GFLOP/s; copy bandwidth {bw:.1f} GB/s. The runs' dtype is {dtype} ({chosen_by}), "
             f"so shares are of the {dtype} peak.", "",
             "| shape (phase, n x k x m) | fp32 GFLOP/s | bf16 GFLOP/s |", "| --- | ---: | ---: |"]
    lines += [f"| {ph}: {n} x {k} x {m} | {g['fp32']:.1f} | {g['bf16']:.1f} |" for ph, n, k, m, g in peak["shapes"]]
    top = peak["peak"][dtype]
    for name, iters in results.items():
        if isinstance(iters, str):
            lines += ["", f"{name}: {iters}"]
            continue
        timed = iters[1:] or iters  # the first iteration is a warm-up
        r0 = timed[0]
        lines += ["", f"**{name}** (PPO standard work, {len(timed)} timed iteration(s); rollout {r0['rows']} rows x "
                  f"({r0['prompt']} prompt + {r0['response']} response) tokens, {r0['response_tokens']} response "
                  f"tokens, trunk depth {r0['trunk_depth']}, reference {'yes' if r0['reference'] else 'no'}):", "",
                  "| phase | seconds | model GFLOP | GFLOP/s | share of peak |", "| --- | ---: | ---: | ---: | ---: |"]
        secs = {"sampling": "sample_s", "log-prob pass": "logprobs_s", "update": "update_s"}
        tot_s = tot_f = 0.0
        for phase, key in secs.items():
            s = sum(r[key] for r in timed) / len(timed)
            f = sum(phase_flops(shape, r)[phase] for r in timed) / len(timed)
            tot_s, tot_f = tot_s + s, tot_f + f
            lines.append(f"| {phase} | {s:.2f} | {f / 1e9:.1f} | {f / s / 1e9:.1f} | {f / s / 1e9 / top:.1%} |")
        lines.append(f"| all | {tot_s:.2f} | {tot_f / 1e9:.1f} | {tot_f / tot_s / 1e9:.1f} | "
                     f"{tot_f / tot_s / 1e9 / top:.1%} |")
        # Sampling's two lower bounds: compute (FLOPs / peak) and memory (bytes per decode step / bandwidth).
        wb = 2 if dtype == "bf16" else 4
        steps = r0["response"] - 1
        gen = r0["prompts_per_generate"]
        calls = -(-r0["rows"] // gen)
        rows = min(gen, r0["rows"])
        mem_s = calls * sum(decode_step_bytes(shape, rows, r0["prompt"] + t, wb, wb) for t in range(1, steps + 1)) / (bw * 1e9)
        comp_s = phase_flops(shape, r0)["sampling"] / (top * 1e9)
        s_meas = sum(r["sample_s"] for r in timed) / len(timed)
        binds = "memory bandwidth" if mem_s > comp_s else "compute"
        lines += ["", f"Sampling bounds: compute {comp_s:.2f} s (FLOPs / {dtype} peak), memory {mem_s:.2f} s "
                  f"({calls} generate call(s) x {steps} decode steps, each reading the weights at {wb} bytes and the "
                  f"KV cache of {rows} rows, at {bw:.1f} GB/s); the {binds} bound binds; measured {s_meas:.2f} s is "
                  f"{s_meas / max(mem_s, comp_s):.1f}x it."]
    lines += ["", "Model FLOPs by rlhfkit.estimate.flops: 2 x weights per token plus causal attention (4 x heads x "
              "head size per query-key pair), the output layer at response positions only; backward 2x forward for "
              "trained weights, 1x for frozen LoRA base weights, 0 below the lowest adapted layer; the update runs "
              "the layers above the frozen trunk only when the trunk's output is kept. Padded widths are counted "
              "(the computed work); sampling counts every row to the full response width."]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="lora-top12,full", help=f"comma-separated subset of {','.join(RUNS)}")
    ap.add_argument("--iterations", type=int, default=3, help="PPO iterations per configuration (first is warm-up)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a STANDARD setting (e.g. rollout_batch_size=4 for a quick check); use with --no-write")
    ap.add_argument("--dtype", default="auto", choices=("auto", "fp32", "bf16"),
                    help="the runs' dtype (auto: what rlhfkit picks here); shares are of this dtype's peak; a "
                         "dtype other than auto prints only")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    a = ap.parse_args()
    from bench_ppo import parse_override

    from rlhfkit.models.loading import resolve_dtype

    STANDARD.update(dict(parse_override(kv) for kv in a.set))
    header = machine() + f", torch CPU kernels {torch.backends.cpu.get_cpu_capability()}" + (
        f", ONEDNN_MAX_CPU_ISA={os.environ['ONEDNN_MAX_CPU_ISA']}" if os.environ.get("ONEDNN_MAX_CPU_ISA") else "") + (
        f"; overrides {a.set}" if a.set else "")
    print(header, flush=True)
    dtype = resolve_dtype(a.dtype)
    mb, gen = STANDARD["micro_batch_size"], STANDARD.get("prompts_per_generate", STANDARD["rollout_batch_size"])
    counts = {"decode": min(gen, STANDARD["rollout_batch_size"]), "teacher-forced": mb * 100,
              "head": mb * STANDARD["max_new_tokens"]}
    peak = measure_peak(counts)
    bw = bandwidth_gbs()
    print(json.dumps({"peak": peak["peak"], "bandwidth_gbs": bw}), flush=True)
    results: dict = {}
    for name in a.configs.split(","):
        try:
            results[name] = run_standard(name, a.iterations, a.dtype)
        except Exception as e:  # one failing configuration should not lose the others' figures
            results[name] = f"failed: {type(e).__name__}: {e}"
        print(name, results[name], flush=True)
    table = render(header, peak, bw, results, dtype,
                   "`dtype=auto` picks it here" if a.dtype == "auto" else f"--dtype {a.dtype}")
    print(table)
    if not a.no_write and a.dtype == "auto":
        name, title = machine_kind()
        benchdoc.write_block(name, title, table)


def machine_kind() -> tuple[str, str]:
    """(doc block name, section title) for the instruction set in use: native, or capped by
    ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA (an emulated narrower machine gets its own block)."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if not isa or isa == "ALL":
        return "utilisation", "Utilisation per phase (bench/utilisation.py)"
    aten = torch.backends.cpu.get_cpu_capability()
    return (f"utilisation-{isa.lower()}", f"Utilisation per phase with the instruction set capped at {isa} "
            f"(ONEDNN_MAX_CPU_ISA={isa}, torch kernels {aten}; bench/utilisation.py)")


if __name__ == "__main__":
    main()
