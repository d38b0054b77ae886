"""Attention of bf16 models on the CPU, computed in float32.

torch's CPU flash-attention kernel is slow to differentiate in bf16 at the sequence lengths of
RLHF on a CPU. Forward + backward of one layer's attention, one thread, 9 heads of 64 (SmolLM2),
bf16 against q, k, v cast to float32 first (casts included; bench/attention_dtype.py, medians):
4 rows x 98 tokens 13.9 -> 9.1 ms, 16 x 78 41.4 -> 21.6 ms, 16 x 144 82.5 -> 58.0 ms,
4 x 260 39.3 -> 37.0 ms, 4 x 512 113 -> 119 ms, 2 x 1024 195 -> 236 ms. The forward alone costs
about the same (the casts add a quarter at 4 x 98), and float32 computes softmax(q k^T) more exactly.

So `cpu_fp32_sdpa` runs transformers' own sdpa attention on float32 q, k, v (autocast off, which
would cast them back) and returns the output in the input's dtype, wherever the queries are
bf16/fp16 on the CPU, more than one, and attend to at most MAX_FP32_KEYS keys. Sampling
(`native_attention()`, around rlhfkit's generate loops) and any decoding step (one query against
the whole KV cache) stay in the model's dtype: nothing is differentiated there, and casting the
cache or a long prompt costs more than it saves. Otherwise the choice depends on shapes and dtypes
only, so the scoring pass and the update's first micro-batch, which run the same shapes, take the
same path (PPO's ratio check). CUDA and float32 models go to transformers' sdpa unchanged, but for
the kernel's grouped heads below.

A decoding step (one query per row) in bf16 on the CPU runs the grouped query heads as the queries of
their key/value head (transformers' `pack_gqa`: (B, 9, 1, 64) -> (B, 3, 3, 64)) whether or not the batch has
a padding mask: without one transformers would pass `enable_gqa` instead, and torch's bf16 CPU kernel takes
~1.05 ms per call there against ~0.3 ms packed (16 rows x 70 keys, one thread), so an unpadded batch (one
prompt's samples in `rlhfkit generate`) decoded slower than a padded one.

Grouped-query attention (SmolLM2: 3 key/value heads for 9 query heads): transformers hands masked
attention the key/value heads copied to every query head (`repeat_kv`), since the efficient CUDA
kernels take no mask with grouped heads. torch's CPU flash kernel does (`enable_gqa`), with the same
output bit for bit and none of the copies, nor the sums of their gradients in the backward: forward +
backward of 16 rows x 16 queries over 79 keys (GRPO's shared prompts, float32) 6.7 -> 3.5 ms, 8 x 35
over 82 (a DPO pair) 5.2 -> 3.6, 4 x 98 (PPO) 5.9 -> 5.7. So wherever several queries run on the CPU
outside sampling, `cpu_fp32_sdpa` has transformers pass the grouped heads to the kernel (`_grouped_heads`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import torch

from rlhfkit.models.hf_compat import register_sdpa, transformers_sdpa, use_attention

# Longer sequences stay in bf16: the gain shrinks with length (1.06x at 260 tokens, 0.83x at 1024) while
# the float32 copies autograd keeps grow with it (the multi-turn demo, ~260 + 128 tokens, peaked at
# 2.50 GB against 2.27 with every length in float32).
MAX_FP32_KEYS = 256
CPU_FP32_SDPA = "rlhfkit_cpu_fp32_sdpa"  # the attention implementation a loaded model is switched to
_state = threading.local()  # per thread: one_step_off_policy samples in a thread beside the update


@contextlib.contextmanager
def _set(flag: str):
    """`_state.<flag>` is True inside, in this thread, and as before afterwards."""
    before = getattr(_state, flag, False)
    setattr(_state, flag, True)
    try:
        yield
    finally:
        setattr(_state, flag, before)


def native_attention():
    """Attention in the model's own dtype inside, in this thread (sampling)."""
    return _set("native")


def cpu_fp32_sdpa(module, query, key, value, attention_mask, **kwargs):
    """transformers' sdpa attention (its signature: query (B, heads, q, d), key/value (B, kv heads,
    k, d)) on float32 q, k, v and with grouped heads in the kernel where the module docstring says,
    else unchanged."""
    cpu, decoding = query.device.type == "cpu", query.shape[2] == 1
    if cpu and decoding and query.dtype in (torch.bfloat16, torch.float16):
        with _set("packed"):  # the grouped heads as queries of their key/value head
            return transformers_sdpa(module, query, key, value, attention_mask, **kwargs)
    if not cpu or decoding or getattr(_state, "native", False):
        return transformers_sdpa(module, query, key, value, attention_mask, **kwargs)
    with _grouped_heads():
        if query.dtype not in (torch.bfloat16, torch.float16) or key.shape[2] > MAX_FP32_KEYS:  # float64 stays
            return transformers_sdpa(module, query, key, value, attention_mask, **kwargs)
        dtype = query.dtype
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
        with torch.autocast("cpu", enabled=False):  # autocast would run the kernel in bf16 again
            out, weights = transformers_sdpa(module, query.float(), key.float(), value.float(), attention_mask,
                                                  **kwargs)
        return out.to(dtype), weights


def _grouped_heads():
    """Inside, in this thread, transformers' sdpa passes grouped key/value heads to the kernel
    (`enable_gqa`) instead of copying them per query head (`grouped_heads_decision`)."""
    return _set("grouped")


def grouped_heads_decision(decide: Callable[..., bool]) -> Callable[..., bool]:
    """transformers' per-call decision whether the kernel gets grouped heads (`decide`: on CUDA
    only without a mask), made to say yes inside `_grouped_heads` and no while packing one query."""

    def decision(*args, **kwargs) -> bool:
        if getattr(_state, "packed", False):
            return False  # transformers then packs a single query's grouped heads (`pack_gqa`)
        return getattr(_state, "grouped", False) or decide(*args, **kwargs)

    return decision


def use_cpu_fp32_attention(model) -> bool:
    """Route `model`'s `sdpa` attention through `cpu_fp32_sdpa` (registered as CPU_FP32_SDPA through
    models/hf_compat.py); only this model, and only the kernel's dtype and head layout on the CPU,
    change. True when switched (a model on eager or flash attention is left as it is). Idempotent."""
    register_sdpa(CPU_FP32_SDPA, cpu_fp32_sdpa, grouped_heads_decision)
    return use_attention(model, CPU_FP32_SDPA)
