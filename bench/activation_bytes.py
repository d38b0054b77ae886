"""What one training position costs in memory on the CPU, for `rlhfkit estimate-memory`.

1. Activation bytes: the default model's decoder runs a forward with gradients on B rows x L random tokens
   (train mode, the trainers' autocast) and the bytes glibc holds afterwards (mallinfo2: in use plus mmapped)
   are what autograd keeps for the backward. Divided by positions x layers x hidden size they give the
   factor `rlhfkit.estimate.memory.cpu_activation_bytes` uses: per dtype, with and without LoRA dropout (a
   dropout layer keeps its own copy of every adapted projection's input), and for full fine-tuning (there
   the bf16 figure includes autocast's bf16 copies of the float32 weights, held while the forward runs).
   The second of two repeats is reported (the first warms oneDNN's kernels and the allocator).
2. The process baseline: in a fresh process, the resident memory after `import rlhfkit`, loading the
   default model in bf16 and its tokenizer, less the weights' own bytes: Python, torch, transformers, the
   tokenizer and what loading leaves in the heap (`PROCESS_BASELINE`).

    python bench/activation_bytes.py [--rows 8 --tokens 100] [--no-write]
"""

from __future__ import annotations

import argparse
import ctypes
import platform
import subprocess
import sys

import benchdoc
import torch

CONFIGS = [  # (label, dtype, LoRA dropout or None for full fine-tuning)
    ("LoRA, bf16, no dropout (RL and preference trainers)", "bf16", 0.0),
    ("LoRA, bf16, dropout 0.05 (SFT)", "bf16", 0.05),
    ("LoRA, fp32, no dropout", "fp32", 0.0),
    ("LoRA, fp32, dropout 0.05", "fp32", 0.05),
    ("full fine-tuning, bf16 (float32 weights, autocast)", "bf16", None),
    ("full fine-tuning, fp32", "fp32", None),
]
BASELINE = """
import resource, torch
from rlhfkit.models.loading import DEFAULT_MODEL, load_causal_lm, load_tokenizer
model = load_causal_lm(DEFAULT_MODEL, dtype="bf16", trainable=False)
tok = load_tokenizer(DEFAULT_MODEL)
weights = sum(p.numel() * p.element_size() for p in model.parameters())
rss = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmRSS"))
print(rss, weights)
"""


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]


def held_bytes() -> int:
    """Bytes glibc has handed out: in use in the heap plus mmapped blocks."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


def activation_bytes(dtype: str, dropout: float | None, rows: int, tokens: int) -> float:
    """Bytes autograd keeps per position, layer and hidden unit after one forward."""
    from rlhfkit.models.loading import DEFAULT_MODEL, load_causal_lm
    from rlhfkit.models.lora import add_lora

    full = dropout is None
    model = load_causal_lm(DEFAULT_MODEL, dtype="fp32" if full else dtype)  # full: trainable weights stay fp32
    if not full:
        model = add_lora(model, 16, 32, dropout, None, None).get_base_model()
    model.train()
    decoder, cfg = model.model, model.config
    ids = torch.randint(100, cfg.vocab_size - 100, (rows, tokens), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    per = 0.0
    for _ in range(2):
        before = held_bytes()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        per = (held_bytes() - before) / (rows * tokens * cfg.num_hidden_layers * cfg.hidden_size)
        hidden.float().sum().backward()
        del hidden
        model.zero_grad(set_to_none=True)
    return per


def baseline() -> tuple[int, int]:
    """(RSS, weight bytes) of a fresh process with the default model and tokenizer loaded."""
    out = subprocess.run([sys.executable, "-c", BASELINE], capture_output=True, text=True, check=True)
    rss, weights = out.stdout.split()[-2:]
    return int(rss), int(weights)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    a = ap.parse_args()
    torch.set_num_threads(1)
    lines = [f"Machine: {platform.machine()}, torch {torch.__version__} (1 thread), Python {platform.python_version()}. "
             f"`python bench/activation_bytes.py --rows {a.rows} --tokens {a.tokens}`: SmolLM2-135M's decoder, "
             f"{a.rows} rows x {a.tokens} tokens, LoRA r=16 on every layer.", "",
             "| configuration | bytes per position, layer and hidden unit |", "| --- | ---: |"]
    for label, dtype, dropout in CONFIGS:
        per = activation_bytes(dtype, dropout, a.rows, a.tokens)
        lines.append(f"| {label} | {per:.1f} |")
        print(lines[-1], flush=True)
    rss, weights = baseline()
    lines += ["", f"Process baseline: a fresh process with the default model (bf16) and its tokenizer loaded holds "
              f"{rss / 1e9:.3f} GB resident, of which the weights are {weights / 1e9:.3f} GB: "
              f"{(rss - weights) / 1e9:.3f} GB besides them."]
    text = "\n".join(lines)
    print(text)
    if not a.no_write:
        benchdoc.write_block("activation_bytes", "Activation bytes per position on the CPU (bench/activation_bytes.py)",
                             text)


if __name__ == "__main__":
    main()
