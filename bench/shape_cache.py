"""Does malloc's in-use memory grow with the number of distinct matmul shapes?

Two linear layers of SmolLM2-135M's MLP shape (576 -> 1536 -> 576, frozen weights in the given dtype)
run forward and backward under autocast, once per step, on an input of M rows: M fixed, or drawn
from 300-1199 each step (as micro-batch widths vary in training). Prints glibc's bytes in use
(mallinfo2: heap in use + mmapped) every 100 steps. Linux + glibc only; one torch thread.

    python bench/shape_cache.py --m vary --dtype bf16
    ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 python bench/shape_cache.py --m vary --dtype bf16
"""

from __future__ import annotations

import argparse
import ctypes
import random

import torch


class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def in_use_mib(libc) -> float:
    m = libc.mallinfo2()
    return (m.uordblks + m.hblkhd) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", choices=("fixed", "vary"), default="vary", help="rows per step: 700, or 300-1199 at random")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    ap.add_argument("--steps", type=int, default=400)
    a = ap.parse_args()
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    torch.set_num_threads(1)
    layers = [torch.nn.Linear(576, 1536, bias=False), torch.nn.Linear(1536, 576, bias=False)]
    for layer in layers:
        layer.requires_grad_(False)
        if a.dtype == "bf16":
            layer.weight.data = layer.weight.data.bfloat16()
    rng = random.Random(0)
    for step in range(a.steps + 1):
        x = torch.randn(700 if a.m == "fixed" else rng.randrange(300, 1200), 576, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            y = layers[1](torch.nn.functional.silu(layers[0](x)))
        y.float().sum().backward()
        if step % 100 == 0:
            print(f"M {a.m} {a.dtype} step {step}: {in_use_mib(libc):.1f} MiB in use", flush=True)


if __name__ == "__main__":
    main()
