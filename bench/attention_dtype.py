"""One layer's attention on the CPU: bf16 flash attention against q, k, v cast to float32.

torch.nn.functional.scaled_dot_product_attention forward + backward at SmolLM2's head shape (9 heads of
64) with a float additive mask (causal, as transformers builds it), for the row x length shapes of the
demos' micro-batches and longer ones. "fp32" includes the three casts in and the one out, which is what
rlhfkit's CPU attention does for bf16 models (rlhfkit/models/attention.py). Median of 7 repeats after 2
warm-up calls, one process, the two variants alternating.

    python bench/attention_dtype.py [--threads 1] [--no-write]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import benchdoc
import torch
import torch.nn.functional as F

SHAPES = [(4, 98), (8, 98), (16, 78), (4, 260), (16, 144), (4, 512), (2, 1024)]  # (rows, tokens)
HEADS, HEAD_DIM = 9, 64


def one_call(q, k, v, mask, fp32: bool) -> tuple[float, float]:
    """(forward s, backward s) of one attention call."""
    t0 = time.perf_counter()
    if fp32:
        out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float()).bfloat16()
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    t1 = time.perf_counter()
    out.float().sum().backward()
    return t1 - t0, time.perf_counter() - t1


def measure(rows: int, tokens: int, repeats: int = 7) -> dict[str, tuple[float, float]]:
    g = torch.Generator().manual_seed(rows * tokens)
    q, k, v = (torch.randn(rows, HEADS, tokens, HEAD_DIM, generator=g).bfloat16().requires_grad_() for _ in range(3))
    mask = torch.full((tokens, tokens), float("-inf")).triu(1).bfloat16().expand(rows, 1, tokens, tokens)
    times: dict[str, list] = {"bf16": [], "fp32": []}
    for i in range(repeats + 2):
        for name in times:
            t = one_call(q, k, v, mask, name == "fp32")
            if i >= 2:
                times[name].append(t)
    return {name: (statistics.median(f for f, _ in ts), statistics.median(b for _, b in ts)) for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    lines = ["| rows x tokens | bf16 forward + backward, ms | fp32 (with casts), ms | bf16 / fp32 |",
             "| --- | ---: | ---: | ---: |"]
    for rows, tokens in SHAPES:
        m = measure(rows, tokens)
        (bf, bb), (ff, fb) = m["bf16"], m["fp32"]
        lines.append(f"| {rows} x {tokens} | {1e3 * bf:.2f} + {1e3 * bb:.2f} | {1e3 * ff:.2f} + {1e3 * fb:.2f} | "
                     f"{(bf + bb) / (ff + fb):.2f} |")
        print(lines[-1], flush=True)
    head = (f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__} ({a.threads} thread"
            f"{'s' if a.threads > 1 else ''}), Python {platform.python_version()}, {time.strftime('%Y-%m-%d')}. "
            f"`python bench/attention_dtype.py --threads {a.threads}`; {HEADS} heads of {HEAD_DIM}, causal float "
            "mask, median of 7.")
    if not a.no_write:
        benchdoc.write_block("attention_dtype", "Attention dtype on the CPU (bench/attention_dtype.py)",
                             head + "\n\n" + "\n".join(lines))


if __name__ == "__main__":
    main()
